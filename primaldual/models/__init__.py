"""Task models on the shared :class:`~primaldual.Encoder`; each takes the attention per layer by registry name.

PrimalFormer (every layer ``"primal"``) and Primal.+X (last layer ``"primal"``) are configurations of these
models, not separate classes: :func:`primalformer` / :func:`primal_plus` (in :mod:`.plans`) build the per-layer
plans, and the training configs use them (``model.plan``). Auxiliary losses (KSVD) are stored by the layers during forward and added to the
task loss by the training module via :func:`primaldual.collect_aux_loss`.
"""

from .decision_transformer import DecisionTransformer
from .lm import CausalLM, LMState
from .plans import primal_plus, primalformer
from .pooling import masked_mean
from .retrieval import RetrievalClassifier
from .sequence import SequenceClassifier, SequenceEncoder
from .timeseries import TimeSeriesClassifier
from .vit import VIT_PRESETS, VisionClassifier, vit

__all__ = [
    "VIT_PRESETS",
    "CausalLM",
    "DecisionTransformer",
    "LMState",
    "RetrievalClassifier",
    "SequenceClassifier",
    "SequenceEncoder",
    "TimeSeriesClassifier",
    "VisionClassifier",
    "masked_mean",
    "primal_plus",
    "primalformer",
    "vit",
]
