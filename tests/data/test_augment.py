"""DeiT batch augmentation: determinism, exact identities of each op, mixup / cutmix bookkeeping, option checks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from primaldual.data.augment import (
    RAND_AUGMENT_OPS,
    AugmentSettings,
    BatchAugment,
    center_crop,
    mix_targets,
    mixup_cutmix,
    rand_augment,
    random_erasing,
    random_resized_crop,
    soft_target_cross_entropy,
)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DEIT = AugmentSettings(
    crop_scale=(0.08, 1.0),
    hflip=0.5,
    randaugment_ops=2,
    erasing=0.25,
    mixup_alpha=0.8,
    cutmix_alpha=1.0,
    label_smoothing=0.1,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def images(b: int = 5, c: int = 3, h: int = 12, w: int = 12, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.rand(b, c, h, w, generator=gen(123), dtype=dtype)


def labels(b: int = 5) -> torch.Tensor:
    return torch.arange(b) % 4


# each entry: seed -> output tensor(s), one call of a public function with every random part switched on
CALLS = {
    "random_resized_crop": lambda s: random_resized_crop(images(h=10, w=14), 8, generator=gen(s)),
    "rand_augment": lambda s: rand_augment(images(), num_ops=3, prob=1.0, generator=gen(s)),
    "random_erasing": lambda s: random_erasing(images(), prob=1.0, mean=MEAN, std=STD, generator=gen(s)),
    "mixup": lambda s: mixup_cutmix(images(), labels(), 4, cutmix_alpha=0.0, generator=gen(s)),
    "cutmix": lambda s: mixup_cutmix(images(h=16, w=16), labels(), 4, mixup_alpha=0.0, generator=gen(s)),
    "BatchAugment": lambda s: BatchAugment(DEIT, 8, 4, MEAN, STD)(images(h=10, w=14), labels(), gen(s)),
}


def _flat(out) -> torch.Tensor:
    parts = out if isinstance(out, tuple) else (out,)
    return torch.cat([p.flatten().double() for p in parts])


@pytest.mark.parametrize("name", list(CALLS))
def test_deterministic_given_generator_and_global_rng_untouched(name):
    state = torch.get_rng_state()
    a, b, other = _flat(CALLS[name](1)), _flat(CALLS[name](1)), _flat(CALLS[name](2))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a, b)
    assert not torch.equal(a, other)


# ------------------------------------------------------------------------------------------------- crops


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_full_square_crop_is_identity_and_hflip_flips(dtype):
    x = images(dtype=dtype)
    kw = dict(scale=(1.0, 1.0), ratio=(1.0, 1.0), generator=gen())
    same = random_resized_crop(x, 12, hflip=0.0, **kw)
    flipped = random_resized_crop(x, 12, hflip=1.0, **kw)
    assert same.dtype == dtype
    torch.testing.assert_close(same, x, atol=1e-6, rtol=0)
    torch.testing.assert_close(flipped, x.flip(-1), atol=1e-6, rtol=0)


def test_crop_of_output_size_is_a_window_of_the_image():
    # a quarter of a 16 x 16 image, square: an 8 x 8 box read pixel for pixel
    x = images(b=4, h=16, w=16, dtype=torch.float64)
    out = random_resized_crop(x, 8, scale=(0.25, 0.25), ratio=(1.0, 1.0), hflip=0.0, generator=gen(3))
    windows = x.unfold(2, 8, 1).unfold(3, 8, 1)  # (B, C, 9, 9, 8, 8): every 8 x 8 window
    for i in range(4):
        err = (windows[i] - out[i].view(3, 1, 1, 8, 8)).abs().amax((0, 3, 4))  # (9, 9)
        assert err.min() < 1e-12
    assert len({tuple(o.flatten()[:3].tolist()) for o in out}) > 1  # boxes at different places


def test_crop_falls_back_to_the_central_crop():
    # ratio 2 never fits a square image at full area: 16 wide x 8 high, centred, shrunk 2x along x
    x = images(b=2, h=16, w=16, dtype=torch.float64)
    out = random_resized_crop(x, 8, scale=(1.0, 1.0), ratio=(2.0, 2.0), hflip=0.0, generator=gen())
    ref = x[:, :, 4:12].unflatten(3, (8, 2)).mean(4)  # (B, C, 8, 8): pairs of columns averaged
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)


def test_crop_shape_for_non_square_input():
    out = random_resized_crop(images(b=3, c=1, h=9, w=20), 7, generator=gen())
    assert out.shape == (3, 1, 7, 7)


def test_center_crop():
    x = torch.arange(2 * 1 * 7 * 6).view(2, 1, 7, 6)  # integer dtype too
    assert torch.equal(center_crop(x, 4), x[:, :, 2:6, 1:5])
    assert torch.equal(center_crop(x, 6), x[:, :, 0:6])  # (7 - 6) / 2 = 0.5 rounds to even 0
    with pytest.raises(ValueError, match="size"):
        center_crop(x, 7)


# --------------------------------------------------------------------------------------------- RandAugment


def test_rand_augment_range_shape_and_zero_ops():
    x = images(b=7, h=11, w=13)
    out = rand_augment(x, num_ops=4, magnitude=10, prob=1.0, generator=gen())
    assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1
    assert not torch.equal(out, x)
    assert rand_augment(x, num_ops=0, generator=gen()) is x


IDENTITY_AT_ZERO = [op for op in RAND_AUGMENT_OPS if op not in ("AutoContrast", "Posterize")]


@pytest.mark.parametrize("op", IDENTITY_AT_ZERO)
def test_ops_are_identities_at_magnitude_zero(op):
    x = images(b=4, dtype=torch.float64)  # float32 resampling is off by about 1e-6
    out = rand_augment(x, magnitude=0, magnitude_std=0, prob=1.0, ops=[op], generator=gen())
    torch.testing.assert_close(out, x, atol=1e-12, rtol=0)


def test_colour_ops_at_full_magnitude():
    x = images(b=6, dtype=torch.float64)
    kw = dict(num_ops=1, magnitude=10, magnitude_std=0, prob=1.0, generator=gen())
    # Solarize at 10 inverts everything; Posterize at 10 keeps no bit
    torch.testing.assert_close(rand_augment(x, ops=["Solarize"], **kw), 1 - x)
    assert rand_augment(x, ops=["Posterize"], **kw).abs().max() == 0
    # Posterize at 0 keeps 4 bits: multiples of 16 / 255
    levels = rand_augment(x, ops=["Posterize"], **{**kw, "magnitude": 0}) * 255 / 16
    torch.testing.assert_close(levels, levels.round())
    # AutoContrast stretches each channel to [0, 1]
    ac = rand_augment(x * 0.5 + 0.2, ops=["AutoContrast"], **kw)
    assert torch.allclose(ac.amin((2, 3)), x.new_zeros(6, 3)) and torch.allclose(ac.amax((2, 3)), x.new_ones(6, 3))
    # Brightness at 10: factor 0.1 or 1.9 per sample
    ratio = (rand_augment(x * 0.5, ops=["Brightness"], **kw) / (x * 0.5)).flatten(1)
    for row in ratio:
        assert torch.allclose(row, torch.full_like(row, 0.1)) or torch.allclose(
            row, (1.9 * x.new_ones(1)).expand_as(row)
        )
    # Color does nothing to one channel
    grey = images(b=3, c=1)
    torch.testing.assert_close(rand_augment(grey, ops=["Color"], **kw), grey)


def test_translate_moves_by_whole_pixels_and_fills():
    # 0.45 * 20 = 9 pixels at magnitude 10: a pure shift, the rest filled
    x = images(b=6, c=3, h=4, w=20, dtype=torch.float64)
    fill = (0.1, 0.2, 0.3)
    out = rand_augment(
        x, num_ops=1, magnitude=10, magnitude_std=0, prob=1.0, ops=["TranslateX"], fill=fill, generator=gen()
    )
    f = torch.tensor(fill, dtype=torch.float64).view(3, 1, 1)  # (3, 1, 1)
    left = torch.cat([x[:, :, :, 9:], f.expand(6, 3, 4, 9)], 3)  # out(x) = in(x + 9)
    right = torch.cat([f.expand(6, 3, 4, 9), x[:, :, :, :11]], 3)  # out(x) = in(x - 9)
    for o, a, b in zip(out, left, right):
        assert torch.allclose(o, a, atol=1e-12) or torch.allclose(o, b, atol=1e-12)


def _naive_affine(img: torch.Tensor, m: list[list[float]], fill: float) -> torch.Tensor:
    """Output pixel (y, x) reads the input at m @ (x + .5, y + .5, 1), bilinear, ``fill`` outside (loops)."""
    c, h, w = img.shape
    out = torch.empty_like(img)
    for y in range(h):
        for x in range(w):
            px = m[0][0] * (x + 0.5) + m[0][1] * (y + 0.5) + m[0][2] - 0.5  # pixel-index coordinates
            py = m[1][0] * (x + 0.5) + m[1][1] * (y + 0.5) + m[1][2] - 0.5
            x0, y0 = math.floor(px), math.floor(py)
            acc = torch.zeros(c, dtype=img.dtype)
            for yy, wy in ((y0, 1 - (py - y0)), (y0 + 1, py - y0)):
                for xx, wx in ((x0, 1 - (px - x0)), (x0 + 1, px - x0)):
                    inside = 0 <= yy < h and 0 <= xx < w
                    acc += wy * wx * (img[:, yy, xx] if inside else torch.full((c,), fill, dtype=img.dtype))
            out[:, y, x] = acc
    return out


@pytest.mark.parametrize("op", ["ShearX", "ShearY", "Rotate"])
def test_geometric_ops_match_a_naive_pil_style_warp(op):
    x = images(b=3, c=1, h=6, w=7, dtype=torch.float64)
    out = rand_augment(x, num_ops=1, magnitude=7, magnitude_std=0, prob=1.0, ops=[op], fill=0.25, generator=gen())
    for o, img in zip(out, x):
        refs = []
        for sign in (1, -1):
            s = sign * 0.7
            if op == "ShearX":
                m = [[1, 0.3 * s, 0], [0, 1, 0]]
            elif op == "ShearY":
                m = [[1, 0, 0], [0.3 * s, 1, 0]]
            else:  # PIL: in = R (out - c) + c, R = [[cos a, sin a], [-sin a, cos a]], a = -angle
                a = -math.radians(30 * s)
                cx, cy = 3.5, 3.0
                ca, sa = math.cos(a), math.sin(a)
                m = [[ca, sa, cx - ca * cx - sa * cy], [-sa, ca, cy + sa * cx - ca * cy]]
            refs.append(_naive_affine(img, m, 0.25).clamp(0, 1))
        assert any(torch.allclose(o, r, atol=1e-10) for r in refs)


def test_ops_are_drawn_per_sample():
    # one op each at magnitude 10: samples of one batch get different ops
    x = images(b=16)
    out = rand_augment(x, num_ops=1, magnitude=10, magnitude_std=0, prob=1.0, generator=gen())
    changed = (out - x).abs().flatten(1).amax(1) > 1e-6
    assert changed.all()
    assert len({round(float(d), 4) for d in (out - x).abs().flatten(1).mean(1)}) > 8


# ------------------------------------------------------------------------------------------- random erasing


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_erasing_changes_one_box_per_sample(dtype):
    b, h, w = 6, 24, 20
    x = images(b=b, h=h, w=w, dtype=dtype)
    scale = (0.02, 1 / 3)
    out = random_erasing(x, prob=1.0, scale=scale, mean=MEAN, std=STD, generator=gen())
    assert out.dtype == dtype and out.shape == x.shape
    changed = (out != x).any(1)  # (B, H, W)
    erased = []
    for i in range(b):
        ys, xs = changed[i].nonzero(as_tuple=True)
        y0, y1, x0, x1 = int(ys.min()), int(ys.max()) + 1, int(xs.min()), int(xs.max()) + 1
        bh, bw = y1 - y0, x1 - x0
        assert changed[i, y0:y1, x0:x1].all() and changed[i].sum() == bh * bw  # one full rectangle
        assert bh < h and bw < w
        # rounded sides of a box whose area is in scale * H * W
        assert (bh + 0.5) * (bw + 0.5) >= scale[0] * h * w and (bh - 0.5) * (bw - 0.5) <= scale[1] * h * w
        erased.append(
            (out[i, :, y0:y1, x0:x1] - torch.tensor(MEAN, dtype=dtype).view(3, 1, 1))
            / torch.tensor(STD, dtype=dtype).view(3, 1, 1)
        )
    z = torch.cat([e.flatten() for e in erased])  # back in normalised space: N(0, 1)
    assert abs(float(z.mean())) < 0.15 and abs(float(z.std()) - 1) < 0.15
    assert (out < 0).any() or (out > 1).any()  # not clamped


def test_erasing_with_prob_zero_is_identity():
    x = images()
    assert torch.equal(random_erasing(x, prob=0.0, mean=MEAN, std=STD, generator=gen()), x)


# -------------------------------------------------------------------------------------------- mixup / cutmix


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("mode", ["mixup", "cutmix", "both", "off"])
def test_targets_are_distributions(mode, smoothing):
    alphas = {"mixup": (0.8, 0.0), "cutmix": (0.0, 1.0), "both": (0.8, 1.0), "off": (0.0, 0.0)}[mode]
    for seed in range(4):
        _, t = mixup_cutmix(
            images(),
            labels(),
            4,
            mixup_alpha=alphas[0],
            cutmix_alpha=alphas[1],
            smoothing=smoothing,
            generator=gen(seed),
        )
        assert t.shape == (5, 4)
        torch.testing.assert_close(t.sum(1), torch.ones(5))
        assert t.min() >= 0 and t.max() <= 1
        if mode == "off" or smoothing > 0:
            assert t.min() >= smoothing / 4 - 1e-7


def test_cutmix_lam_is_the_unpasted_fraction():
    b, mixed = 5, [0, 1, 3, 4]  # odd: the middle sample is its own partner, and keeps its label
    x = torch.arange(b, dtype=torch.float64).view(b, 1, 1, 1).expand(b, 2, 13, 11)  # image i is all i
    y = torch.arange(b)
    seen = 0
    for seed in range(12):
        out, t = mixup_cutmix(x, y, b, mixup_alpha=0.0, smoothing=0.0, generator=gen(seed))
        lam = t[y, y]  # weight of the own label
        assert float(lam[2]) == 1 and torch.equal(out[2], x[2])
        assert torch.equal(lam[mixed], lam[:1].expand(4))  # one lam for the batch
        torch.testing.assert_close(t[y, y.flip(0)][mixed], 1 - lam[mixed])
        for i in mixed:
            own = (out[i] == i).double().mean()
            partner = (out[i] == b - 1 - i).double().mean()
            assert float(own) == pytest.approx(float(lam[i]), abs=1e-12)
            assert float(own + partner) == 1
        seen += float(lam[0]) < 1
    assert seen >= 8


def test_mixup_images_are_the_convex_combination():
    x = images(b=6, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3, 0, 1])
    out, t = mixup_cutmix(x, y, 4, cutmix_alpha=0.0, smoothing=0.0, generator=gen(5))
    lam = float(t[0, 0])
    assert 0 < lam < 1
    torch.testing.assert_close(out, lam * x + (1 - lam) * x.flip(0))
    torch.testing.assert_close(t, mix_targets(y, 4, lam, dtype=torch.float64))


def test_no_mixing_gives_smoothed_one_hots():
    x = images()
    out, t = mixup_cutmix(x, labels(), 4, prob=0.0, smoothing=0.2, generator=gen())
    assert out is x
    ref = torch.full((5, 4), 0.05)
    ref[torch.arange(5), labels()] = 0.85
    torch.testing.assert_close(t, ref)


def test_mix_targets_per_sample_lam_and_cross_entropy():
    y = torch.tensor([2, 0, 1])
    lam = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    t = mix_targets(y, 3, lam)
    assert t.dtype == torch.float64
    torch.testing.assert_close(t, torch.tensor([[0, 0, 1.0], [1.0, 0, 0], [0, 0.25, 0.75]], dtype=torch.float64))
    logits = torch.randn(3, 3)
    smooth = mix_targets(y, 3, 1.0, smoothing=0.1)
    torch.testing.assert_close(
        soft_target_cross_entropy(logits, smooth), F.cross_entropy(logits, y, label_smoothing=0.1)
    )


# ------------------------------------------------------------------------------------------------- pipeline


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.float64])
@pytest.mark.parametrize("c", [1, 3])
def test_batch_augment_dtypes_channels_odd_batch(dtype, c):
    b = 5
    x = images(b=b, c=c, h=10, w=14)
    x = (x * 255).to(torch.uint8) if dtype == torch.uint8 else x.to(dtype)
    aug = BatchAugment(DEIT, 8, 4, MEAN[:c], STD[:c])
    out, t = aug(x, labels(b), gen())
    want = torch.float32 if dtype == torch.uint8 else dtype
    assert out.shape == (b, c, 8, 8) and out.dtype == want and t.dtype == want
    torch.testing.assert_close(t.sum(1), torch.ones(b, dtype=want))


def test_batch_augment_without_crop_centre_crops_and_smooths():
    x = images(b=3, h=10, w=10)
    out, t = BatchAugment(AugmentSettings(label_smoothing=0.1), 8, 4, MEAN, STD)(x, labels(3), gen())
    assert torch.equal(out, x[:, :, 1:9, 1:9])
    torch.testing.assert_close(t, mix_targets(labels(3), 4, 1.0, smoothing=0.1))
    flipped, _ = BatchAugment(AugmentSettings(hflip=1.0), 10, 4, MEAN, STD)(x, labels(3), gen())
    assert torch.equal(flipped, x.flip(-1))


def test_settings_accept_lists_as_pairs():
    s = AugmentSettings(crop_scale=[0.08, 1], crop_ratio=[0.75, 1.25])
    assert s.crop_scale == (0.08, 1.0) and s.crop_ratio == (0.75, 1.25)


# (where, bad keyword arguments, name the error must contain)
BAD = [
    ("settings", {"hflip": 1.5}, "hflip"),
    ("settings", {"crop_scale": (0.9, 0.1)}, "crop_scale"),
    ("settings", {"crop_scale": (0.0, 1.0)}, "crop_scale"),
    ("settings", {"crop_ratio": "3/4"}, "crop_ratio"),
    ("settings", {"mixup_alpha": -1}, "mixup_alpha"),
    ("settings", {"cutmix_alpha": math.nan}, "cutmix_alpha"),
    ("settings", {"randaugment_ops": "2"}, "randaugment_ops"),
    ("settings", {"randaugment_ops": 2.0}, "randaugment_ops"),
    ("settings", {"randaugment_magnitude": 11}, "randaugment_magnitude"),
    ("settings", {"erasing": "0.25"}, "erasing"),
    ("settings", {"mix_prob": True}, "mix_prob"),
    ("settings", {"label_smoothing": 1.0}, "label_smoothing"),
    ("crop", {"hflip": -0.1}, "hflip"),
    ("crop", {"size": 0}, "size"),
    ("crop", {"scale": (0.5,)}, "scale"),
    ("crop", {"ratio": (2.0, 1.0)}, "ratio"),
    ("crop", {"generator": None}, "generator"),
    ("randaugment", {"num_ops": -1}, "num_ops"),
    ("randaugment", {"magnitude_std": -0.5}, "magnitude_std"),
    ("randaugment", {"fill": (0.5, 0.5)}, "fill"),
    ("randaugment", {"fill": 2.0}, "fill"),
    ("randaugment", {"ops": ["Equalize"]}, "ops"),
    ("randaugment", {"ops": "Rotate"}, "ops"),
    ("erasing", {"prob": 1.1}, "prob"),
    ("erasing", {"std": (0.2, 0.0, 0.2)}, "std"),
    ("erasing", {"scale": (0.5, 0.2)}, "scale"),
    ("mix", {"switch_prob": 2}, "switch_prob"),
    ("mix", {"smoothing": 1.0}, "smoothing"),
    ("mix", {"labels": torch.tensor([0, 1, 2, 3, 9])}, "labels"),
    ("mix", {"labels": torch.zeros(5)}, "labels"),
    ("mix", {"labels": torch.zeros(4, dtype=torch.long)}, "labels"),
    ("mix", {"images": torch.zeros(5, 3, 4, 4, dtype=torch.uint8)}, "images"),
    ("batch", {"mean": (0.5, 0.5)}, "mean"),
    ("batch", {"mean": (123.7, 116.3, 103.5)}, "mean"),
    ("batch", {"std": 0}, "std"),
    ("batch", {"size": 16, "settings": AugmentSettings()}, "size"),  # centre crop larger than the image
]


def _call(where: str, kw: dict) -> None:
    x, g = images(), gen()
    if where == "settings":
        AugmentSettings(**kw)
    elif where == "crop":
        random_resized_crop(x, **{"size": 8, "generator": g, **kw})
    elif where == "randaugment":
        rand_augment(x, **{"generator": g, **kw})
    elif where == "erasing":
        random_erasing(x, **{"prob": 0.5, "mean": MEAN, "std": STD, "generator": g, **kw})
    elif where == "mix":
        kw = {"images": x, "labels": labels(), **kw}
        mixup_cutmix(kw.pop("images"), kw.pop("labels"), 4, generator=g, **kw)
    else:
        kw = {"settings": DEIT, "mean": MEAN, "std": STD, "size": 8, **kw}
        BatchAugment(kw["settings"], kw["size"], 4, kw["mean"], kw["std"])(x, labels(), g)


@pytest.mark.parametrize("where,kw,name", BAD, ids=[f"{w}-{n}" for w, _, n in BAD])
def test_bad_option_names_the_argument(where, kw, name):
    with pytest.raises((TypeError, ValueError), match=name):
        _call(where, kw)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_same_draws_on_gpu():
    x = images(b=6, h=10, w=14, dtype=torch.float64)
    cpu = BatchAugment(DEIT, 8, 4, MEAN, STD)(x, labels(6), gen(7))
    gpu = BatchAugment(DEIT, 8, 4, MEAN, STD)(x.cuda(), labels(6).cuda(), gen(7))
    for a, b in zip(cpu, gpu):
        torch.testing.assert_close(b.cpu(), a, atol=1e-9, rtol=0)
