"""DeiT's training-time augmentation as batch-level torch ops, deterministic given a ``torch.Generator``.

Hand-written because torchvision and timm cannot be imported beside the pinned CPU build of torch, and kornia is
not a dependency the core takes (torch and numpy only). Every op works on a whole batch ``(B, C, H, W)`` on any
device. Every random number is drawn on the CPU from the ``generator`` passed in and then moved to the images'
device, so a seed gives the same draws on CPU and GPU, and the global RNG is never touched.

DeiT's recipe (Touvron et al., 2021, as timm implements it), in :class:`BatchAugment`'s order:

* :func:`random_resized_crop`: area fraction in (0.08, 1), aspect ratio in (3/4, 4/3), 10 attempts then a
  central crop, and the horizontal flip (p = 0.5) folded into the same resample. :func:`center_crop` for the
  no-crop path.
* :func:`rand_augment`: timm's ``rand-m9-mstd0.5-inc1``: 2 op slots per sample, each op applied with probability
  0.5, magnitude ~ N(9, 0.5) clipped to [0, 10], the "increasing" variants, geometric ops filled with the mean.
* :func:`random_erasing`: probability 0.25, mode 'pixel', one box.
* :func:`mixup_cutmix`: mixup alpha 0.8, cutmix alpha 1.0, switch probability 0.5, 'batch' mode, label smoothing
  0.1 (:func:`mix_targets`), trained with :func:`soft_target_cross_entropy`.

Deviations from timm:

* RandAugment leaves out Equalize, Invert and SolarizeAdd: 12 of timm's 15 "increasing" ops
  (:data:`RAND_AUGMENT_OPS`), so each is drawn with probability 1/12 instead of 1/15. The ops work on float
  images, without PIL's rounding to 8 bits after each op (Posterize and Solarize use 8-bit levels).
* Resampling is bilinear through ``grid_sample``, without antialiasing (DeiT resizes with PIL bicubic, which
  antialiases when it shrinks a crop); the geometric ops blend the fill into the image over the last pixel at the
  border instead of PIL's hard edge. Shears act about the top-left corner, as in PIL.
* Random erasing runs in pixel space, before normalisation (exactly equivalent, see :func:`random_erasing`).
* Mixup draws its Beta sample with numpy, seeded from the generator (torch's Gamma sampler ignores generators).
* With image folders the random resized crop is drawn from the decoded centre square (``image_size / crop_pct``
  on a side, :class:`~primaldual.data.images.ImageFolderDataset`), not from the whole non-square image, so that a
  batch is one tensor.
* Not here: colour jitter (DeiT passes 0.4, but timm drops it when RandAugment is on), repeated augmentation (a
  sampler), and the evaluation resize of the shorter side.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..options import check_choice, check_int, check_number

__all__ = [
    "RAND_AUGMENT_OPS",
    "AugmentSettings",
    "BatchAugment",
    "center_crop",
    "mix_targets",
    "mixup_cutmix",
    "rand_augment",
    "random_erasing",
    "random_resized_crop",
    "soft_target_cross_entropy",
]

RAND_AUGMENT_OPS: tuple[str, ...] = (
    "AutoContrast",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "Rotate",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
)
_GEOMETRIC = frozenset({"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY"})
_MAX_LEVEL = 10.0  # timm's level denominator: magnitude 10 is the strongest
_ATTEMPTS = 10  # box attempts of the random resized crop and of random erasing
_LUMA = (0.299, 0.587, 0.114)  # PIL's convert("L") weights
_F64 = torch.float64  # parameters are drawn and computed in float64 on the CPU, cast once per op


# ----------------------------------------------------------------------------------------------------- checks


def _check_images(images: object, *, floating: bool = True) -> None:
    if not isinstance(images, Tensor) or images.dim() != 4:
        got = f"shape {tuple(images.shape)}" if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"images must be a (B, C, H, W) tensor, got {got}")
    if floating and not images.is_floating_point():
        raise TypeError(f"images must be a floating-point tensor, got {images.dtype}")


def _check_generator(generator: object) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU torch.Generator (draws are made on the CPU), got {generator.device}")
    return generator


def _check_pair(
    name: str, value: object, *, low: float, high: float | None = None, low_open: bool = False
) -> tuple[float, float]:
    """A (low, high) pair of numbers in range with low <= high, returned as a tuple of floats."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise TypeError(f"{name} must be a pair (low, high) of numbers, got {value!r}")
    lo = check_number(f"{name}[0]", value[0], low=low, high=high, low_open=low_open)
    hi = check_number(f"{name}[1]", value[1], low=low, high=high, low_open=low_open)
    if lo > hi:
        raise ValueError(f"{name} must be (low, high) with low <= high, got {value!r}")
    return lo, hi


