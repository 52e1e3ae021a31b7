"""A user's own PyTorch language model converted to primal attention with :func:`primaldual.convert.torch_nn.convert_torch`
(``--arch torch``) or :func:`primaldual.convert.modules.convert_modules` (``--arch nanogpt``).

The teacher is written as a PyTorch user writes one, not with primaldual: PyTorch's word-language-model layout
(``nn.Embedding``, sinusoidal positions, ``nn.TransformerEncoder`` called with a causal mask, a tied output layer;
pre-LN layers), or nanoGPT's (``transformer.h[i].attn`` a hand-written ``CausalSelfAttention`` with a fused
``c_attn``, learned positions, GELU MLP, tied output layer, its initialisation), trained by a plain loop on the English corpus of ``primaldual data fetch english`` at the budget of
``lm/english/reduced/*`` (width 128, 4 layers, 4 heads, FFN 512, 600 updates of 8 x 256 tokens, AdamW lr 2e-3 with
200 warm-up updates then inverse-sqrt, clipping at 1). Then, from that one teacher, with 10% of its tokens as in
docs/results.md 3c:

* ``primal_plus`` / ``primalformer``: the last / every layer converted (teacher initialisation on one calibration
  batch of 32 x 256 tokens, stage 1 of 20 batches of 8 x 256), then stage 2: 40 updates of the whole model at lr 2e-4
  (cosine, 20 warm-up) on the language-modelling loss plus :func:`primaldual.collect_aux_loss`;
* ``*_swap``: the same layers swapped in with the primal layer's own random initialisation, no stage 1, 60 updates of
  stage 2 (the same tokens);
* ``control``: the teacher given the 60 updates of stage 2.

The options are the shipped conversion's (``s`` 30, ``eta`` 0.1, per-sample KSVD). Test perplexity is measured on the
whole test split in 256-token chunks at the end of each run (the final weights, no checkpoint selection). Each phase
writes its JSON atomically, so a killed run continues where it stopped::

    python benchmarks/convert_torch_lm.py --seed 0 --out runs/convert_torch_lm                 # runs/.../seed0
    python benchmarks/convert_torch_lm.py --arch nanogpt --seed 0 --out runs/convert_torch_lm  # .../nanogpt-seed0
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from primaldual import collect_aux_loss
from primaldual.convert.modules import convert_modules
from primaldual.convert.torch_nn import convert_torch
from primaldual.data.cache import dataset_dir
from primaldual.utils.io import atomic_write_json

PHASES = ("control", "primal_plus", "primal_plus_swap", "primalformer", "primalformer_swap")
OPTIONS = {"s": 30, "eta": 0.1, "ksvd_reduction": "sample"}
LEN, BATCH = 256, 8


class WordLM(nn.Module):
    """PyTorch's word-language-model Transformer (its embedding initialisation and scale), pre-LN, with tied
    embeddings: ``(B, N)`` ids -> ``(B, N, V)``."""

    def __init__(self, vocab: int, dim: int = 128, heads: int = 4, ffn: int = 512, depth: int = 4) -> None:
        super().__init__()
        self.dim, self.vocab = dim, vocab
        self.emb = nn.Embedding(vocab, dim)
        pos = torch.arange(LEN)[:, None] * torch.exp(torch.arange(0, dim, 2) * (-math.log(10000.0) / dim))
        pe = torch.zeros(LEN, dim)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos), torch.cos(pos)
        self.register_buffer("pe", pe)
        self.drop = nn.Dropout(0.1)
        layer = nn.TransformerEncoderLayer(dim, heads, ffn, 0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, norm=nn.LayerNorm(dim), enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight
        nn.init.uniform_(self.emb.weight, -0.1, 0.1)  # as PyTorch's example: N(0, 1) tied weights start far too peaked

    def forward(self, ids: Tensor) -> Tensor:
        N = ids.shape[1]
        h = self.drop(self.emb(ids) * math.sqrt(self.dim) + self.pe[:N])  # (B, N, C)
        causal = nn.Transformer.generate_square_subsequent_mask(N, device=ids.device)
        return self.head(self.encoder(h, mask=causal, is_causal=True))


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention: ``c_attn`` gives q, k, v side by side, SDPA with ``is_causal=True``, ``c_proj``."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.resid_dropout = nn.Dropout(0.1)
        self.n_head = heads

    def forward(self, x: Tensor) -> Tensor:
        B, N, C = x.shape
        q, k, v = (t.view(B, N, self.n_head, -1).transpose(1, 2) for t in self.c_attn(x).split(C, 2))  # (B, H, N, D)
        drop = 0.1 if self.training else 0.0
        y = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)  # (B, H, N, D)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, N, C)))  # (B, N, C)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(dim), CausalSelfAttention(dim, heads), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim), nn.Dropout(0.1))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """nanoGPT's ``GPT`` at the same sizes: learned positions, pre-LN blocks, tied output layer, N(0, 0.02) weights
    with the residual projections scaled by 1 / sqrt(2 depth): ``(B, N)`` ids -> ``(B, N, V)``."""

    def __init__(self, vocab: int, dim: int = 128, heads: int = 4, ffn: int = 512, depth: int = 4) -> None:
        super().__init__()
        self.vocab = vocab
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab, dim),
                "wpe": nn.Embedding(LEN, dim),
                "drop": nn.Dropout(0.1),
                "h": nn.ModuleList([Block(dim, heads, ffn) for _ in range(depth)]),
                "ln_f": nn.LayerNorm(dim),
            }
        )
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * depth) if name.endswith(("c_proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, ids: Tensor) -> Tensor:
        t = self.transformer
        x = t.drop(t.wte(ids) + t.wpe(torch.arange(ids.shape[1], device=ids.device)))  # (B, N, C)
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))  # (B, N, V)


def _convert(arch: str, teacher: nn.Module, layers: Any, **kwargs: Any) -> tuple[nn.Module, dict[str, Any]]:
    if arch == "torch":
        return convert_torch(teacher, "primal", layers, causal=True, **kwargs)
    layout = {"modules": "transformer.h.*.attn", "qkv": "c_attn", "proj": "c_proj", "causal": True}
    return convert_modules(teacher, "primal", layers, **layout, **kwargs)


ARCHS = {"torch": WordLM, "nanogpt": NanoGPT}


def windows(tokens: np.ndarray, count: int, gen: torch.Generator) -> Tensor:
    """``count`` random windows of ``LEN + 1`` tokens ``(count, LEN + 1)``."""
    starts = torch.randint(0, len(tokens) - LEN - 1, (count,), generator=gen)
    return torch.stack([torch.from_numpy(tokens[s : s + LEN + 1].astype(np.int64)) for s in starts.tolist()])


@torch.no_grad()
def perplexity(model: nn.Module, tokens: np.ndarray) -> float:
    """exp of the mean next-token loss over the split in non-overlapping ``LEN``-token chunks."""
    model.eval()
    n = (len(tokens) - 1) // LEN
    ids = torch.from_numpy(tokens[: n * LEN + 1].astype(np.int64))
    total = 0.0
    for i in range(0, n, 32):
        rows = torch.stack([ids[j * LEN : j * LEN + LEN + 1] for j in range(i, min(n, i + 32))])  # (b, LEN + 1)
        logits = model(rows[:, :-1])
        total += float(nn.functional.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="sum"))
    model.train()
    return math.exp(total / (n * LEN))


def train(model: nn.Module, tokens: np.ndarray, steps: int, lr: float, warmup: int, decay: str, seed: int) -> float:
    """A plain training loop (AdamW (0.9, 0.98), wd 0.01, clipping at 1); returns seconds spent."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if decay == "inverse_sqrt":
            return math.sqrt(warmup / (step + 1))
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    model.train()
    start = time.perf_counter()
    for _ in range(steps):
        rows = windows(tokens, BATCH, gen)
        logits = model(rows[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())
        aux = collect_aux_loss(model)  # the primal layers' KSVD terms; None without any
        loss = loss if aux is None else loss + aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if sched.last_epoch % 100 == 0:
            print(f"  update {sched.last_epoch}/{steps}: loss {float(loss.detach()):.3f}", flush=True)
    return time.perf_counter() - start


def phase(name: str, arch: str, teacher: nn.Module, data: dict[str, np.ndarray], seed: int) -> dict[str, Any]:
    """One conversion (or the control) from ``teacher``: its figures."""
    layers = {"primal_plus": -1, "primalformer": "all"}.get(name.removesuffix("_swap"))
    out: dict[str, Any] = {"phase": name}
    torch.manual_seed(seed + 1)
    if layers is None:
        model = type(teacher)(teacher.vocab)  # a fresh module (its draws kept), the teacher's weights
        model.load_state_dict(teacher.state_dict())
        stage2 = 60
    else:
        swap = name.endswith("_swap")
        gen = torch.Generator().manual_seed(seed + 2)
        batches = [windows(data["train"], 32, gen)[:, :-1]] + [
            windows(data["train"], BATCH, gen)[:, :-1] for _ in range(20)
        ]
        start = time.perf_counter()
        model, report = _convert(
            arch, teacher, layers, batches=None if swap else batches, steps=0 if swap else 20,
            init="random" if swap else "teacher", log_every=20, **OPTIONS,
        )  # fmt: skip
        out["stage1_s"] = time.perf_counter() - start
        out["stage1"] = [
            {k: round(v, 4) for k, v in row.items() if k.startswith(("step", "loss"))} for row in report["history"]
        ]
        out["ppl_after_stage1"] = perplexity(model, data["valid"])
        stage2 = 60 if swap else 40
    out["stage2_s"] = train(model, data["train"], stage2, 2e-4, 20, "cosine", seed + 3)
    out["stage2_updates"] = stage2
    out["test_ppl"] = perplexity(model, data["test"])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    p.add_argument("--arch", choices=tuple(ARCHS), default="torch", help="the teacher's layout (see above)")
    args = p.parse_args()
    root = dataset_dir("english")
    data = {s: np.load(root / f"{s}.u16.npy", allow_pickle=False) for s in ("train", "valid", "test")}
    vocab = len(json.loads((root / "tokenizer.json").read_text())["model"]["vocab"])
    out = args.out / (f"seed{args.seed}" if args.arch == "torch" else f"{args.arch}-seed{args.seed}")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    teacher = ARCHS[args.arch](vocab)
    ckpt = out / "teacher.pt"
    if ckpt.exists():
        teacher.load_state_dict(torch.load(ckpt, weights_only=True))
    else:
        seconds = train(teacher, data["train"], 600, 2e-3, 200, "inverse_sqrt", args.seed)
        torch.save(teacher.state_dict(), out / "teacher.tmp")
        (out / "teacher.tmp").replace(ckpt)
        atomic_write_json(out / "teacher.json", {"train_s": seconds, "test_ppl": perplexity(teacher, data["test"])})
    record = json.loads((out / "teacher.json").read_text())
    if "valid_ppl" not in record:  # beside the converted models' perplexity after stage 1
        atomic_write_json(out / "teacher.json", {**record, "valid_ppl": perplexity(teacher, data["valid"])})
    teacher.eval()
    print(json.loads((out / "teacher.json").read_text()), flush=True)
    for name in args.phases:
        path = out / f"{name}.json"
        if path.exists():
            print(json.loads(path.read_text()), flush=True)
            continue
        result = phase(name, args.arch, teacher, data, args.seed)
        atomic_write_json(path, result)
        print(result, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
