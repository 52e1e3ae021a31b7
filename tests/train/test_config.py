"""Configs: every bundled config loads and builds; unknown keys are errors naming the key; overrides."""

from __future__ import annotations

import pytest

from primaldual.data import UEA_DATASETS
from primaldual.train.cli import DEFAULT_CONFIG
from primaldual.train.config import ConfigError, list_configs, load_config


def test_every_dataset_has_three_reference_configs():
    names = set(list_configs())
    for ds in UEA_DATASETS:
        for variant in ("transformer", "primalformer", "primal_plus"):
            assert f"uea/{ds}/{variant}" in names
    assert DEFAULT_CONFIG in names


@pytest.mark.parametrize("name", [n for n in list_configs() if n.startswith("uea/")])
def test_bundled_config_is_faithful_and_builds(name):
    from primaldual.models import TimeSeriesClassifier

    cfg = load_config(name)
    m = cfg.model
    assert (m.dim, m.num_heads, m.ffn_dim, m.dropout, m.depth) == (512, 8, 2048, 0.1, 2)
    assert cfg.optim.lr == 1e-3 and cfg.data.batch_size == 16 and cfg.protocol == "heldout"
    assert cfg.optim.name == ("adam" if cfg.data.name == "SpokenArabicDigits" else "radam")
    if name != DEFAULT_CONFIG:
        assert cfg.trainer.max_epochs == (400 if cfg.data.name == "PEMS-SF" else 100)
    if name.endswith("primal_plus"):
        assert m.attention == ["softmax", "primal"]
    max_len = 29 if cfg.data.name == "JapaneseVowels" else 7
    model = TimeSeriesClassifier(
        3, 4, max_len, dim=16, num_heads=2, ffn_dim=8, attention=m.attention, attention_options=m.attention_options
    )  # the options are accepted by the layers
    assert len(model.encoder.blocks) == 2


def test_reference_primal_settings_japanese_vowels():
    pf = load_config("uea/JapaneseVowels/primalformer").model
    assert pf.attention == "primal"
    assert {k: pf.attention_options[k] for k in ("s", "eta", "rank_multi")} == {"s": 40, "eta": 0.5, "rank_multi": 5}
    pp = load_config("uea/JapaneseVowels/primal_plus").model
    assert {k: pp.attention_options[1][k] for k in ("s", "eta", "rank_multi")} == {"s": 30, "eta": 0.2, "rank_multi": 5}


# benchmarks.md, section 1: dataset -> PrimalFormer, Primal.+Trans. (s, eta, rank_multi)
UEA_PRIMAL = {
    "EthanolConcentration": ((30, 0.1, 10), (40, 0.2, 10)),
    "FaceDetection": ((20, 0.1, 5), (40, 0.2, 5)),
    "Handwriting": ((30, 0.2, 5), (20, 0.5, 5)),
    "Heartbeat": ((30, 0.5, 10), (40, 0.5, 10)),
    "JapaneseVowels": ((40, 0.5, 5), (30, 0.2, 5)),
    "PEMS-SF": ((40, 0.1, 5), (40, 0.0, 5)),
    "SelfRegulationSCP1": ((30, 0.5, 10), (30, 0.2, 10)),
    "SelfRegulationSCP2": ((20, 0.0, 10), (20, 0.2, 10)),
    "SpokenArabicDigits": ((20, 0.1, 5), (30, 0.2, 5)),
    "UWaveGestureLibrary": ((20, 0.0, 10), (40, 0.1, 10)),
}


@pytest.mark.parametrize("ds", sorted(UEA_PRIMAL))
def test_uea_primal_settings_are_the_reference(ds):
    assert set(UEA_PRIMAL) == set(UEA_DATASETS)
    pf = load_config(f"uea/{ds}/primalformer").model.attention_options
    pp = load_config(f"uea/{ds}/primal_plus").model.attention_options[1]
    for opts, want in zip((pf, pp), UEA_PRIMAL[ds]):
        assert (opts["s"], opts["eta"], opts["rank_multi"]) == want and opts["ksvd_reduction"] == "sample"
    assert pf["max_len"] == pp["max_len"]  # the dataset's longest series, written once


def test_unknown_key_in_file_names_the_key(tmp_path, tiny_config):
    path = tiny_config()
    path.write_text(path.read_text() + "optimiser: {lr: 1}\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'optimiser'"):
        load_config(path)
    path = tiny_config(**{"model.atention": "softmax"})
    with pytest.raises(ConfigError, match=r"tiny.yaml: unknown config key 'model.atention'"):
        load_config(path)


