"""Forward+backward time of a GPT-2-small-sized model with a primal last layer, against the original, in one run.

GPT-2 small's shape (12 layers, width 768, 12 heads, vocabulary 50,257, 1,024 positions), randomly initialised
(no download). The converted model is a copy of the original whose last block's attention is replaced by
``primaldual.integrations.hf.convert(model, "primal", layers=(-1,), s=...)``; its step adds the KSVD term
(``collect_aux_loss``) to the language-model loss, as training would.

For each model: ``--warmup`` untimed passes, then ``--repeats`` timed forward+backward passes (``labels=input_ids``,
``use_cache=False``), interleaved between the two models so that load from other processes hits both alike; the
median and the minimum are reported, and the ratios primal / original of both (the minima are the
more robust on a shared machine). With CUDA the clocks are read after synchronising and the peak
allocated memory is reported too.

Run: ``python benchmarks/hf_gpt2_primal.py`` (``--tokens 1024 --batch 1 --repeats 5 --threads 2 --json out.json``).
Needs the ``hf`` extra (transformers >= 5).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time

import torch

import primaldual as pd


def _step(model: torch.nn.Module, ids: torch.Tensor, device: torch.device) -> float:
    """One timed forward+backward pass (seconds); gradients are dropped afterwards."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    loss = model(ids, labels=ids, use_cache=False).loss
    aux = pd.collect_aux_loss(model)
    if aux is not None:
        loss = loss + aux
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024, help="sequence length N")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--s", type=int, default=20, help="primal rank s of the converted layer")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()

    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    from primaldual.integrations import hf

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=max(1024, args.tokens), vocab_size=50257)
    original = GPT2LMHeadModel(config).to(device).train()
    primal = hf.convert(copy.deepcopy(original), "primal", layers=(-1,), s=args.s).train()
    ids = torch.randint(0, config.vocab_size, (args.batch, args.tokens), device=device)

    models = {"original": original, "primal_last_layer": primal}
    for _ in range(args.warmup):
        for model in models.values():
            _step(model, ids, device)
    times: dict[str, list[float]] = {name: [] for name in models}
    peak: dict[str, int | None] = dict.fromkeys(models)
    for _ in range(args.repeats):
        for name, model in models.items():
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            times[name].append(_step(model, ids, device))
            if device.type == "cuda":
                peak[name] = max(peak[name] or 0, torch.cuda.max_memory_allocated(device))
    median = {name: statistics.median(t) for name, t in times.items()}
    ratio = median["primal_last_layer"] / median["original"]
    ratio_min = min(times["primal_last_layer"]) / min(times["original"])  # robust to load from other processes

    print(f"GPT-2 small shape, batch {args.batch} x {args.tokens} tokens, forward+backward, {device}:")
    for name in models:
        mem = f", peak {peak[name] / 2**20:.0f} MiB" if peak[name] else ""
        print(f"  {name:18s} median {median[name]:.3f} s over {args.repeats} (min {min(times[name]):.3f}){mem}")
    print(f"  ratio primal_last_layer / original = {ratio:.3f} (medians), {ratio_min:.3f} (minima)")

    if args.json:
        record = {
            "benchmark": "hf_gpt2_primal",
            "settings": vars(args),
            "model": {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "converted": "last layer"},
            "median_s": median,
            "times_s": times,
            "peak_bytes": peak,
            "ratio": ratio,
            "ratio_min": ratio_min,
            "machine": {
                "platform": platform.platform(),
                "processor": platform.processor(),
                "torch_threads": torch.get_num_threads(),
                "device": str(device),
            },
            "versions": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "primaldual": pd.__version__,
            },
        }
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
