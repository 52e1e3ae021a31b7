"""primaldual.integrations.hf.compat: the one module that touches transformers internals.

The cache keyword is resolved from the replaced forward's signature at convert() time (an unknown one is an error,
never a silent ignore), the installed transformers is checked against the tested range (the same range as the
extras in pyproject.toml), and a private output collector that cannot be read raises.
"""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from .tiny_models import tiny, token_batch

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("primaldual.integrations.hf")
compat = pytest.importorskip("primaldual.integrations.hf.compat")

from transformers.cache_utils import Cache, DynamicCache  # noqa: E402
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention  # noqa: E402

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
RANGE = re.escape(compat.TRANSFORMERS_RANGE)
INSTALLED_KEYWORD = "cache" if "cache" in inspect.signature(GPT2Attention.forward).parameters else "past_key_values"


class KVStoreGPT2Attention(GPT2Attention):
    """GPT-2's attention with its cache parameter renamed to one primaldual does not know."""

    def forward(self, hidden_states, kv_store: Cache | None = None, attention_mask=None, **kwargs):
        return super().forward(hidden_states, attention_mask=attention_mask, **{compat.CACHE_KEYWORDS[0]: kv_store})


class NoCacheGPT2Attention(GPT2Attention):
    """A causal attention whose forward takes no cache at all."""

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        return super().forward(hidden_states, attention_mask=attention_mask)


class PastKeyValuesGPT2Attention(GPT2Attention):
    """GPT-2's attention with the other known cache keyword (``past_key_values``, as before transformers 5.24)."""

    def forward(self, hidden_states, past_key_values: Cache | None = None, attention_mask=None, **kwargs):
        return super().forward(
            hidden_states, attention_mask=attention_mask, **{compat.CACHE_KEYWORDS[0]: past_key_values}
        )


def _gpt2_with(attention_class: type) -> torch.nn.Module:
    """A tiny GPT-2 whose last block's attention is an ``attention_class`` with the same weights."""
    model = tiny("gpt2")
    block = model.transformer.h[-1]
    swapped = attention_class(model.config, layer_idx=block.attn.layer_idx)
    swapped.load_state_dict(block.attn.state_dict())
    block.attn = swapped.eval()
    return model


# ------------------------------------------------------------------------------------------ cache keyword
def test_an_unknown_cache_keyword_is_an_error_at_convert_not_a_silent_ignore():
    model = _gpt2_with(KVStoreGPT2Attention)
    with pytest.raises(hf.CacheKeywordError) as err:
        hf.convert(model, "primal", -1, s=4)
    message = str(err.value)
    for part in ("KVStoreGPT2Attention", "kv_store", "attention_mask", "'cache'", "'past_key_values'"):
        assert part in message, (part, message)
    assert isinstance(err.value, ValueError)
    assert not hf.converted_layers(model)  # nothing was touched
    hf.convert(model, "primal", 0, s=4)  # the unchanged first block still converts


def test_a_causal_attention_without_a_cache_keyword_is_an_error():
    with pytest.raises(hf.CacheKeywordError, match=r"NoCacheGPT2Attention\.forward .*is causal but takes none"):
        hf.convert(_gpt2_with(NoCacheGPT2Attention), "softmax", -1)


def test_a_known_keyword_is_resolved_and_only_that_one_is_read():
    model = _gpt2_with(PastKeyValuesGPT2Attention)
    hf.convert(model, "primal", -1, s=4)
    layer = model.transformer.h[-1].attn
    assert layer.cache_keyword == "past_key_values" and "cache_keyword='past_key_values'" in repr(layer)
    x = torch.randn(2, 6, model.config.n_embd)  # (B, N, C)
    with torch.no_grad():
        full, _ = layer(x)
        cache = DynamicCache()
        head, _ = layer(x[:, :4], past_key_values=cache)
        tail, _ = layer(x[:, 4:], past_key_values=cache)
        torch.testing.assert_close(torch.cat([head, tail], 1), full, rtol=1e-5, atol=1e-6)
        with pytest.raises(TypeError, match=r"cache keyword 'past_key_values'.*\['cache'\]"):
            layer(x, cache=DynamicCache())


@pytest.mark.parametrize("name", ["gpt2", "bert", "roberta", "vit", "dt"])
def test_the_supported_models_resolve_their_cache_keyword(name):
    model = hf.convert(tiny(name), "softmax", "all")
    keywords = {m.cache_keyword for m in hf.converted_layers(model).values()}
    # ViT's attention takes no cache; the others take the keyword of the installed release
    assert keywords == {None if name == "vit" else INSTALLED_KEYWORD}