def _check_channels(
    name: str, value: object, *, low: float | None = None, high: float | None = None, low_open: bool = False
) -> tuple[float, ...]:
    """A number, or a non-empty sequence of numbers (one per channel), returned as a tuple of floats."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = (value,)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
        raise TypeError(f"{name} must be a number or a sequence of numbers (one per channel), got {value!r}")
    return tuple(check_number(f"{name}[{i}]", v, low=low, high=high, low_open=low_open) for i, v in enumerate(value))


def _channel_tensor(name: str, values: tuple[float, ...], images: Tensor) -> Tensor:
    """(1, C or 1, 1, 1) tensor of per-channel values, on the images' device and dtype."""
    c = images.shape[1]
    if len(values) not in (1, c):
        raise ValueError(f"{name} must have 1 or C = {c} values, got {len(values)}")
    return torch.tensor(values, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)  # (1, C or 1, 1, 1)


def _check_labels(labels: object, batch: int | None, num_classes: int) -> Tensor:
    if not isinstance(labels, Tensor) or labels.dim() != 1:
        got = f"shape {tuple(labels.shape)}" if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"labels must be a (B,) tensor of class indices, got {got}")
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise TypeError(f"labels must be an integer tensor, got {labels.dtype}")
    if batch is not None and labels.shape[0] != batch:
        raise ValueError(f"labels must have one entry per image ({batch}), got {labels.shape[0]}")
    # one host synchronisation: an out-of-range index is an error here, not a device-side assert later
    if bool(((labels < 0) | (labels >= num_classes)).any()):
        raise ValueError(f"labels must be class indices in [0, {num_classes - 1}] (num_classes = {num_classes})")
    return labels


def _per_sample(values: Tensor, images: Tensor) -> Tensor:
    """(n,) CPU float64 -> (n, 1, 1, 1) on the images' device and dtype, to broadcast over (C, H, W)."""
    return values.to(device=images.device, dtype=images.dtype).view(-1, 1, 1, 1)  # (n, 1, 1, 1)


# ------------------------------------------------------------------------------------------------- crops


