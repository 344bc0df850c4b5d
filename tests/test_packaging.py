"""environment.yml and pyproject.toml name the same packages."""

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _names(specs):
    return {re.split(r"[<>=!~ \[]", s.strip().strip('"'), maxsplit=1)[0].lower() for s in specs}


def test_environment_yml_installs_what_pyproject_requires():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = _names(project["dependencies"]) | _names(project["optional-dependencies"]["lab"]) | _names(project["optional-dependencies"]["test"])
    env = (ROOT / "environment.yml").read_text()
    pip_lines = re.findall(r'^\s+- "([^"]+)"\s*$', env, flags=re.M)
    listed = _names(p for p in pip_lines if not p.startswith("-e"))
    assert wanted == listed, f"missing from environment.yml: {wanted - listed}; extra: {listed - wanted}"


def test_the_live_curves_front_end_installs_with_the_package():
    """bqplot's wheel carries its prebuilt JupyterLab extension: `make lab` needs no build step."""
    import pytest

    pytest.importorskip("bqplot")
    from jupyter_core.paths import jupyter_path

    found = [p for p in jupyter_path("labextensions") if (Path(p) / "bqplot" / "package.json").is_file()]
    assert found, f"bqplot's JupyterLab extension is not where JupyterLab looks: {jupyter_path('labextensions')}"
