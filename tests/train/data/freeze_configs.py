"""Freeze every bundled config's merged result: ``frozen_configs.json`` and ``frozen_fingerprints.json``.

Written once, with the code from before the configs were composed from fragments, so that
``tests/train/test_config_compose.py`` can prove every name still loads to the same ``RunConfig`` (and so the same
run directory). Re-run it only to record an intended change of a bundled config::

    python tests/train/data/freeze_configs.py
"""

from __future__ import annotations

import json
from pathlib import Path

from primaldual.train.config import list_configs, load_config

HERE = Path(__file__).resolve().parent


def _write(path: Path, table: dict) -> None:
    # one name per line, keys sorted: small diffs when a single config changes
    lines = [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(table.items())]
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")


def main() -> None:
    configs, fingerprints = {}, {}
    for name in list_configs():
        cfg = load_config(name)
        configs[name], fingerprints[name] = cfg.to_dict(), cfg.fingerprint()
    _write(HERE / "frozen_configs.json", configs)
    _write(HERE / "frozen_fingerprints.json", fingerprints)
    print(f"froze {len(configs)} configs")


if __name__ == "__main__":
    main()
