"""Convert a real pretrained Llama, SmolLM2-135M-Instruct, to primal attention and measure what it keeps.

Two conversions of the 30-layer teacher (``primaldual data fetch smollm2``), each with the teacher-based
initialisation, stage 1 (layer-wise attention transfer, :func:`primaldual.convert.hf.convert_hf`) and a short
stage 2 (LM loss plus the KSVD term on the English corpus's training text, the converted layers' attention
parameters trained, everything else frozen):

* ``primal_plus``: the last 2 layers become the paper's causal primal layer (Primal.+);
* ``hybrid``: all 30 layers become the hybrid student (a 64-token RoPE window, 4 sinks, a primal branch).

Controls (``teacher_ft_last2``, ``teacher_ft_all``): the unconverted teacher given the same stage 2 on the same
layers' attention parameters and the same windows; a student is judged against these as well as against the
teacher, since stage 2 also adapts the model to the corpus.

Evaluation, the same for the teacher and each student, once at the end of each: perplexity on the English
corpus's test text (``primaldual data fetch english``; tokenised with SmolLM2's own tokenizer) over
``--eval-chunks`` consecutive chunks of ``--context`` tokens, and greedy agreement on 20 prompts (the first
``--prompt-tokens`` tokens of 20 test documents, ``--new-tokens`` generated): the share of the teacher's greedy
tokens the student also predicts when fed the teacher's continuation (teacher-forced top-1 agreement), and the
mean length of the identical free-running prefix.

Every phase writes its result, with the settings it ran with, into ``--out`` (``results.json``, atomically) and a
rerun skips the phases that are done; a killed run resumes at the phase it was in. The perplexity context must be
the same for every phase (the ratios are against the teacher's). One core by default (``--threads``)::

    python benchmarks/convert_smollm2.py --out runs/smollm2            # teacher, primal_plus, hybrid
    python benchmarks/convert_smollm2.py --out runs/smollm2 --only teacher,primal_plus

Written by hand: an experiment script around our own ``convert_hf``; the stage-2 loop is ten lines of plain
PyTorch because it trains a subset of a transformers model's parameters for a fixed token budget.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from primaldual.tasks.lm.convert_hf import perplexity, token_stream, windows  # noqa: E402
from primaldual.utils.io import atomic_write_json  # noqa: E402

PHASES = ("teacher", "primal_plus", "hybrid", "teacher_ft_last2", "teacher_ft_all")
# the controls: the unconverted teacher given the same stage 2 on the same layers' attention parameters, so that
# a student's gain from adapting to the corpus is not read as a gain from its attention
CONTROLS = {"teacher_ft_last2": (-2, -1), "teacher_ft_all": "all"}
PLANS: dict[str, dict[str, Any]] = {
    "primal_plus": {"student": "primal", "layers": (-2, -1), "options": {"s": 30, "eta": 0.1}},
    "hybrid": {"student": "hybrid", "layers": "all", "options": {"window": 64, "sinks": 4, "s": 20, "eta": 0.1}},
}


def english_text(split: str) -> str:
    from primaldual.data.cache import dataset_dir

    path = dataset_dir("english") / f"{split}.txt"
    if not path.is_file():
        raise SystemExit(f"{path} not found: run `primaldual data fetch english` first")
    return path.read_text()


def prompts(tokenizer: Any, text: str, n: int, length: int) -> list[torch.Tensor]:
    """The first ``length`` tokens of the first ``n`` documents (blank-line separated) that are long enough."""
    out = []
    for doc in text.split("\n\n"):
        ids = tokenizer(doc.strip(), add_special_tokens=False)["input_ids"]
        if len(ids) >= length:
            out.append(torch.tensor(ids[:length]))
        if len(out) == n:
            break
    return out


@torch.no_grad()
def greedy(model: Any, prompt: torch.Tensor, new: int) -> torch.Tensor:
    model.eval()
    ids = prompt[None]
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                         pad_token_id=model.config.eos_token_id)  # fmt: skip
    return out[0, len(prompt) :]


@torch.no_grad()
def agreement(student: Any, teacher_runs: list[dict[str, list[int]]], new: int) -> dict[str, float]:
    """Teacher-forced top-1 agreement with the teacher's greedy tokens, and the identical free-running prefix."""
    hits, total, prefix = 0, 0, []
    for run in teacher_runs:
        p, cont = torch.tensor(run["prompt"]), torch.tensor(run["continuation"])
        seq = torch.cat([p, cont])[None]
        pred = student(input_ids=seq, use_cache=False).logits[0, len(p) - 1 : -1].argmax(-1)
        hits += int((pred == cont).sum())
        total += len(cont)
        free = greedy(student, p, new)
        same = (free == cont[: len(free)]).long()
        prefix.append(int(same.cumprod(0).sum()))
    return {"top1_agreement": hits / total, "identical_prefix_mean": sum(prefix) / len(prefix), "prompts": len(prefix)}


def attention_modules(model: Any, layers: list[int]) -> list[torch.nn.Module]:
    """The attention module of each of ``layers``: the converted primaldual layer, or the teacher's own."""
    from primaldual.convert.hf import hf_student_layers
    from primaldual.integrations.hf import converted_layers

    if converted_layers(model):
        return hf_student_layers(model, layers)
    return [model.model.layers[i].self_attn for i in layers]


