"""The config keys that some tasks read, as the dataclasses a task lists in :attr:`~primaldual.tasks.Task.config`
(each field's default is the key's), and the checks of those several tasks read (each task checks the keys it
declares, in :meth:`Task.check`; the generic checks of :mod:`primaldual.train.validate` cover the common keys).

A key that a task does not declare is not in its configs: naming it is an error that says which tasks read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..models.init import INITS
from ..options import check_bool, check_choice, check_int, check_number

if TYPE_CHECKING:
    from ..train.schema import DataConfig, ModelConfig

__all__ = [
    "peer_attention",
    "DTBlockKeys",
    "FetchKey",
    "ImageKeys",
    "InitKey",
    "NumClassesKey",
    "PairsKeys",
    "PoolingKey",
    "StandInKey",
    "TiedEmbeddingsKey",
    "TokenModelKeys",
    "TokenisationKey",
    "ValFractionKey",
    "ValSizeKey",
    "ViTKeys",
    "check_fetch",
    "check_init",
    "check_num_classes",
    "check_token_model",
    "check_val_fraction",
    "check_val_size",
]


# --- data keys -------------------------------------------------------------------------------------------------
@dataclass
class FetchKey:
    """``fetch``: obtain the data automatically when it is missing (UEA's JapaneseVowels, the LRA stand-ins)."""

    fetch: bool = True


@dataclass
class ValFractionKey:
    """``val_fraction``: the stratified share of TRAIN held out for validation (data that ships without one)."""

    val_fraction: float = 0.2


@dataclass
class ValSizeKey:
    """``val_size``: evaluate a fixed random subset of the validation split of this size (cheaper periodic
    evaluation; the test split is always used whole); None: all of it."""

    val_size: int | None = None


@dataclass
class StandInKey:
    """``stand_in``: the obtainable real-data stand-in an error message suggests when the named data is missing
    (never substituted silently)."""

    stand_in: str | None = None


@dataclass
class TokenisationKey:
    """``tokenisation``: ListOps' ``brackets`` / ``no_brackets``."""

    tokenisation: str = "brackets"


@dataclass
class PairsKeys:
    """``train_pairs`` / ``eval_pairs``: pairs drawn per split by the retrieval stand-in."""

    train_pairs: int = 10000
    eval_pairs: int = 2000


@dataclass
class ImageKeys:
    """``image_size``: the side the model sees (None: the idx images' 28; required for folders); ``crop_pct``:
    folders are decoded at ``image_size / crop_pct`` and evaluated on the centre ``image_size`` crop (DeiT's 256 ->
    224)."""

    image_size: int | None = None
    crop_pct: float = 0.875


# --- model keys ------------------------------------------------------------------------------------------------
@dataclass
class TokenModelKeys:
    """A model over token ids: ``vocab_size`` (None: the data's; a smaller one is an error), ``norm_first`` (pre-LN),
    ``positions`` (``learned`` or ``sinusoidal``)."""

    vocab_size: int | None = None
    norm_first: bool = True
    positions: str = "learned"


@dataclass
class PoolingKey:
    """``pooling``: a classifier's ``mean`` over tokens or its ``cls`` token."""

    pooling: str = "mean"


@dataclass
class NumClassesKey:
    """``num_classes``: None takes it from the data (a value that disagrees with the data is an error)."""

    num_classes: int | None = None


@dataclass
class TiedEmbeddingsKey:
    """``tie_embeddings``: the language model's output layer shares the token embedding's weight."""

    tie_embeddings: bool = True


@dataclass
class InitKey:
    """``init``: ``pytorch`` (each layer's default) or ``gpt2`` (N(0, 0.02), GPT-2's scaled residual projections)."""

    init: str = "pytorch"


@dataclass
class ViTKeys:
    """The ViT: ``patch_size``; ``drop_path`` (stochastic depth rising linearly to it in the last block);
    ``patch_kernel`` (the patch projection's kernel, None: ``patch_size``, larger for overlapping patches);
    ``stem`` (``patch`` or ``conv``, a convolutional stem)."""

    patch_size: int = 16
    drop_path: float = 0.0
    patch_kernel: int | None = None
    stem: str = "patch"


@dataclass
class DTBlockKeys:
    """The Decision Transformer's block: ``activation`` (the FFN's, ``gelu`` or ``relu``), ``attn_drop`` (dropout on
    attention weights), ``ffn_drop`` (on the FFN's hidden units; None: ``dropout``); ``relu, 0.1, 0.0`` with
    ``init: gpt2`` is Hugging Face's block."""

    activation: str = "gelu"
    attn_drop: float = 0.0
    ffn_drop: float | None = None


def check_fetch(d: DataConfig) -> None:
    check_bool("data.fetch", d.fetch)


def check_val_fraction(d: DataConfig) -> None:
    check_number("data.val_fraction", d.val_fraction, low=0, high=1, low_open=True, high_open=True)


def check_val_size(d: DataConfig) -> None:
    check_int("data.val_size", d.val_size, low=1, allow_none=True)


def check_num_classes(m: ModelConfig) -> None:
    check_int("model.num_classes", m.num_classes, low=2, allow_none=True)


def check_token_model(m: ModelConfig) -> None:
    """The keys of a model over token ids (LRA's classifiers, the causal LM): positions, layer norm, vocabulary."""
    if m.positions not in ("learned", "sinusoidal"):
        raise ValueError(f"model.positions: expected 'learned' or 'sinusoidal', got {m.positions!r}")
    check_bool("model.norm_first", m.norm_first)
    check_int("model.vocab_size", m.vocab_size, low=1, allow_none=True)


def check_init(m: ModelConfig) -> None:
    check_choice("model.init", m.init, INITS)


def peer_attention(m: ModelConfig, what: str) -> None:
    """A model kind that is another library's model (``what``, e.g. ``"Hugging Face's GPT2LMHeadModel"``) has its
    own softmax attention: ``model.attention`` must be ``softmax`` (or ``softmax`` for every layer) and
    ``model.attention_options`` null; anything else is a :class:`ConfigError`, never ignored."""
    names = list(m.attention) if isinstance(m.attention, list | tuple) else [m.attention]
    options = list(m.attention_options) if isinstance(m.attention_options, list | tuple) else [m.attention_options]
    if any(n != "softmax" for n in names) or any(o is not None for o in options):
        raise ValueError(
            f"model.attention: model.kind {m.kind!r} is {what}, with its own softmax attention in every layer; "
            f"set model.attention 'softmax' and model.attention_options null (got {m.attention!r} with "
            f"options {m.attention_options!r})"
        )
