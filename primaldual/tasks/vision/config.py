"""The ``augment`` section of task ``vision`` (:attr:`primaldual.tasks.Task.config`): DeiT's training-time recipe."""

from __future__ import annotations

from dataclasses import field, fields, make_dataclass
from typing import Any

from ...data.augment import AugmentSettings

__all__ = ["AugmentConfig"]


def _augment_settings(section: Any) -> Any:
    """The validated :class:`~primaldual.data.augment.AugmentSettings` of an ``augment`` section."""
    return AugmentSettings(**{f.name: getattr(section, f.name) for f in fields(AugmentSettings)})


# The ``augment`` section: AugmentSettings' fields, defaults (pairs as YAML lists) and checks, but mutable like the
# other sections, so that overrides and the YAML round trip treat it as they treat them.
AugmentConfig = make_dataclass(
    "AugmentConfig",
    [
        (f.name, Any, field(default_factory=lambda v=f.default: list(v) if isinstance(v, tuple) else v))
        for f in fields(AugmentSettings)
    ],
    namespace={"settings": _augment_settings, "__module__": __name__},
)
AugmentConfig.__doc__ = """Training-time augmentation of task ``vision`` (DeiT's recipe, :mod:`primaldual.data.augment`), applied to each
    training batch; the defaults switch everything off. ``crop_scale``: random resized crop area range (null: no
    crop, the centre ``image_size`` square); ``crop_ratio``: its aspect range; ``hflip``: horizontal flip
    probability; ``randaugment_ops`` (0: off), ``randaugment_magnitude``, ``randaugment_magnitude_std``: timm's
    ``rand-m9-mstd0.5-inc1`` with the subset of operations the module lists; ``erasing``: random-erasing
    probability; ``mixup_alpha`` / ``cutmix_alpha`` (0: off), ``mix_prob``, ``mix_switch_prob``: timm's batch
    mixup / cutmix; ``label_smoothing``."""