def _crop_boxes(
    b: int, h: int, w: int, scale: tuple[float, float], ratio: tuple[float, float], g: torch.Generator
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """torchvision's RandomResizedCrop boxes for a batch: (top, left, height, width), each (B,) float64 on the CPU.

    All 10 attempts are drawn at once and the first that fits is taken; with none, the whole image narrowed to the
    nearest ratio bound, centred.
    """
    area = h * w
    frac = torch.empty(b, _ATTEMPTS, dtype=_F64).uniform_(*scale, generator=g)  # (B, 10)
    log_ratio = torch.empty(b, _ATTEMPTS, dtype=_F64).uniform_(math.log(ratio[0]), math.log(ratio[1]), generator=g)
    aspect = log_ratio.exp()  # width / height
    cw = (area * frac * aspect).sqrt().round()  # round half to even, as Python's round
    ch = (area * frac / aspect).sqrt().round()
    fits = (cw >= 1) & (cw <= w) & (ch >= 1) & (ch <= h)  # (B, 10)
    first = torch.where(fits, torch.arange(_ATTEMPTS), _ATTEMPTS).amin(1, keepdim=True)  # (B, 1)
    found = first.squeeze(1) < _ATTEMPTS  # (B,)
    first = first.clamp_max(_ATTEMPTS - 1)

    if w / h < ratio[0]:
        fw, fh = w, round(w / ratio[0])
    elif w / h > ratio[1]:
        fw, fh = round(h * ratio[1]), h
    else:
        fw, fh = w, h
    cw = torch.where(found, cw.gather(1, first).squeeze(1), float(fw))  # (B,)
    ch = torch.where(found, ch.gather(1, first).squeeze(1), float(fh))  # (B,)
    u = torch.rand(b, 2, dtype=_F64, generator=g)  # (B, 2): uniform offsets, top then left
    top = torch.where(found, (u[:, 0] * (h - ch + 1)).floor(), float((h - fh) // 2))
    left = torch.where(found, (u[:, 1] * (w - cw + 1)).floor(), float((w - fw) // 2))
    return top, left, ch, cw


def random_resized_crop(
    images: Tensor,
    size: int,
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    hflip: float = 0.5,
    generator: torch.Generator,
) -> Tensor:
    """One random crop per sample, resized to ``size x size``, flipped horizontally with probability ``hflip``.

    The crop covers a fraction ~ U(``scale``) of the image area with log aspect ratio (width / height) ~
    U(log ``ratio``); torchvision's rule: 10 attempts, the first that fits the image, else a central crop of the
    whole image narrowed to ``ratio``. The crop, the resize and the flip are one affine resample (bilinear,
    ``align_corners=False``, edges clamped), so the batch is read once.

    Args:
        images: (B, C, H, W) float; H and W need not equal ``size``.
        size: output side.
        scale: bounds of the area fraction, 0 < low <= high <= 1.
        ratio: bounds of the aspect ratio, 0 < low <= high.
        hflip: probability of a horizontal flip.
        generator: CPU generator all draws come from.

    Returns:
        (B, C, size, size), same dtype and device.
    """
    _check_images(images)
    size = check_int("size", size, low=1)
    scale = _check_pair("scale", scale, low=0.0, high=1.0, low_open=True)
    ratio = _check_pair("ratio", ratio, low=0.0, low_open=True)
    hflip = check_number("hflip", hflip, low=0.0, high=1.0)
    g = _check_generator(generator)
    b, _, h, w = images.shape

    top, left, ch, cw = _crop_boxes(b, h, w, scale, ratio, g)
    flip = torch.rand(b, dtype=_F64, generator=g) < hflip  # (B,)
    # normalised coordinates: output [-1, 1] onto the box edges, u_in = (cw / W) u_out + (2 left + cw) / W - 1
    theta = torch.zeros(b, 2, 3, dtype=_F64)  # (B, 2, 3)
    theta[:, 0, 0] = torch.where(flip, -cw / w, cw / w)  # the flip is a negative x scale about the box centre
    theta[:, 0, 2] = (2 * left + cw) / w - 1
    theta[:, 1, 1] = ch / h
    theta[:, 1, 2] = (2 * top + ch) / h - 1
    theta = theta.to(device=images.device, dtype=images.dtype)
    grid = F.affine_grid(theta, [b, images.shape[1], size, size], align_corners=False)  # (B, size, size, 2)
    # border padding: a bilinear tap half a pixel past an image edge reads the edge, not zeros
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)


def center_crop(images: Tensor, size: int) -> Tensor:
    """The central ``size x size`` window (torchvision's rounding of the offsets): (B, C, H, W) -> (B, C, size, size).

    Any dtype; a view of ``images``. ``size`` larger than H or W is an error (no padding).
    """
    _check_images(images, floating=False)
    size = check_int("size", size, low=1)
    h, w = images.shape[-2:]
    if size > h or size > w:
        raise ValueError(f"size ({size}) must not exceed the image height ({h}) and width ({w})")
    top, left = int(round((h - size) / 2)), int(round((w - size) / 2))
    return images[:, :, top : top + size, left : left + size]


# --------------------------------------------------------------------------------------------- RandAugment


def _enhance_factor(level: Tensor, sign: Tensor) -> Tensor:
    """timm's increasing enhance level: factor 1 +- 0.9 * level / 10, at least 0.1 (1 is the identity)."""
    return (1 + sign * level / _MAX_LEVEL * 0.9).clamp_min(0.1)


def _blend(degenerate: Tensor, x: Tensor, factor: Tensor) -> Tensor:
    """PIL ImageEnhance: interpolate (factor < 1) or extrapolate (> 1) from a degenerate image, then saturate."""
    return (degenerate + _per_sample(factor, x) * (x - degenerate)).clamp(0, 1)


def _luma(x: Tensor) -> Tensor:
    """(n, C, H, W) -> (n, 1, H, W) grey level."""
    if x.shape[1] == 1:
        return x
    weights = torch.tensor(_LUMA, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)  # (1, 3, 1, 1)
    return (x * weights).sum(1, keepdim=True)


def _auto_contrast(x: Tensor, level: Tensor, sign: Tensor) -> Tensor:
    # stretch each channel to [0, 1]; a constant channel is left alone
    lo, hi = x.amin((2, 3), keepdim=True), x.amax((2, 3), keepdim=True)  # (n, C, 1, 1)
    flat = hi <= lo
    return (x - torch.where(flat, 0, lo)) / torch.where(flat, 1, hi - lo)


def _brightness(x: Tensor, level: Tensor, sign: Tensor) -> Tensor:
    return _blend(torch.zeros_like(x), x, _enhance_factor(level, sign))


def _color(x: Tensor, level: Tensor, sign: Tensor) -> Tensor:
    # saturation: blend with the grey image (the identity for one channel)
    return _blend(_luma(x), x, _enhance_factor(level, sign))


def _contrast(x: Tensor, level: Tensor, sign: Tensor) -> Tensor:
    mean = _luma(x).mean((1, 2, 3), keepdim=True)  # (n, 1, 1, 1): mean grey level
    return _blend(mean, x, _enhance_factor(level, sign))


def _sharpness(x: Tensor, level: Tensor, sign: Tensor) -> Tensor:
    # PIL's SMOOTH filter (3x3, centre weight 5, total 13) on the interior; border pixels stay as they are
    degenerate = x.clone()
    if x.shape[-2] >= 3 and x.shape[-1] >= 3:
        c = x.shape[1]
        kernel = torch.ones(3, 3, dtype=x.dtype, device=x.device)
        kernel[1, 1] = 5
        kernel = (kernel / 13).expand(c, 1, 3, 3)  # (C, 1, 3, 3): one depthwise filter per channel
        degenerate[..., 1:-1, 1:-1] = F.conv2d(x, kernel, groups=c)
    return _blend(degenerate, x, _enhance_factor(level, sign))


def _posterize(x: Tensor, level: Tensor, sign: Tensor) -> Tensor:
    # timm's increasing level keeps 4 - int(4 * level / 10) bits of the 8-bit value (0 bits at level 10)
    bits = 4 - (level / _MAX_LEVEL * 4).floor()
    step = _per_sample(2.0 ** (8 - bits), x)  # (n, 1, 1, 1): size of a kept level, in 8-bit units
    return ((x * 255).round() / step).floor() * step / 255


def _solarize(x: Tensor, level: Tensor, sign: Tensor) -> Tensor:
    # invert values at or above 256 - int(256 * level / 10) on the 8-bit scale (none at level 0, all at 10)
    threshold = _per_sample((256 - (level / _MAX_LEVEL * 256).floor()) / 255, x)  # (n, 1, 1, 1)
    return torch.where(x >= threshold, 1 - x, x)


_COLOUR_OPS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "AutoContrast": _auto_contrast,
    "Brightness": _brightness,
    "Color": _color,
    "Contrast": _contrast,
    "Sharpness": _sharpness,
    "Posterize": _posterize,
    "Solarize": _solarize,
}


def _pixel_affines(name: str, level: Tensor, sign: Tensor, h: int, w: int) -> Tensor:
    """(n, 2, 3) float64 maps from output to input pixel coordinates (PIL's: pixel centres at i + 0.5)."""
    n = level.shape[0]
    m = torch.zeros(n, 2, 3, dtype=_F64)  # (n, 2, 3)
    m[:, 0, 0] = m[:, 1, 1] = 1
    signed = sign * level / _MAX_LEVEL
    if name == "Rotate":  # up to 30 degrees about the image centre
        a = torch.deg2rad(-30 * signed)
        cos, sin = a.cos(), a.sin()
        m[:, 0, 0], m[:, 0, 1], m[:, 1, 0], m[:, 1, 1] = cos, sin, -sin, cos
        cx, cy = w / 2, h / 2
        m[:, 0, 2] = cx - cos * cx - sin * cy  # in = R (out - c) + c
        m[:, 1, 2] = cy + sin * cx - cos * cy
    elif name == "ShearX":  # up to 0.3, about the top-left corner as in PIL
        m[:, 0, 1] = 0.3 * signed
    elif name == "ShearY":
        m[:, 1, 0] = 0.3 * signed
    elif name == "TranslateX":  # up to 0.45 of the side (timm's translate_pct)
        m[:, 0, 2] = 0.45 * signed * w
    else:  # TranslateY
        m[:, 1, 2] = 0.45 * signed * h
    return m


def _to_normalised(m: Tensor, h: int, w: int) -> Tensor:
    """Pixel-space affines (n, 2, 3) -> ``affine_grid`` thetas for ``align_corners=False`` (u = 2 p / side - 1).

    With D = diag(W / 2, H / 2), p = D (u + 1), so u_in = D^-1 A D u_out + D^-1 (A D 1 + t) - 1.
    """
    d = torch.tensor([w / 2, h / 2], dtype=_F64)
    lin = m[:, :, :2] * d.view(1, 1, 2) / d.view(1, 2, 1)  # (n, 2, 2): D^-1 A D
    shift = ((m[:, :, :2] * d.view(1, 1, 2)).sum(2) + m[:, :, 2]) / d.view(1, 2) - 1  # (n, 2)
    return torch.cat([lin, shift.unsqueeze(2)], 2)  # (n, 2, 3)


def _warp(x: Tensor, theta: Tensor, fill: Tensor) -> Tensor:
    """Bilinear resample of (n, C, H, W) through thetas (n, 2, 3); ``fill`` (1, C or 1, 1, 1) outside the image."""
    grid = F.affine_grid(theta.to(device=x.device, dtype=x.dtype), list(x.shape), align_corners=False)  # (n, H, W, 2)
    # sampling x - fill with zero padding and adding fill back puts the fill outside, for any interpolation
    return F.grid_sample(x - fill, grid, mode="bilinear", padding_mode="zeros", align_corners=False) + fill


def rand_augment(
    images: Tensor,
    *,
    num_ops: int = 2,
    magnitude: float = 9,
    magnitude_std: float = 0.5,
    fill: Sequence[float] | float = 0.5,
    prob: float = 0.5,
    ops: Sequence[str] | None = None,
    generator: torch.Generator,
) -> Tensor:
    """RandAugment with timm's ``rand-m9-mstd0.5-inc1`` semantics, on a batch.

    For each of ``num_ops`` slots and each sample: one op drawn uniformly from ``ops``, applied with probability
    ``prob``, at a magnitude ~ N(``magnitude``, ``magnitude_std``) clipped to [0, 10]; geometric ops and the
    enhance factors get a random sign. The "increasing" variants: a larger magnitude is always a stronger op.

    ==============  ===================================================================
    AutoContrast    stretch each channel to [0, 1] (no magnitude)
    Brightness      factor 1 +- 0.09 m (at least 0.1), blend with black
    Color           same factor, blend with the grey image (identity for C = 1)
    Contrast        same factor, blend with the mean grey level
    Sharpness       same factor, blend with PIL's SMOOTH filter
    Posterize       keep 4 - int(0.4 m) bits of the 8-bit value
    Solarize        invert values >= (256 - int(25.6 m)) / 255
    Rotate          +- 3 m degrees about the centre
    ShearX, ShearY  +- 0.03 m, about the top-left corner
    TranslateX, Y   +- 0.045 m of the width / height
    ==============  ===================================================================

    Samples are grouped by the op they drew (one kernel per op and slot; the geometric ops of a slot share one
    ``grid_sample``); the grouping is decided on the CPU, so no host synchronisation.

    Args:
        images: (B, C, H, W) float in [0, 1], C = 1 or 3.
        num_ops: op slots per sample (0: the images unchanged).
        magnitude: mean magnitude in [0, 10].
        magnitude_std: its standard deviation (0: fixed).
        fill: value(s) in [0, 1] outside the image after a geometric op: one number, or one per channel.
        prob: probability that a drawn op is applied (timm's 0.5).
        ops: names from :data:`RAND_AUGMENT_OPS` to draw from (None: all 12).
        generator: CPU generator all draws come from.

    Returns:
        (B, C, H, W) in [0, 1]; ``images`` itself when ``num_ops`` is 0.
    """
    _check_images(images)
    c = images.shape[1]
    if c not in (1, 3):
        raise ValueError(f"images must have 1 or 3 channels, got {c}")
    num_ops = check_int("num_ops", num_ops, low=0)
    magnitude = check_number("magnitude", magnitude, low=0.0, high=_MAX_LEVEL)
    magnitude_std = check_number("magnitude_std", magnitude_std, low=0.0)
    fill_t = _channel_tensor("fill", _check_channels("fill", fill, low=0.0, high=1.0), images)
    prob = check_number("prob", prob, low=0.0, high=1.0)
    if ops is None:
        names = RAND_AUGMENT_OPS
    else:
        if isinstance(ops, str) or not isinstance(ops, Sequence) or len(ops) == 0:
            raise TypeError(f"ops must be a non-empty sequence of op names, got {ops!r}")
        names = tuple(check_choice("ops", op, RAND_AUGMENT_OPS) for op in ops)
    g = _check_generator(generator)
    if num_ops == 0:
        return images
    b, _, h, w = images.shape

    out = images.clone()  # written per group below; the caller's tensor is left alone
    for _ in range(num_ops):
        # the same draws whatever is applied, so a seed fixes every slot
        choice = torch.randint(len(names), (b,), generator=g)  # (B,)
        applied = torch.rand(b, dtype=_F64, generator=g) < prob
        level = (magnitude + magnitude_std * torch.randn(b, dtype=_F64, generator=g)).clamp(0, _MAX_LEVEL)
        sign = torch.where(torch.rand(b, dtype=_F64, generator=g) < 0.5, -1.0, 1.0)
        warp_idx, warp_theta = [], []
        for k, name in enumerate(names):
            idx = (applied & (choice == k)).nonzero().squeeze(1)  # (n,) on the CPU
            if idx.numel() == 0:
                continue
            if name in _GEOMETRIC:
                warp_idx.append(idx)
                warp_theta.append(_to_normalised(_pixel_affines(name, level[idx], sign[idx], h, w), h, w))
            else:
                dev_idx = idx.to(images.device)
                out[dev_idx] = _COLOUR_OPS[name](out[dev_idx], level[idx], sign[idx])
        if warp_idx:
            dev_idx = torch.cat(warp_idx).to(images.device)
            out[dev_idx] = _warp(out[dev_idx], torch.cat(warp_theta), fill_t)
    return out.clamp_(0, 1)


# ------------------------------------------------------------------------------------------- random erasing


def random_erasing(
    images: Tensor,
    *,
    prob: float = 0.25,
    scale: tuple[float, float] = (0.02, 1 / 3),
    ratio: tuple[float, float] = (0.3, 1 / 0.3),
    mean: Sequence[float],
    std: Sequence[float],
    generator: torch.Generator,
) -> Tensor:
    """timm's RandomErasing (mode 'pixel', one box), on pixel-space images.

    With probability ``prob`` per sample, a box of area fraction ~ U(``scale``) and aspect ratio (height / width)
    ~ log-U(``ratio``) is placed uniformly; of 10 attempts the first strictly smaller than the image is used (none:
    the sample is left alone). Each pixel of the box gets ``mean + std * N(0, 1)`` per channel: once the model
    normalises with ``(x - mean) / std`` this is exactly timm's per-pixel N(0, 1) fill in normalised space. The
    erased values are not clamped to [0, 1].

    Args:
        images: (B, C, H, W) float in pixel space [0, 1].
        prob: probability that a sample is erased.
        scale: bounds of the box area fraction, 0 < low <= high <= 1.
        ratio: bounds of the box aspect ratio, 0 < low <= high.
        mean, std: the model's normalisation, one value or one per channel (std > 0).
        generator: CPU generator all draws come from.

    Returns:
        (B, C, H, W); ``images`` itself when no sample is erased.
    """
    _check_images(images)
    prob = check_number("prob", prob, low=0.0, high=1.0)
    scale = _check_pair("scale", scale, low=0.0, high=1.0, low_open=True)
    ratio = _check_pair("ratio", ratio, low=0.0, low_open=True)
    mean_t = _channel_tensor("mean", _check_channels("mean", mean), images)
    std_t = _channel_tensor("std", _check_channels("std", std, low=0.0, low_open=True), images)
    g = _check_generator(generator)
    b, c, h, w = images.shape

    erase = torch.rand(b, dtype=_F64, generator=g) < prob  # (B,)
    area = torch.empty(b, _ATTEMPTS, dtype=_F64).uniform_(*scale, generator=g) * (h * w)  # (B, 10)
    aspect = torch.empty(b, _ATTEMPTS, dtype=_F64).uniform_(math.log(ratio[0]), math.log(ratio[1]), generator=g).exp()
    bh = (area * aspect).sqrt().round()  # (B, 10)
    bw = (area / aspect).sqrt().round()
    fits = (bh < h) & (bw < w)
    first = torch.where(fits, torch.arange(_ATTEMPTS), _ATTEMPTS).amin(1, keepdim=True)  # (B, 1)
    erase &= first.squeeze(1) < _ATTEMPTS  # (B,): erased and some attempt fits
    first = first.clamp_max(_ATTEMPTS - 1)
    bh, bw = bh.gather(1, first).squeeze(1).long(), bw.gather(1, first).squeeze(1).long()  # (B,)
    u = torch.rand(b, 2, dtype=_F64, generator=g)  # (B, 2): uniform offsets, top then left
    top = (u[:, 0] * (h - bh + 1)).floor().long()
    left = (u[:, 1] * (w - bw + 1)).floor().long()
    bh, bw = bh * erase, bw * erase  # an empty box for the samples left alone
    ph, pw = int(bh.max()), int(bw.max())
    if ph == 0 or pw == 0:
        return images
    # noise only for the largest box, (B, C, ph, pw); pixel (y, x) of a box reads noise (y - top, x - left)
    noise = torch.randn(b, c, ph, pw, dtype=images.dtype, generator=g).to(images.device)
    rows, cols = torch.arange(h), torch.arange(w)
    ry = rows.view(1, h) - top.view(b, 1)  # (B, H): row inside the box
    rx = cols.view(1, w) - left.view(b, 1)  # (B, W)
    in_rows = ((ry >= 0) & (ry < bh.view(b, 1))).view(b, 1, h, 1)  # (B, 1, H, 1)
    in_cols = ((rx >= 0) & (rx < bw.view(b, 1))).view(b, 1, 1, w)  # (B, 1, 1, W)
    in_box = in_rows & in_cols  # (B, 1, H, W)
    batch = torch.arange(b).view(b, 1, 1)  # (B, 1, 1)
    ry, rx = ry.clamp(0, ph - 1).view(b, h, 1), rx.clamp(0, pw - 1).view(b, 1, w)  # (B, H, 1), (B, 1, W)
    dev = images.device
    patch = noise.permute(0, 2, 3, 1)[batch.to(dev), ry.to(dev), rx.to(dev)].permute(0, 3, 1, 2)  # (B, C, H, W)
    return torch.where(in_box.to(dev), mean_t + std_t * patch, images)


# -------------------------------------------------------------------------------------------- mixup / cutmix


def mix_targets(
    labels: Tensor, num_classes: int, lam: Tensor | float, *, smoothing: float = 0.0, dtype: torch.dtype | None = None
) -> Tensor:
    """Soft targets of a batch mixed with its flip: ``lam * onehot(y) + (1 - lam) * onehot(y.flip(0))``.

    One-hots are smoothed as in timm: ``smoothing / K`` off the label, ``1 - smoothing + smoothing / K`` on it;
    each row sums to 1.

    Args:
        labels: (B,) integer class indices in [0, num_classes).
        num_classes: K.
        lam: weight of the sample's own label: a float in [0, 1] or a (B,) tensor (per sample).
        smoothing: label smoothing in [0, 1).
        dtype: of the result (default: ``lam``'s if a floating tensor, else float32).

    Returns:
        (B, K) on the labels' device.
    """
    num_classes = check_int("num_classes", num_classes, low=1)
    labels = _check_labels(labels, None, num_classes)
    smoothing = check_number("smoothing", smoothing, low=0.0, high=1.0, high_open=True)
    if isinstance(lam, Tensor):
        if lam.shape != labels.shape:
            raise ValueError(f"lam must be a float or a (B,) tensor with B = {labels.shape[0]}, got {tuple(lam.shape)}")
        if dtype is None and lam.is_floating_point():
            dtype = lam.dtype
        lam = lam.to(labels.device).view(-1, 1)  # (B, 1)
    else:
        lam = check_number("lam", lam, low=0.0, high=1.0)
    dtype = torch.float32 if dtype is None else dtype
    off = smoothing / num_classes
    onehot = torch.full((labels.shape[0], num_classes), off, dtype=dtype, device=labels.device)  # (B, K)
    onehot.scatter_(1, labels.view(-1, 1), 1 - smoothing + off)  # labels (B, 1)
    return (lam * onehot + (1 - lam) * onehot.flip(0)).to(dtype)


def mixup_cutmix(
    images: Tensor,
    labels: Tensor,
    num_classes: int,
    *,
    mixup_alpha: float = 0.8,
    cutmix_alpha: float = 1.0,
    prob: float = 1.0,
    switch_prob: float = 0.5,
    smoothing: float = 0.1,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """timm's Mixup in 'batch' mode: one lam for the batch, mixed with the batch flipped along dim 0.

    With probability ``prob`` the batch is mixed: cutmix with probability ``switch_prob`` when both alphas are
    positive (else whichever is), mixup otherwise, with lam ~ Beta(alpha, alpha). Mixup: ``lam * x + (1 - lam) *
    x.flip(0)``. Cutmix: timm's ``rand_bbox`` box (sides ``sqrt(1 - lam)`` of the image's, centre uniform, clipped
    to the image) is pasted from ``x.flip(0)`` and lam becomes the un-pasted area fraction. Any batch size works
    (with an odd one the middle sample mixes with itself). Both alphas 0: no mixing, smoothed one-hot targets.

    Args:
        images: (B, C, H, W) float.
        labels: (B,) integer class indices.
        num_classes: K.
        mixup_alpha, cutmix_alpha: Beta parameters (>= 0; 0 turns that mode off).
        prob: probability of mixing the batch.
        switch_prob: probability of cutmix when both modes are on.
        smoothing: label smoothing in [0, 1).
        generator: CPU generator all draws come from.

    Returns:
        (mixed images (B, C, H, W), soft targets (B, K) in the images' dtype, rows summing to 1).
    """
    _check_images(images)
    num_classes = check_int("num_classes", num_classes, low=1)
    labels = _check_labels(labels, images.shape[0], num_classes)
    mixup_alpha = check_number("mixup_alpha", mixup_alpha, low=0.0)
    cutmix_alpha = check_number("cutmix_alpha", cutmix_alpha, low=0.0)
    prob = check_number("prob", prob, low=0.0, high=1.0)
    switch_prob = check_number("switch_prob", switch_prob, low=0.0, high=1.0)
    smoothing = check_number("smoothing", smoothing, low=0.0, high=1.0, high_open=True)
    g = _check_generator(generator)
    h, w = images.shape[-2:]

    u = torch.rand(4, dtype=_F64, generator=g).tolist()  # mix?, cutmix?, box centre y, box centre x
    seed = int(torch.randint(2**62, (1,), generator=g))  # seeds numpy's Beta sampler
    lam, cutmix = 1.0, False
    if (mixup_alpha > 0 or cutmix_alpha > 0) and u[0] < prob:
        cutmix = cutmix_alpha > 0 and (mixup_alpha == 0 or u[1] < switch_prob)
        alpha = cutmix_alpha if cutmix else mixup_alpha
        lam = float(np.random.default_rng(seed).beta(alpha, alpha))
    if cutmix:
        cut_h, cut_w = int(h * math.sqrt(1 - lam)), int(w * math.sqrt(1 - lam))
        cy, cx = int(u[2] * h), int(u[3] * w)
        y0, y1 = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, h)
        x0, x1 = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, w)
        mixed = images.clone()
        mixed[:, :, y0:y1, x0:x1] = images[:, :, y0:y1, x0:x1].flip(0)
        lam = 1 - (y1 - y0) * (x1 - x0) / (h * w)  # the clipped box sets the label weight (timm's correct_lam)
    elif lam < 1:
        mixed = lam * images + (1 - lam) * images.flip(0)
    else:
        mixed = images
    return mixed, mix_targets(labels, num_classes, lam, smoothing=smoothing, dtype=images.dtype)


def soft_target_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean over the batch of ``-sum_k targets * log_softmax(logits)``: logits and targets (B, K) -> scalar."""
    if not isinstance(logits, Tensor) or not isinstance(targets, Tensor) or logits.dim() != 2:
        raise ValueError("logits and targets must be (B, K) tensors")
    if logits.shape != targets.shape:
        raise ValueError(f"targets must have the logits' shape {tuple(logits.shape)}, got {tuple(targets.shape)}")
    return -(targets * F.log_softmax(logits, dim=-1)).sum(-1).mean()


# ------------------------------------------------------------------------------------------------- pipeline


@dataclass(frozen=True)
class AugmentSettings:
    """What :class:`BatchAugment` does; every field is checked, and an error names the field.

    DeiT's recipe: ``AugmentSettings(crop_scale=(0.08, 1.0), hflip=0.5, randaugment_ops=2, erasing=0.25,
    mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1)``. The defaults do nothing but a centre crop.
    """

    crop_scale: tuple[float, float] | None = None  # None: centre crop to size instead of a random resized crop
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: float = 0.0
    randaugment_ops: int = 0  # 0: off
    randaugment_magnitude: float = 9.0
    randaugment_magnitude_std: float = 0.5
    erasing: float = 0.0
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    mix_prob: float = 1.0
    mix_switch_prob: float = 0.5
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        # pairs may come as YAML lists: stored as tuples of floats (object.__setattr__: the dataclass is frozen)
        if self.crop_scale is not None:
            scale = _check_pair("crop_scale", self.crop_scale, low=0.0, high=1.0, low_open=True)
            object.__setattr__(self, "crop_scale", scale)
        object.__setattr__(self, "crop_ratio", _check_pair("crop_ratio", self.crop_ratio, low=0.0, low_open=True))
        check_number("hflip", self.hflip, low=0.0, high=1.0)
        check_int("randaugment_ops", self.randaugment_ops, low=0)
        check_number("randaugment_magnitude", self.randaugment_magnitude, low=0.0, high=_MAX_LEVEL)
        check_number("randaugment_magnitude_std", self.randaugment_magnitude_std, low=0.0)
        check_number("erasing", self.erasing, low=0.0, high=1.0)
        check_number("mixup_alpha", self.mixup_alpha, low=0.0)
        check_number("cutmix_alpha", self.cutmix_alpha, low=0.0)
        check_number("mix_prob", self.mix_prob, low=0.0, high=1.0)
        check_number("mix_switch_prob", self.mix_switch_prob, low=0.0, high=1.0)
        check_number("label_smoothing", self.label_smoothing, low=0.0, high=1.0, high_open=True)


class BatchAugment:
    """DeiT's training augmentation of a batch, in DeiT's order, from :class:`AugmentSettings`.

    Random resized crop and flip (or, with ``crop_scale=None``, a centre crop when the images are not already
    ``size x size``, and the flip alone), RandAugment (filled with ``mean``), random erasing, then mixup / cutmix.
    Targets are always soft: smoothed one-hots when nothing is mixed.

    Args:
        settings: what to apply.
        size: output side.
        num_classes: K.
        mean, std: the model's normalisation in pixel space [0, 1], one value or one per channel; ``mean`` fills
            RandAugment's geometric ops, both set the random erasing fill.
    """

    def __init__(
        self, settings: AugmentSettings, size: int, num_classes: int, mean: Sequence[float], std: Sequence[float]
    ) -> None:
        if not isinstance(settings, AugmentSettings):
            raise TypeError(f"settings must be an AugmentSettings, got {type(settings).__name__}")
        self.settings = settings
        self.size = check_int("size", size, low=1)
        self.num_classes = check_int("num_classes", num_classes, low=1)
        self.mean = _check_channels("mean", mean, low=0.0, high=1.0)
        self.std = _check_channels("std", std, low=0.0, low_open=True)

    def __call__(self, images: Tensor, labels: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """images (B, C, H, W) uint8 (0-255) or float in [0, 1]; returns (images (B, C, size, size) float in pixel
        space [0, 1] except erased boxes, soft targets (B, num_classes) float summing to 1)."""
        s = self.settings
        _check_images(images, floating=False)
        if images.dtype == torch.uint8:
            x = images.float() / 255  # (B, C, H, W) float32 in [0, 1]
        elif images.is_floating_point():
            x = images
        else:
            raise TypeError(f"images must be uint8 or floating point, got {images.dtype}")
        labels = _check_labels(labels, images.shape[0], self.num_classes)
        g = _check_generator(generator)
        c = images.shape[1]
        for name, values in (("mean", self.mean), ("std", self.std)):
            if len(values) not in (1, c):
                raise ValueError(f"{name} must have 1 or C = {c} values, got {len(values)}")

        if s.crop_scale is not None:
            x = random_resized_crop(x, self.size, scale=s.crop_scale, ratio=s.crop_ratio, hflip=s.hflip, generator=g)
        else:
            if x.shape[-2:] != (self.size, self.size):
                x = center_crop(x, self.size)
            if s.hflip > 0:
                flip = torch.rand(x.shape[0], dtype=_F64, generator=g) < s.hflip
                x = torch.where(flip.to(x.device).view(-1, 1, 1, 1), x.flip(-1), x)  # flip (B, 1, 1, 1)
        if s.randaugment_ops > 0:
            x = rand_augment(
                x,
                num_ops=s.randaugment_ops,
                magnitude=s.randaugment_magnitude,
                magnitude_std=s.randaugment_magnitude_std,
                fill=self.mean,
                generator=g,
            )
        if s.erasing > 0:
            x = random_erasing(x, prob=s.erasing, mean=self.mean, std=self.std, generator=g)
        if s.mixup_alpha > 0 or s.cutmix_alpha > 0:
            return mixup_cutmix(
                x,
                labels,
                self.num_classes,
                mixup_alpha=s.mixup_alpha,
                cutmix_alpha=s.cutmix_alpha,
                prob=s.mix_prob,
                switch_prob=s.mix_switch_prob,
                smoothing=s.label_smoothing,
                generator=g,
            )
        return x, mix_targets(labels, self.num_classes, 1.0, smoothing=s.label_smoothing, dtype=x.dtype)
