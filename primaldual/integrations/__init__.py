"""Plug primaldual attentions into models built with other libraries.

* :mod:`primaldual.integrations.hf`: Hugging Face transformers (the ``hf`` extra): convert the self-attention of
  GPT-2 / BERT / RoBERTa / ViT / Decision Transformer layers (``convert``), generate, train with the ``Trainer``
  (``PrimalDualTrainer``), save and reload (``from_pretrained``); the parameter-free mechanisms as attention
  implementations (``register_hf_attentions``).
* :mod:`primaldual.integrations.torch_nn`: a stand-in for ``nn.MultiheadAttention`` inside
  ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` and ``convert_transformer_encoder``; the mask
  conversions every integration uses.
* :mod:`primaldual.integrations.timm`: a timm attention layer (``VisionTransformer(attn_layer=...)``).

Nothing here is imported by ``import primaldual``; import the submodule you need (this package imports none of
them, so it never pulls in transformers or timm). See ``docs/integrations.md``.
"""

__all__: list[str] = []
