"""Configs by composition on OmegaConf: every name loads to exactly the frozen RunConfig (so the same run
directory), the shipped configs are found from any directory and a user's folder overrides them, fragments are not
configs, and bad files fail with errors naming the file and key."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from primaldual.tasks.base import exclusive_keys
from primaldual.train.compose import PACKAGE_CONFIGS
from primaldual.train.config import (
    ConfigError,
    describe_config,
    dump_config,
    list_configs,
    load_config,
)
from primaldual.train.schema import config_class

DATA = Path(__file__).resolve().parent / "data"
# written by data/freeze_configs.py with the code of abb5f8c (the hand-written engine, before OmegaConf): every name
# listed then, its RunConfig, fingerprint (the run directory) and the SHA-256 of its config.yaml text. The hashes
# were rewritten when data.tokenisation / stand_in / train_pairs / eval_pairs / val_size and model.pooling /
# positions / tie_embeddings became task-exclusive, and when model.init became an LM key too (config.yaml lists a
# key for the tasks that read it only), and when tasks came to own their keys (Task.config: a task's keys follow
# the common ones in config.yaml), and trainer.logger / compile_mode are recorded at their defaults; every fingerprint
# stayed, and an older config.yaml resumes
# (tests/train/test_rundir.py)
FROZEN = json.loads((DATA / "frozen_configs.json").read_text())


def test_list_configs_is_the_frozen_set_without_fragments():
    names = list_configs()
    assert names == sorted(FROZEN) and len(names) == 195
    assert not [n for n in names if any(part.startswith("_") for part in n.split("/"))]
    assert list_configs("uea/JapaneseVowels/") == [
        f"uea/JapaneseVowels/{m}" for m in ("primal_plus", "primalformer", "transformer")
    ]


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_composed_config_equals_the_frozen_one(name):
    cfg = load_config(name)
    want, have = json.loads(json.dumps(FROZEN[name]["config"])), cfg.to_dict()
    # since tasks own their keys and sections (Task.config), a config has only its task's; frozen, every other one
    # was at its owner's default there
    for (section, key), owners in exclusive_keys().items():
        default = config_class(sorted(owners)[0])().to_dict()[section]
        if key is None and section not in have:
            assert want.pop(section) == default, section
        elif key is not None and key not in have.get(section, {key: None}):
            assert want[section].pop(key) == default[key], f"{section}.{key}"
    # JSON text, not dict equality: 0 and 0.0 (or 1 and True) would compare equal but hash differently
    assert json.dumps(cfg.to_dict(), sort_keys=True) == json.dumps(want, sort_keys=True)
    assert cfg.fingerprint() == FROZEN[name]["fingerprint"]  # the run directory is unchanged: old runs resume
    assert hashlib.sha256(dump_config(cfg).encode()).hexdigest() == FROZEN[name]["yaml_sha256"]


def test_the_shipped_configs_are_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert PACKAGE_CONFIGS.parent.name == "primaldual"  # inside the package: shipped in the wheel
    assert load_config("uea/default").trainer.max_epochs == 30
    assert len(list_configs()) == 195


def test_a_users_folder_overrides_and_extends_the_shipped_configs(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    (mine / "lra" / "_models").mkdir(parents=True)
    (mine / "lra" / "_models" / "mymodel.yaml").write_text("model: {attention: linear, attention_options: null}\n")
    (mine / "uea").mkdir()
    (mine / "uea" / "default.yaml").write_text("defaults: [uea/JapaneseVowels/transformer]\nname: quick\n")
    assert "lra/image/mymodel" not in list_configs()
    assert "lra/image/mymodel" in list_configs(config_dir=mine)  # one file composes with the shipped base and tasks
    cfg = load_config("lra/listops/reduced/mymodel", config_dir=mine)
    assert cfg.model.attention == "linear" and cfg.data.max_len == 2000
    assert describe_config("lra/image/mymodel", config_dir=mine)[2] == "lra/_models/mymodel.yaml"
    assert load_config("uea/default", config_dir=mine).name == "quick"  # the user's file wins over the shipped one
    # ./configs is searched too, after --config-dir
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "uea").mkdir()
    (tmp_path / "configs" / "uea" / "default.yaml").write_text("defaults: [uea/JapaneseVowels/transformer]\n")
    assert load_config("uea/default").name == "default"
    assert load_config("uea/default", config_dir=mine).name == "quick"
    with pytest.raises(ConfigError, match="--config-dir: .* is not a directory"):
        load_config("uea/default", config_dir=tmp_path / "nope")


def test_an_empty_or_comment_only_file_is_not_a_config(tmp_path):
    # an empty YAML would otherwise start a full default run (width 512, 100 epochs)
    for text in ("", "# nothing here\n"):
        (tmp_path / "empty.yaml").write_text(text)
        with pytest.raises(ConfigError, match="empty.yaml: empty"):
            load_config(tmp_path / "empty.yaml")


def test_describe_config_lists_the_files_in_merge_order():
    assert describe_config("lra/listops/reduced/primal_plus") == [
        "lra/_base.yaml",
        "lra/_tasks/listops.yaml",
        "lra/_models/primal_plus.yaml",
        "lra/_budgets/reduced.yaml",
        "lra/_tasks/listops.yaml (models.primal_plus)",
        "lra/_tasks/listops.yaml (budgets.reduced)",
    ]
    assert describe_config("uea/default")[-1] == "uea/default.yaml"
    assert describe_config("uea/Heartbeat/transformer") == [
        "uea/_base.yaml",
        "uea/_tasks/Heartbeat.yaml",
        "uea/_models/transformer.yaml",
    ]


@pytest.mark.parametrize("spec", ["lra/_models/linear", "uea/_base", "lra/_tasks/listops", "uea/_tasks/Heartbeat"])
def test_a_fragment_is_not_a_config(spec):
    with pytest.raises(ConfigError, match="is a fragment"):
        load_config(spec)
    with pytest.raises(ConfigError, match="is a fragment"):
        load_config(PACKAGE_CONFIGS / f"{spec}.yaml")


def test_unknown_name_lists_the_parts():
    with pytest.raises(ConfigError, match=r"not found .*tasks \['image', 'listops'.*models \['linear', 'linear_bn'"):
        load_config("lra/listop/primal_plus")
    with pytest.raises(ConfigError, match=r"not found .*models \['primal_plus', 'primalformer', 'transformer'\]"):
        load_config("uea/Heartbeat/primal")


def test_user_file_builds_on_a_composed_name(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("defaults: [lra/listops/primalformer]\nvars: {primal: {s: 12}}\noptim: {lr: 0.01}\n")
    cfg = load_config(path)
    assert cfg.name == "mine"  # a file's run name is its stem, as before
    assert [o["s"] for o in cfg.model.attention_options] == [12, 12] and cfg.optim.lr == 0.01
    assert cfg.model.attention_options[0]["eta"] == 0.1 and cfg.data.max_len == 2048
    # a plan and explicit attention replace each other, whichever comes later wins
    path.write_text("defaults: [lra/listops/primalformer]\nmodel: {attention: linear, attention_options: null}\n")
    assert load_config(path).model.attention == "linear"
    path.write_text("defaults: [lra/listops/transformer]\nmodel: {plan: primal_plus, primal_options: {s: 8}}\n")
    m = load_config(path).model
    assert m.attention == ["softmax", "primal"] and m.attention_options == [None, {"s": 8}]
    path.write_text("defaults: [lra/listops/transformer]\nmodel: {plan: primalformer, base: linear}\n")
    with pytest.raises(ConfigError, match=r"model.base: not an option of plan 'primalformer'"):
        load_config(path)


def test_defaults_cycle_and_missing_entry_and_bad_yaml(tmp_path):
    (tmp_path / "a.yaml").write_text("defaults: [b.yaml]\nseed: 1\n")
    (tmp_path / "b.yaml").write_text("defaults: [a.yaml]\n")
    with pytest.raises(ConfigError, match=r"defaults cycle: .*a.yaml -> .*b.yaml -> .*a.yaml"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("defaults: [lra/listops/nothing]\n")
    with pytest.raises(ConfigError, match=r"b.yaml: defaults entry 'lra/listops/nothing' not found"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("seed: [1\n")
    with pytest.raises(ConfigError, match=r"b.yaml: not valid YAML"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("defaults: lra/listops/transformer\n")
    with pytest.raises(ConfigError, match=r"b.yaml: defaults: expected a list"):
        load_config(tmp_path / "a.yaml")


def test_references(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("defaults: [lra/image/transformer]\nschedule: {warmup_steps: '${trainer.max_step}'}\n")
    with pytest.raises(ConfigError, match=r"schedule.warmup_steps: Interpolation key 'trainer.max_step' not found"):
        load_config(path)
    path.write_text("defaults: [lra/image/transformer]\nvars: {a: '${vars.b}', b: '${vars.a}'}\n")
    with pytest.raises(ConfigError, match="vars.a: Recursive interpolation detected"):
        load_config(path)


@pytest.fixture
def configs(tmp_path, monkeypatch) -> Path:
    """A writable copy of the shipped configs in ./configs, which load_config searches first."""
    root = tmp_path / "configs"
    shutil.copytree(PACKAGE_CONFIGS, root)
    monkeypatch.chdir(tmp_path)
    return root


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_unknown_keys_in_fragments_name_the_file_and_key(configs):
    task = configs / "lra" / "_tasks" / "listops.yaml"
    _edit(task, "primalformer: {vars:", "primalformer: {model: {atention: x}, vars:")
    with pytest.raises(
        ConfigError, match=r"_tasks/listops.yaml: unknown config key 'models.primalformer.model.atention'"
    ):
        load_config("lra/listops/primalformer")
    _edit(task, "primalformer: {model: {atention: x}, vars:", "primalformr: {vars:")
    with pytest.raises(ConfigError, match=r"_tasks/listops.yaml: models: unknown model 'primalformr'"):
        load_config("lra/listops/transformer")
    _edit(configs / "lra" / "_models" / "linear.yaml", "model: {attention: linear,", "modle: {attention: linear,")
    with pytest.raises(ConfigError, match=r"lra/_models/linear.yaml: unknown config key 'modle'"):
        load_config("lra/image/linear")
    _edit(configs / "lra" / "_budgets" / "reduced.yaml", "optim:", "name: x\noptim:")
    with pytest.raises(ConfigError, match=r"_budgets/reduced.yaml: unknown config key 'name' \(a fragment cannot"):
        load_config("lra/image/reduced/transformer")


def test_a_value_left_unset_is_an_error(configs):
    _edit(configs / "lra" / "_tasks" / "image.yaml", "primalformer: {vars: {primal: {s: 30, eta: 0.1}}}", "")
    with pytest.raises(ConfigError, match=r"lra/image/primalformer .*model.primal_options.s: no value given"):
        load_config("lra/image/primalformer")
    load_config("lra/image/transformer")  # unused ??? in vars is fine


def test_a_new_dataset_is_one_file(configs):
    (configs / "uea" / "_tasks" / "NewSeries.yaml").write_text(
        "data: {name: NewSeries}\nvars: {primal: {rank_multi: 5, max_len: 50}}\n"
        "models:\n  primalformer: {vars: {primal: {s: 10, eta: 0.1}}}\n  primal_plus: {vars: {primal: {s: 12, eta: 0.2}}}\n"
    )
    assert {f"uea/NewSeries/{m}" for m in ("primalformer", "primal_plus", "transformer")} <= set(list_configs())
    cfg = load_config("uea/NewSeries/primal_plus")
    assert cfg.data.name == "NewSeries" and cfg.model.attention_options[1]["s"] == 12
    assert cfg.model.attention_options[1]["max_len"] == 50 and cfg.trainer.max_epochs == 100


def test_every_family_keeps_every_name():
    trio = ["primal_plus", "primalformer", "transformer"]
    svr = ["linear", "linear_bn", "softmax_bn", "softmax_bn_sh", "softmax_sh"]
    models = {"lra": sorted([*trio, *svr]), "uea": trio, "lm": sorted([*trio, "hf_gpt2"])}
    # lm: reference, reduced, medium and the three context-study budgets
    for family, tasks, budgets in (("lra", 5, 2), ("uea", 10, 1), ("lm", 2, 6)):
        composed = [n for n in list_configs(f"{family}/") if n.count("/") >= 2]
        assert sorted({n.rsplit("/", 1)[1] for n in composed}) == models[family]
        assert len(composed) == tasks * budgets * len(models[family])
        # one form per group: folders of files, no tables
        assert not (PACKAGE_CONFIGS / family / "_models.yaml").exists()
        assert not (PACKAGE_CONFIGS / family / "_tasks.yaml").exists()


def test_references_follow_command_line_overrides():
    # the schedule's total_steps is "${trainer.max_steps}": overriding max_steps moves it (it used to keep the
    # file's value, so a longer run decayed to 0 half-way)
    cfg = load_config("vision/fashion_mnist/reduced/deit", ["--trainer.max_steps", "1234"])
    assert cfg.trainer.max_steps == cfg.schedule.total_steps == 1234
    lra = load_config("lra/listops/reduced/primalformer", ["--trainer.max_steps=777"])
    assert lra.schedule.total_steps == 777
    # a reference through vars and the plan expansion: the primal layers' max_len follows data.max_len
    opts = load_config("lra/listops/primalformer", ["--data.max_len", "500"]).model.attention_options
    assert all(o["max_len"] == 500 for o in (opts if isinstance(opts, list) else [opts]))


def test_an_overridden_reference_keeps_its_own_value():
    cfg = load_config(
        "vision/fashion_mnist/reduced/deit", ["--trainer.max_steps", "1234", "--schedule.total_steps", "50"]
    )
    assert (cfg.trainer.max_steps, cfg.schedule.total_steps) == (1234, 50)
    # the attention switch and unknown keys behave as before
    assert load_config("lra/listops/primalformer", ["--attention", "softmax"]).model.attention == "softmax"
    with pytest.raises(ConfigError, match="unknown config key"):
        load_config("lra/listops/primalformer", ["--trainer.nope", "1"])
