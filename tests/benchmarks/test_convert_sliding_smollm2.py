"""benchmarks/convert_sliding_smollm2.py's model swap on a tiny Llama: the Mistral layout without a window is the
Llama itself, and with one its layers slide (the script itself needs SmolLM2's weights)."""

from __future__ import annotations

import pytest
import torch

from tests.integrations.tiny_models import tiny

from .scripts import load_script

pytest.importorskip("transformers")


def test_the_mistral_layout_of_a_llama_is_the_llama():
    bench = load_script("convert_sliding_smollm2")
    llama = tiny("llama", tie_word_embeddings=False)
    ids = torch.randint(2, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = llama(ids).logits
        torch.testing.assert_close(bench.mistral_of(llama, None)(ids).logits, ref, rtol=0, atol=0)
        windowed = bench.mistral_of(llama, 4)
        assert windowed.config.sliding_window == 4
        assert (windowed(ids).logits - ref).abs().max() > 1e-4  # the window bites beyond 4 tokens
    assert bench.perplexity(llama, ids) > 1


def test_bad_arguments_are_refused(capsys):
    bench = load_script("convert_sliding_smollm2")
    with pytest.raises(SystemExit):
        bench.main(["--window", "0"])
    assert "--window must be >= 1" in capsys.readouterr().err
