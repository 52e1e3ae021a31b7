"""The integrations stay optional: the core and the torch-only integrations never import transformers or timm."""

from __future__ import annotations

import json
import subprocess
import sys


def test_core_and_torch_only_integrations_import_no_optional_library():
    code = (
        "import sys, json; import primaldual, primaldual.integrations, primaldual.integrations.torch_nn, "
        "primaldual.integrations.timm; print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert not loaded & {"transformers", "timm", "accelerate", "torchvision"}, sorted(loaded)
