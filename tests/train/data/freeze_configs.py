"""Freeze every shipped config's merged result: ``frozen_configs.json``.

Per name: the ``RunConfig`` as a dict, its fingerprint (the run directory) and the SHA-256 of its ``config.yaml``
text. Written with the hand-written engine that OmegaConf replaced (commit abb5f8c), so that
``tests/train/test_config_compose.py`` proves every name still loads to the same config and resumes in the same run
directory. The ``config.yaml`` texts were frozen again when every task declared all the keys it reads: 179 texts
lost keys their task does not read, while every config and every fingerprint stayed as frozen (a run directory
written before resumes: a key missing from one of two texts counts as its default); and again (141 texts) when tasks
came to own their keys (``Task.config``), which moved a task's own keys after the common ones, fingerprints equal.
The six ``rl/`` entries were edited by hand when the Decision Transformer configs made ``model.init: gpt2`` their
default: a new fingerprint each (``--model.init pytorch`` gives the old one). Re-run it only to record an intended
change of a shipped config::

    python tests/train/data/freeze_configs.py
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from primaldual.train.config import dump_config, list_configs, load_config

HERE = Path(__file__).resolve().parent


def main() -> None:
    table = {}
    for name in list_configs():
        cfg = load_config(name)
        text = dump_config(cfg)
        table[name] = {
            "config": cfg.to_dict(),
            "fingerprint": cfg.fingerprint(),
            "yaml_sha256": hashlib.sha256(text.encode()).hexdigest(),
        }
    # one name per line, keys sorted: small diffs when a single config changes
    lines = [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(table.items())]
    (HERE / "frozen_configs.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")


if __name__ == "__main__":
    main()
