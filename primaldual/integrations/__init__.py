"""Plug primaldual attentions into models built with other libraries.

* :mod:`primaldual.integrations.hf`: Hugging Face transformers (the ``hf`` extra): convert the self-attention of
  GPT-2 / BERT / RoBERTa / ViT / Decision Transformer layers (``convert``), generate, train with the ``Trainer``
  (``PrimalDualTrainer``), save and reload (``from_pretrained``); the parameter-free mechanisms as attention
  implementations (``register_hf_attentions``).
* :mod:`primaldual.integrations.torch_nn`: a stand-in for ``nn.MultiheadAttention`` inside
  ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` and ``convert_transformer_encoder``; the mask
  conversions every integration uses.
* :mod:`primaldual.integrations.timm`: a timm attention layer (``VisionTransformer(attn_layer=...)``).

``import primaldual`` imports none of them (this package never pulls in transformers or timm); import the submodule
you need. The one exception is :mod:`primaldual.integrations.auto_register`, which has no dependency: once
transformers is imported it imports :mod:`primaldual.integrations.hf`, so that ``primaldual export`` directories load
with ``AutoModelForCausalLM``. See ``docs/integrations.md``.
"""

__all__: list[str] = []