def test_converted_cached_generation_equals_full_forwards():
    model = hf.convert(tiny("gpt2"), "primal", "all", s=4)
    ids, _ = token_batch(pad_from=None, length=5)
    seq = ids
    with torch.no_grad():
        for _ in range(4):
            seq = torch.cat([seq, model(seq, use_cache=False).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(model.generate(ids, max_new_tokens=4, do_sample=False), seq)


# ------------------------------------------------------------------------------------------ version range
def test_the_range_in_code_is_the_range_of_the_extras_in_pyproject():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    for extra in ("hf", "test"):
        pins = [req for req in extras[extra] if re.match(r"transformers\b", req)]
        assert pins == [f"transformers{compat.TRANSFORMERS_RANGE}"], (extra, pins)


def test_the_installed_release_is_in_the_range():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compat.check_transformers_version()


@pytest.mark.parametrize("version", ["5.8.1", "5.0.0", "4.57.1", "3.5.1"])
def test_a_release_below_the_range_is_an_import_error(monkeypatch, version):
    monkeypatch.setattr(compat, "installed_transformers_version", lambda: version)
    with pytest.raises(ImportError, match=rf"needs transformers{RANGE}, but transformers {re.escape(version)} is"):
        compat.check_transformers_version()


@pytest.mark.parametrize("version", ["5.25.0", "5.25.0.dev0", "6.1.2"])
def test_a_release_above_the_range_warns(monkeypatch, version):
    monkeypatch.setattr(compat, "installed_transformers_version", lambda: version)
    with pytest.warns(
        compat.UntestedTransformersWarning, match=rf"transformers {re.escape(version)} is newer than .*{RANGE}"
    ):
        compat.check_transformers_version()
    assert issubclass(hf.UntestedTransformersWarning, UserWarning)


@pytest.mark.parametrize("version", ["5.9.0", "5.9.0rc1", "5.24.3"])
def test_a_release_in_the_range_passes_silently(version):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compat.check_transformers_version(version)


def test_the_check_runs_at_import_of_the_package():
    code = """
import json, sys, warnings
import transformers
found = {}
transformers.__version__ = "4.57.1"
try:
    import primaldual.integrations.hf
except ImportError as err:
    found["below"] = str(err)
for name in [m for m in sys.modules if m.startswith("primaldual.integrations.hf")]:
    del sys.modules[name]
sys.modules["transformers"].__version__ = "5.99.0"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import primaldual.integrations.hf
found["above"] = [(w.category.__name__, str(w.message)) for w in caught if "transformers" in str(w.message)]
print(json.dumps(found))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    found = json.loads(out.strip().splitlines()[-1])
    assert "4.57.1" in found["below"] and compat.TRANSFORMERS_RANGE in found["below"]
    assert [name for name, _ in found["above"]] == ["UntestedTransformersWarning"]
    assert "5.99.0" in found["above"][0][1] and compat.TRANSFORMERS_RANGE in found["above"][0][1]


# ------------------------------------------------------------------------------------------ output collector
def test_an_unreadable_output_collector_raises_instead_of_meaning_not_requested(monkeypatch):
    from primaldual.integrations.hf.masks import attentions_requested, record_attentions

    capturing = pytest.importorskip("transformers.utils.output_capturing")
    monkeypatch.delattr(capturing, "_active_collector")  # as if transformers had renamed it
    with pytest.raises(RuntimeError, match=r"output_capturing\._active_collector.*transformers"):
        attentions_requested({})
    with pytest.raises(RuntimeError, match="output collector"):
        record_attentions(torch.zeros(1, 1, 2, 2))


def test_an_output_collector_of_another_type_raises(monkeypatch):
    from primaldual.integrations.hf.masks import attentions_requested

    capturing = pytest.importorskip("transformers.utils.output_capturing")

    class Odd:
        def get(self) -> list:
            return []

    monkeypatch.setattr(capturing, "_active_collector", Odd())
    with pytest.raises(TypeError, match="output collector holds a list; expected None or a dict"):
        attentions_requested({})
    assert attentions_requested({"output_attentions": True})  # an explicit flag needs no collector


def test_a_missing_output_capturing_module_is_an_import_error_in_the_tested_release(monkeypatch):
    utils = sys.modules["transformers.utils"]
    monkeypatch.delattr(utils, "output_capturing", raising=False)
    monkeypatch.setitem(sys.modules, "transformers.utils.output_capturing", None)  # `import` raises ImportError
    monkeypatch.setattr(compat, "installed_transformers_version", lambda: "5.24.0")  # whichever is installed
    with pytest.raises(ImportError, match="has no transformers.utils.output_capturing"):
        compat._load_output_capturing()
    monkeypatch.setattr(
        compat, "installed_transformers_version", lambda: "5.9.0"
    )  # older releases pass output_attentions down
    assert compat._load_output_capturing() is None
