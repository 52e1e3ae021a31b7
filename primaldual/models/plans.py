"""PrimalFormer and Primal.+ as per-layer attention plans for :class:`primaldual.Encoder` and task models.

* **PrimalFormer**: every attention layer is Primal-Attention, with the KSVD loss;
* **Primal.+X** (Primal.+Trans., Primal.+DeiT, Primal.+DT): baseline X with only the last attention layer
  primal (generalised here: any chosen set of layers), with the KSVD loss on those layers.

A plan is a dict ``{"attention": [names], "attention_options": [dicts or None]}`` of ``depth`` entries, so
``Encoder(dim, depth, heads, **primalformer(depth, s=20, eta=0.1))`` builds the model and every task model
that takes ``attention`` / ``attention_options`` takes a plan the same way. The KSVD term is then
``primaldual.collect_aux_loss(model)`` = ``eta * mean over the primal layers of J_l^2``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..attention.registry import attention_options
from ..utils.errors import ConfigError, yaml_hint

__all__ = ["PLAN_KEYS", "check_plan", "expand_plan", "primal_plus", "primalformer"]

#: a config's ``model.plan`` and the keys that go with it (alternatives to ``attention`` / ``attention_options``)
PLAN_KEYS = ("plan", "primal_options", "base", "base_options", "primal_layers")


def _check_primal_options(opts: dict[str, Any]) -> dict[str, Any]:
    valid = attention_options("primal")
    unknown = sorted(set(opts) - set(valid))
    if unknown:
        raise TypeError(f"unknown primal option(s) {unknown}; valid options: {', '.join(sorted(valid))}")
    return dict(opts)


def primalformer(depth: int, **primal_options: Any) -> dict[str, list]:
    """Every layer primal.

    Args:
        depth: number of attention layers.
        **primal_options: options of the ``primal`` attention (``s``, ``rank_multi``, ``eta``, ``max_len``, ...).

    Returns:
        ``{"attention": ["primal"] * depth, "attention_options": [options] * depth}``.
    """
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive int, got {depth!r}")
    opts = _check_primal_options(primal_options)
    return {"attention": ["primal"] * depth, "attention_options": [dict(opts) for _ in range(depth)]}


def primal_plus(
    depth: int,
    base: str = "softmax",
    primal_layers: Iterable[int] = (-1,),
    base_options: dict[str, Any] | None = None,
    **primal_options: Any,
) -> dict[str, list]:
    """The baseline ``base`` with the layers in ``primal_layers`` replaced by Primal-Attention.

    Args:
        depth: number of attention layers.
        base: registry name of the baseline attention (``"softmax"`` for Primal.+Trans.).
        primal_layers: indices of the primal layers (negative counts from the end; default the last one).
        base_options: options of the baseline layers.
        **primal_options: options of the primal layers.

    Returns:
        ``{"attention": [...], "attention_options": [...]}`` of ``depth`` entries.
    """
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive int, got {depth!r}")
    attention_options(base)  # unknown base -> KeyError listing the registered names
    chosen = set()
    for i in primal_layers:
        if not isinstance(i, int) or not -depth <= i < depth:
            raise ValueError(f"primal_layers entries must be ints in [-{depth}, {depth}), got {i!r}")
        chosen.add(i % depth)
    if not chosen:
        raise ValueError("primal_layers is empty: use the baseline itself, or primalformer() for all layers")
    opts = _check_primal_options(primal_options)
    names = ["primal" if i in chosen else base for i in range(depth)]
    options = [dict(opts) if i in chosen else (dict(base_options) if base_options else None) for i in range(depth)]
    return {"attention": names, "attention_options": options}


def expand_plan(model: dict[str, Any], depth: int) -> None:
    """A config's ``model`` section (a dict, in place): ``plan`` (+ ``primal_options``, ``base``, ``base_options``,
    ``primal_layers``) -> ``attention`` / ``attention_options`` lists of ``depth`` (the section's, or ``depth``)."""
    plan = model.pop("plan", None)
    opts = {k: v for k in PLAN_KEYS[1:] if k in model and (v := model.pop(k)) is not None}  # null: not given
    if plan is None:
        if opts:
            raise ConfigError(f"model.{next(iter(opts))}: only used with model.plan (primalformer or primal_plus)")
        return
    presets = {"primalformer": primalformer, "primal_plus": primal_plus}
    if plan not in presets:
        raise ConfigError(f"model.plan: expected one of {sorted(presets)}, got {plan!r}")
    primal = opts.pop("primal_options", None) or {}
    if not isinstance(primal, dict):
        raise ConfigError(f"model.primal_options: expected a mapping of primal options, got {primal!r}")
    if plan == "primalformer" and opts:
        raise ConfigError(f"model.{next(iter(opts))}: not an option of plan 'primalformer' (every layer is primal)")
    try:
        model.update(presets[plan](model.get("depth", depth), **opts, **primal))
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(f"model.plan {plan!r}: {e}") from None


def check_plan(attention: Any, options: Any, depth: int, dim: int, num_heads: int, causal: bool = False) -> None:
    """A config's ``model.attention`` / ``model.attention_options``: every layer's name and options, checked against
    the registry and by building the layer on the ``meta`` device (no memory; ``causal``: as a language model's
    layer); a :class:`~primaldual.utils.errors.ConfigError` names the first bad entry."""
    from ..attention.registry import build_attention, list_attentions

    registered = [i.name for i in list_attentions()]
    per_layer = isinstance(attention, list | tuple)
    names = list(attention) if per_layer else [attention] * depth
    if per_layer and len(names) != depth:
        raise ConfigError(f"model.attention: {len(names)} entries, but model.depth is {depth}")
    opts_per_layer = isinstance(options, list | tuple)
    if opts_per_layer and len(options) != depth:
        raise ConfigError(f"model.attention_options: {len(options)} entries, but model.depth is {depth}")
    if not opts_per_layer and not (options is None or isinstance(options, dict)):
        raise ConfigError(
            f"model.attention_options: expected a mapping, or one mapping (or null) per layer, got {options!r}"
        )
    built: set[str] = set()
    for i, (name, opts) in enumerate(zip(names, options if opts_per_layer else [options] * depth)):
        at = f"model.attention[{i}]" if per_layer else "model.attention"
        ot = f"model.attention_options[{i}]" if opts_per_layer else "model.attention_options"
        if not isinstance(name, str) or name not in registered:
            raise ConfigError(f"{at}: unknown attention {name!r}; registered attentions: {', '.join(registered)}")
        if opts is not None and not isinstance(opts, dict):
            raise ConfigError(f"{ot}: expected a mapping of {name!r} options or null, got {opts!r}")
        opts = dict(opts or {})
        valid = attention_options(name)
        if unknown := [k for k in opts if k not in valid]:
            raise ConfigError(
                f"{ot}: unknown option {unknown[0]!r} for attention {name!r}{yaml_hint(unknown[0])}; valid options: "
                f"{', '.join(sorted(valid))}"
            )
        if causal and "causal" in opts:
            raise ConfigError(f"{ot}: leave out 'causal'; every layer of the language model is causal")
        if "head_dim" not in opts and dim % num_heads:
            raise ConfigError(f"model.num_heads: {num_heads} heads do not divide model.dim {dim}")
        key = repr((name, sorted(opts.items(), key=lambda kv: kv[0])))
        if key in built:
            continue
        built.add(key)
        try:
            build_attention(
                name, dim, num_heads, device="meta", dtype=None, **opts, **({"causal": True} if causal else {})
            )
        except (TypeError, ValueError, KeyError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args and isinstance(e.args[0], str) else str(e)
            raise ConfigError(f"{ot} ({name}): {msg}") from None