def stage2(model: Any, layers: list[int], data, steps: int, lr: float) -> list[dict[str, float]]:
    """LM loss + the KSVD term; only the attention parameters of ``layers`` train."""
    import primaldual as pd

    for p in model.parameters():
        p.requires_grad_(False)
    params = [p for layer in attention_modules(model, layers) for p in layer.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / 10) * 0.5 * (1 + math.cos(math.pi * i / steps))
    )
    model.train()
    history = []
    for step in range(1, steps + 1):
        ids, _ = next(data)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        aux = pd.collect_aux_loss(model)
        total = loss + (aux if aux is not None else 0.0)
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step == 1 or step % 10 == 0 or step == steps:
            history.append(
                {"step": step, "loss": float(loss.detach()), "ksvd": float(aux.detach()) if aux is not None else 0.0}
            )
            print(f"  stage 2 step {step}/{steps}: loss {float(loss.detach()):.4f}", flush=True)
    model.eval()
    return history


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="results folder (results.json)")
    p.add_argument("--only", default=",".join(PHASES), help=f"comma list of {PHASES}")
    p.add_argument("--context", type=int, default=512, help="tokens per window (evaluation and training)")
    p.add_argument("--eval-chunks", type=int, default=32, help="test windows for the perplexity")
    p.add_argument("--batch", type=int, default=4, help="training windows per update")
    p.add_argument("--stage1-steps", type=int, default=60)
    p.add_argument("--stage2-steps", type=int, default=40)
    p.add_argument("--lr1", type=float, default=3e-4, help="stage-1 learning rate (as the medium conversions)")
    p.add_argument("--lr2", type=float, default=1e-4, help="stage-2 learning rate")
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    phases = [s.strip() for s in args.only.split(",") if s.strip()]
    if bad := [s for s in phases if s not in PHASES]:
        p.error(f"--only: unknown {bad}; choose from {PHASES}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "only")}

    from primaldual.convert.hf import convert_hf
    from primaldual.data.smollm2 import load_smollm2

    t0 = time.perf_counter()
    teacher, tok = load_smollm2()
    print(
        f"loaded SmolLM2-135M ({sum(x.numel() for x in teacher.parameters()) / 1e6:.1f}M) in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    test = token_stream(tok, english_text("test"))
    train = token_stream(tok, english_text("train"), limit_chars=4_000_000)
    print(f"tokens: test {len(test)}, train (first 4M characters) {len(train)}", flush=True)

    if "teacher" in phases and "teacher" not in results:
        t0 = time.perf_counter()
        ppl = perplexity(teacher, test, args.context, args.eval_chunks)
        runs = []
        for pr in prompts(tok, english_text("test"), args.prompts, args.prompt_tokens):
            runs.append({"prompt": pr.tolist(), "continuation": greedy(teacher, pr, args.new_tokens).tolist()})
        results["teacher"] = {**ppl, "greedy": runs, "seconds": time.perf_counter() - t0, "settings": settings}
        atomic_write_json(path, results, indent=1)
        print(f"teacher: ppl {ppl['ppl']:.2f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    for name in (n for n in ("primal_plus", "hybrid") if n in phases and n not in results):
        if "teacher" not in results:
            raise SystemExit("the teacher phase must run first (its greedy continuations are the reference)")
        plan = PLANS[name]
        t0 = time.perf_counter()
        data = windows(train, args.batch, args.context, args.seed)
        model, report = convert_hf(teacher, plan["student"], plan["layers"], batches=data, steps=args.stage1_steps,
                                   lr=args.lr1, log_every=10, **plan["options"])  # fmt: skip
        for row in report["history"]:
            print(f"  stage 1 step {int(row['step'])}: loss {row['loss']:.4f}", flush=True)
        t1 = time.perf_counter()
        after1 = perplexity(model, test, args.context, args.eval_chunks)
        hist2 = stage2(model, report["layers"], data, args.stage2_steps, args.lr2)
        t2 = time.perf_counter()
        ppl = perplexity(model, test, args.context, args.eval_chunks)
        agree = agreement(model, results["teacher"]["greedy"], args.new_tokens)
        results[name] = {
            "plan": {**plan, "layers": report["layers"]},
            "init": report["init"],
            "stage1": report["history"],
            "ppl_after_stage1": after1["ppl"],
            "stage2": hist2,
            **ppl,
            "ppl_ratio": ppl["ppl"] / results["teacher"]["ppl"],
            **agree,
            "seconds": {"stage1": t1 - t0, "stage2": t2 - t1, "eval": time.perf_counter() - t2},
            "train_tokens": (1 + args.stage1_steps + args.stage2_steps) * args.batch * args.context,
            "settings": settings,
        }
        atomic_write_json(path, results, indent=1)
        print(f"{name}: ppl {ppl['ppl']:.2f} ({ppl['ppl'] / results['teacher']['ppl']:.3f}x the teacher), "
              f"after stage 1 {after1['ppl']:.2f}; top-1 agreement {agree['top1_agreement']:.3f}", flush=True)  # fmt: skip
    for name in (n for n in CONTROLS if n in phases and n not in results):
        import copy

        from primaldual.integrations.torch_nn import resolve_layer_indices

        t0 = time.perf_counter()
        model = copy.deepcopy(teacher)
        layers = resolve_layer_indices(CONTROLS[name], len(model.model.layers))
        data = windows(train, args.batch, args.context, args.seed)
        for _ in range(1 + args.stage1_steps):
            next(data)  # the students' stage 2 saw the windows after their calibration and stage-1 ones
        hist2 = stage2(model, layers, data, args.stage2_steps, args.lr2)
        ppl = perplexity(model, test, args.context, args.eval_chunks)
        results[name] = {"layers": layers, "stage2": hist2, **ppl, "ppl_ratio": ppl["ppl"] / results["teacher"]["ppl"],
                         "seconds": time.perf_counter() - t0, "settings": settings}  # fmt: skip
        atomic_write_json(path, results, indent=1)
        print(f"{name}: ppl {ppl['ppl']:.2f} ({ppl['ppl'] / results['teacher']['ppl']:.3f}x the teacher)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
