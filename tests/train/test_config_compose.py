"""Configs by composition: every old name loads to exactly the frozen RunConfig (so the same run directory), the
folder stays small, fragments are not configs, and bad files fail with errors naming the file and key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from primaldual.train import config as config_module
from primaldual.train.config import (
    ConfigError,
    RunConfig,
    config_dir,
    describe_config,
    find_config,
    list_configs,
    load_config,
)

DATA = Path(__file__).resolve().parent / "data"
# written by data/freeze_configs.py with the code from before composition: 111 single-file configs
FROZEN = json.loads((DATA / "frozen_configs.json").read_text())
FINGERPRINTS = json.loads((DATA / "frozen_fingerprints.json").read_text())


def test_configs_folder_holds_at_most_30_files():
    # every family (uea, lra and the language-modelling lm added after the freeze) in at most 30 files together
    files = [p.relative_to(config_dir()) for p in config_dir().rglob("*") if p.is_file()]
    assert len(files) <= 30, sorted(map(str, files))


def test_list_configs_is_the_old_set_without_fragments():
    # lm/, rl/ and vision/: added after the freeze (test_lm.py, test_rl.py, test_vision.py)
    names = [n for n in list_configs() if not n.startswith(("lm/", "rl/", "vision/"))]
    assert names == sorted(FROZEN) and len(names) == 111
    assert not [n for n in names if any(part.startswith("_") for part in n.split("/"))]
    assert list_configs("uea/JapaneseVowels/") == [
        f"uea/JapaneseVowels/{m}" for m in ("primal_plus", "primalformer", "transformer")
    ]


def _since_frozen(d: dict, defaults: dict, frozen: dict) -> dict:
    """``d`` without the keys added to the schema after the freeze, which must still be at their defaults."""
    out = {}
    for key, value in d.items():
        if key not in frozen:
            assert value == defaults[key], f"{key}: a key added after the freeze must keep its default"
        elif isinstance(value, dict) and isinstance(frozen[key], dict) and key != "attention_options":
            out[key] = _since_frozen(value, defaults[key], frozen[key])
        else:
            out[key] = value
    return out


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_composed_config_equals_the_frozen_one(name):
    cfg = load_config(name)
    now = _since_frozen(cfg.to_dict(), RunConfig().to_dict(), FROZEN[name])
    # JSON text, not dict equality: 0 and 0.0 (or 1 and True) would compare equal but hash differently
    assert json.dumps(now, sort_keys=True) == json.dumps(FROZEN[name], sort_keys=True)
    assert cfg.fingerprint() == FINGERPRINTS[name]  # the run directory is unchanged: old runs resume


def test_describe_config_lists_the_files_in_merge_order():
    assert describe_config("lra/listops/reduced/primal_plus") == [
        "lra/_base.yaml",
        "lra/_tasks/listops.yaml",
        "lra/_models.yaml (primal_plus)",
        "lra/_budgets/reduced.yaml",
        "lra/_tasks/listops.yaml (models.primal_plus)",
        "lra/_tasks/listops.yaml (budgets.reduced)",
    ]
    assert describe_config("uea/default")[-1] == "uea/default.yaml"
    assert describe_config("uea/Heartbeat/transformer") == [
        "uea/_base.yaml",
        "uea/_tasks.yaml (Heartbeat)",
        "uea/_models.yaml (transformer)",
    ]
    assert find_config("uea/default") == config_dir() / "uea" / "default.yaml"
    assert find_config("uea/Heartbeat/transformer") == config_dir() / "uea" / "_tasks.yaml"


@pytest.mark.parametrize("spec", ["lra/_models", "uea/_base", "lra/_tasks/listops", "uea/_tasks"])
def test_a_fragment_is_not_a_config(spec):
    with pytest.raises(ConfigError, match="is a fragment"):
        load_config(spec)
    with pytest.raises(ConfigError, match="is a fragment"):
        load_config(config_dir() / f"{spec}.yaml")


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
    with pytest.raises(
        ConfigError, match=r"schedule.warmup_steps: \$\{trainer.max_step\} refers to 'trainer.max_step'"
    ):
        load_config(path)
    path.write_text("defaults: [lra/image/transformer]\nvars: {a: '${vars.b}', b: '${vars.a}'}\n")
    with pytest.raises(ConfigError, match="reference cycle"):
        load_config(path)


@pytest.fixture
def configs(tmp_path, monkeypatch) -> Path:
    """A writable copy of configs/, used by load_config instead of the real one."""
    root = tmp_path / "configs"
    shutil.copytree(config_dir(), root)
    monkeypatch.setattr(config_module, "config_dir", lambda: root)
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
    _edit(configs / "lra" / "_models.yaml", "model: {attention: linear,", "modle: {attention: linear,")
    with pytest.raises(ConfigError, match=r"lra/_models.yaml: unknown config key 'linear.modle'"):
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
    (configs / "uea" / "_tasks").mkdir()
    (configs / "uea" / "_tasks" / "NewSeries.yaml").write_text(
        "data: {name: NewSeries}\nvars: {primal: {rank_multi: 5, max_len: 50}}\n"
        "models:\n  primalformer: {vars: {primal: {s: 10, eta: 0.1}}}\n  primal_plus: {vars: {primal: {s: 12, eta: 0.2}}}\n"
    )
    assert {f"uea/NewSeries/{m}" for m in ("primalformer", "primal_plus", "transformer")} <= set(list_configs())
    cfg = load_config("uea/NewSeries/primal_plus")
    assert cfg.data.name == "NewSeries" and cfg.model.attention_options[1]["s"] == 12
    assert cfg.model.attention_options[1]["max_len"] == 50 and cfg.trainer.max_epochs == 100


def test_a_task_table_entry_is_checked_like_a_task_file(configs):
    table = configs / "uea" / "_tasks.yaml"
    table.write_text(table.read_text() + "\nBroken:\n  data: {name: Broken, nope: 1}\n")
    with pytest.raises(ConfigError, match=r"_tasks.yaml: unknown config key 'Broken.data.nope'"):
        load_config("uea/Broken/transformer")
    table.write_text(table.read_text().replace("nope: 1", "batch_size: 4") + "  models: {transformr: {}}\n")
    with pytest.raises(ConfigError, match="unknown model 'transformr'"):
        load_config("uea/Broken/transformer")


def test_model_tables_keep_every_name():
    # the models moved from one _models/<model>.yaml file each into one _models.yaml per family: the same names
    trio = ["primal_plus", "primalformer", "transformer"]
    svr = ["linear", "linear_bn", "softmax_bn", "softmax_bn_sh", "softmax_sh"]
    models = {"lra": sorted([*trio, *svr]), "uea": trio, "lm": trio}
    for family, tasks, budgets in (("lra", 5, 2), ("uea", 10, 1), ("lm", 2, 2)):
        composed = [n for n in list_configs(f"{family}/") if n.count("/") >= 2]
        assert sorted({n.rsplit("/", 1)[1] for n in composed}) == models[family]
        assert len(composed) == tasks * budgets * len(models[family])
        assert not (config_dir() / family / "_models").exists()


def test_a_model_table_entry_is_checked_like_a_model_file(configs, tmp_path):
    table = configs / "lra" / "_models.yaml"
    _edit(table, "model: {attention: linear,", "model: {atention: linear,")
    with pytest.raises(ConfigError, match=r"lra/_models.yaml: unknown config key 'linear.model.atention'"):
        load_config("lra/image/linear")
    _edit(table, "model: {atention: linear,", "name: x\n  model: {attention: linear,")
    with pytest.raises(ConfigError, match=r"_models.yaml: unknown config key 'linear.name' \(a fragment cannot"):
        load_config("lra/image/linear")
    _edit(table, "name: x\n", "models: {}\n")
    with pytest.raises(ConfigError, match=r"_models.yaml: unknown config key 'linear.models'"):
        load_config("lra/image/linear")
    _edit(table, "models: {}\n", "defaults: [lra/_budgets/reduced]\n")
    with pytest.raises(ConfigError, match=r"_models.yaml: model 'linear': a model-table entry cannot have defaults"):
        load_config("lra/image/linear")
    _edit(table, "defaults: [lra/_budgets/reduced]\n", "")
    assert load_config("lra/image/linear").model.attention == "linear"
    table.write_text(table.read_text() + "\nbroken: [1]\n")
    with pytest.raises(ConfigError, match=r"_models.yaml: model 'broken': expected a mapping, got list"):
        list_configs()
    table.write_text(table.read_text().replace("broken: [1]", "_hidden: {}"))
    with pytest.raises(ConfigError, match=r"_models.yaml: model names must be plain names, got '_hidden'"):
        load_config("lra/image/linear")
    # the table is no fragment to build on: its entries are used through composed names
    table.write_text(table.read_text().replace("_hidden: {}", ""))
    (tmp_path / "mine.yaml").write_text("defaults: [lra/_models]\n")
    with pytest.raises(ConfigError, match=r"defaults entry 'lra/_models' is a model table"):
        load_config(tmp_path / "mine.yaml")


def test_a_model_file_beside_the_table(configs):
    (configs / "lra" / "_models").mkdir()
    (configs / "lra" / "_models" / "mine.yaml").write_text("model: {attention: linear, attention_options: null}\n")
    assert {"lra/image/mine", "lra/listops/reduced/mine"} <= set(list_configs())
    assert load_config("lra/image/mine").model.attention == "linear"
    assert describe_config("lra/image/mine")[2] == "lra/_models/mine.yaml"
    assert describe_config("lra/image/linear")[2] == "lra/_models.yaml (linear)"
    # a name both in the table and a file: ambiguous, so an error naming both (for every name of the family)
    (configs / "lra" / "_models" / "linear.yaml").write_text("model: {attention: softmax}\n")
    both = r"lra/_models.yaml: model 'linear' is both an entry here and a file, .*lra/_models/linear.yaml; keep one"
    for name in ("lra/image/linear", "lra/image/transformer"):
        with pytest.raises(ConfigError, match=both):
            load_config(name)
    with pytest.raises(ConfigError, match=both):
        list_configs()
    # the same for tasks
    (configs / "uea" / "_tasks").mkdir()
    (configs / "uea" / "_tasks" / "Heartbeat.yaml").write_text("data: {name: Heartbeat}\n")
    with pytest.raises(ConfigError, match=r"uea/_tasks.yaml: task 'Heartbeat' is both an entry here and a file"):
        load_config("uea/Heartbeat/transformer")


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
