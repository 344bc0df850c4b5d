"""Importing workbench is cheap and starts no CUDA (notebook_launcher forks after it)."""

import json
import subprocess
import sys

HEAVY = ["accelerate", "datasets", "transformers", "matplotlib", "ipywidgets", "pandas", "sklearn"]


def test_import_loads_nothing_heavy_and_no_cuda():
    code = (
        "import sys, json, workbench\n"
        "cfg = workbench.RunConfig(model='mlp')\n"  # building a config stays light too
        "import torch\n"
        f"print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}} | {{'cuda': torch.cuda.is_initialized()}}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    assert not any(loaded.values()), f"loaded at import: {[k for k, v in loaded.items() if v]}"


def test_public_names_resolve():
    import workbench

    for name in workbench.__all__:
        assert getattr(workbench, name) is not None
