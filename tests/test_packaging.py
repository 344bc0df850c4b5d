"""What installs with the package (environment.yml and the lock: tests/test_lock.py)."""

from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def test_the_live_curves_front_end_installs_with_the_package():
    """bqplot's wheel carries its prebuilt JupyterLab extension: `make lab` needs no build step."""
    import pytest

    pytest.importorskip("bqplot")
    from jupyter_core.paths import jupyter_path

    found = [p for p in jupyter_path("labextensions") if (Path(p) / "bqplot" / "package.json").is_file()]
    assert found, f"bqplot's JupyterLab extension is not where JupyterLab looks: {jupyter_path('labextensions')}"