def test_overrides(tmp_path, tiny_config):
    path = tiny_config()
    cfg = load_config(path, ["--model.dim", "24", "--trainer.max_epochs=7", "--seed", "5", "--protocol", "paper"])
    assert (cfg.model.dim, cfg.trainer.max_epochs, cfg.seed, cfg.protocol) == (24, 7, 5, "paper")
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer.max_epoch'"):
        load_config(path, ["--trainer.max_epoch", "3"])
    with pytest.raises(ConfigError, match=r"unknown config key 'foo.bar'"):
        load_config(path, ["--foo.bar", "3"])
    with pytest.raises(ConfigError, match="protocol: expected one of"):
        load_config(path, ["--protocol", "best"])
    with pytest.raises(ConfigError, match="needs a value"):
        load_config(path, ["--seed"])


def test_one_flag_attention_switch_drops_old_options():
    cfg = load_config("uea/JapaneseVowels/primalformer", ["--attention", "linear"])
    assert cfg.model.attention == "linear" and cfg.model.attention_options is None
    assert cfg.name == "primalformer-linear"
    base = load_config("uea/JapaneseVowels/primalformer")
    assert cfg.fingerprint() != base.fingerprint()  # a different run directory


def test_an_override_replaces_the_plan_as_a_later_file_does():
    # --model.attention on a plan config was overwritten by the plan once expanded: silently ignored
    cfg = load_config("lra/listops/primal_plus", ["--model.attention", "softmax"])
    assert cfg.model.attention == "softmax" and cfg.name == "primal_plus"
    cfg = load_config("lra/listops/transformer", ["--model.plan", "primalformer"])
    assert cfg.model.attention == ["primal"] * cfg.model.depth
    opts = load_config("uea/JapaneseVowels/primalformer", ["--model.attention_options.s", "7"]).model.attention_options
    assert opts["s"] == 7  # a key inside a mapping value
    with pytest.raises(ConfigError, match=r"--model.dropout.p: model.dropout is not a mapping here"):
        load_config("uea/JapaneseVowels/primalformer", ["--model.dropout.p", "0.1"])
    # switching plans drops the old plan's own keys; a null plan key is not given
    assert load_config("lra/listops/primal_plus", ["--model.plan", "primalformer"]).model.attention == ["primal"] * 2
    cfg = load_config("lra/listops/primalformer", ["--model.plan", "primal_plus", "--model.base", "null"])
    assert cfg.model.attention == ["softmax", "primal"]
    # a whole section merges key by key, as a file does
    optim = load_config("lra/listops/primal_plus", ["--optim", "{lr: 0.0001}"]).optim
    assert optim.lr == 1e-4 and optim.name == load_config("lra/listops/primal_plus").optim.name
    for args, message in (
        (["--model", "null"], "--model: a section; expected a mapping"),
        (["--model.attention_options", "{s: 5}"], "this config sets model.plan"),  # every layer would turn primal
        (["--model.primal_options.s", "9", "--model.attention", "softmax"], "--model.attention undoes"),
        (["--attention", "softmax", "--model.plan", "primalformer"], "--model.plan undoes --model.attention"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config("lra/listops/primal_plus", args)
    with pytest.raises(ConfigError, match="undoes --model.attention_options.s"):
        load_config("uea/JapaneseVowels/primalformer", ["--model.attention_options.s", "3", "--attention", "primal"])


def test_help_lists_attentions_and_configs(capsys):
    from primaldual.cli import main

    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = capsys.readouterr().out
    assert "attentions:" in out and "primal" in out and "softmax" in out
    assert "uea/JapaneseVowels/primalformer" in out


def test_cli_reports_bad_keys_and_missing_data_in_one_line(capsys, tmp_path):
    from primaldual.cli import main

    assert main(["fit", "--config", "uea/JapaneseVowels/primalformer", "--model.atention", "x"]) == 2
    assert "unknown config key 'model.atention'" in capsys.readouterr().err
    assert main(["fit", "--config", "uea/Heartbeat/primalformer", "--data.root", str(tmp_path)]) == 2
    assert "timeseriesclassification.com" in capsys.readouterr().err


def test_max_epochs_of_a_step_based_run_is_an_error_not_ignored():
    # a vision run given --trainer.max_epochs 2 used to go on for its 4,290 configured steps
    with pytest.raises(ConfigError, match=r"trainer.max_epochs: a step-based run stops at trainer.max_steps \(4290\)"):
        load_config("vision/fashion_mnist/reduced/primal_plus", ["--trainer.max_epochs", "2"])
    assert load_config("vision/fashion_mnist/reduced/primal_plus", ["--trainer.max_epochs", "-1"]).trainer.max_steps
