"""Sliding-window conversion on real weights: SmolLM2-135M-Instruct in Mistral's layout with a sliding window.

No sliding-window model's weights can be fetched by primaldual (``docs/data.md``), but Mistral's attention, MLP and
norms are Llama's: SmolLM2's weights (``primaldual data fetch smollm2``) load into a ``MistralForCausalLM`` with all
keys matched, and with ``sliding_window=None`` it gives SmolLM2's logits exactly. With ``--window W`` every layer of
that model slides a window of ``W`` keys (a model SmolLM2 was not trained as, so its perplexity is higher; what is
checked is the conversion, not the model). The script prints, for the English corpus's test text
(``primaldual data fetch english``):

* the perplexity of SmolLM2, and of the same weights with the window, on ``--chunks`` chunks of ``--context`` tokens;
* the ``window`` student (``window=W, sinks=0``) in all layers, which keeps the window exactly: its largest logit
  difference from the teacher, and whether its greedy generation from two prompts (one left-padded) is the
  teacher's;
* three layers converted the same way, the others left on transformers' sliding-window cache: the same generation;
* the teacher check of :func:`primaldual.convert.hf.convert_hf` (each sliding layer rebuilt as sparse softmax on its
  window) for hybrid students in three layers: the rebuild errors.

::

    python benchmarks/convert_sliding_smollm2.py --window 64

Written by hand: a check script around our own ``convert_hf``; nothing to train.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from primaldual.data.cache import dataset_dir  # noqa: E402


def mistral_of(llama: torch.nn.Module, window: int | None) -> torch.nn.Module:
    """``llama`` (a ``LlamaForCausalLM``) as a ``MistralForCausalLM`` with ``sliding_window=window``: the same weights,
    every key matched."""
    import transformers

    c = llama.config
    cfg = transformers.MistralConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        head_dim=c.hidden_size // c.num_attention_heads,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        rope_parameters=c.rope_parameters,
        tie_word_embeddings=c.tie_word_embeddings,
        bos_token_id=c.bos_token_id,
        eos_token_id=c.eos_token_id,
        pad_token_id=c.pad_token_id,
        sliding_window=window,
    )
    model = transformers.MistralForCausalLM(cfg).eval()
    model.load_state_dict(llama.state_dict(), strict=True)
    return model


def perplexity(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """Next-token perplexity of ``model`` on ``ids`` ``(B, N)``."""
    with torch.no_grad():
        logits = model(ids).logits[:, :-1]  # (B, N-1, V)
    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).exp())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--window", type=int, default=64, help="the sliding window, in keys (default 64)")
    p.add_argument("--context", type=int, default=256, help="tokens per chunk (default 256)")
    p.add_argument("--chunks", type=int, default=4, help="chunks of the test text (default 4)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    for name in ("window", "context", "chunks", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    torch.set_num_threads(args.threads)
    from primaldual.convert.hf import convert_hf
    from primaldual.data.smollm2 import load_smollm2
    from primaldual.integrations import hf

    t0 = time.perf_counter()
    llama, tok = load_smollm2()
    path = dataset_dir("english") / "test.txt"
    if not path.is_file():
        p.error(f"{path} not found: run `primaldual data fetch english` first")
    n = args.chunks * args.context
    ids = tok(path.read_text()[: 40 * n], return_tensors="pt").input_ids[:, :n]
    if ids.shape[1] < n:
        p.error(f"the test text gave {ids.shape[1]} tokens, fewer than --chunks x --context = {n}")
    ids = ids.view(args.chunks, args.context)  # (chunks, context)
    W = args.window
    full, teacher = mistral_of(llama, None), mistral_of(llama, W)
    with torch.no_grad():
        same = (full(ids).logits - llama(ids).logits).abs().max().item()
        logits = teacher(ids).logits
    print(f"Mistral layout without a window vs SmolLM2: max |logit difference| {same:.1e}")
    print(f"perplexity: SmolLM2 {perplexity(llama, ids):.2f}, with a {W}-key window {perplexity(teacher, ids):.2f}")

    calibration = [(ids, None)]
    student, _ = convert_hf(teacher, "window", "all", batches=iter(calibration), window=W, sinks=0)
    with torch.no_grad():
        gap = (student(ids).logits - logits).abs().max().item()
    print(f"window student in all {len(teacher.model.layers)} layers: max |logit difference| {gap:.1e}")
    prompt = ids[:2, :100]
    mask = torch.ones_like(prompt)
    mask[1, :20] = 0  # the second prompt left-padded
    kw = {"attention_mask": mask, "max_new_tokens": 40, "do_sample": False, "pad_token_id": tok.pad_token_id or 0}
    reference = teacher.generate(prompt, **kw)
    print(f"  generates the teacher's 40 tokens: {torch.equal(student.generate(prompt, **kw), reference)}")
    last = len(teacher.model.layers) - 1
    some = [0, last // 4, last]
    part = hf.convert(copy.deepcopy(teacher), "hybrid", some, window=W, sinks=0, primal_branch=False)
    print(
        f"layers {some} converted, the rest on the sliding cache: {torch.equal(part.generate(prompt, **kw), reference)}"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the hybrid's branch sees past the window: said, and expected here
        _, report = convert_hf(teacher, "hybrid", some, batches=iter(calibration), window=W, sinks=0, s=20)
    errors = ", ".join(f"{report['init'][i]['rebuild_error']:.1e}" for i in some)
    print(f"teacher check (hybrid students, layers {some}): rebuild errors {errors}")
    print(f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
