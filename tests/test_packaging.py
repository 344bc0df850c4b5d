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


def test_a_wheel_installed_outside_the_repo_copies_its_notebooks(tmp_path):
    """The wheel carries the course (setup.py maps notebooks/ into it) and the Rotten Tomatoes file;
    installed into a fresh venv outside this checkout, `workbench-notebooks DEST` and `python -m
    workbench notebooks DEST` copy the notebooks out, byte for byte, and never over a learner's copy.
    ~20 s: a wheel build and a venv with that wheel alone (copying needs no torch)."""
    import subprocess
    import sys
    import zipfile

    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(ROOT)], check=True, cwd=tmp_path)
    (wheel,) = dist.glob("torch_workbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    notebooks = sorted(p.relative_to(ROOT / "notebooks").as_posix() for p in
                       [*(ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"), *(ROOT / "notebooks").glob("teacher/*.ipynb")])
    assert all(f"workbench/notebooks/{n}" in names for n in notebooks)
    assert {"workbench/core/data/shipped/rotten_tomatoes_corpus_full.csv.bz2", "workbench/core/data/shipped/SOURCES.md"} <= set(names)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
                    "--disable-pip-version-check", "--no-deps", "--no-index", str(wheel)], check=True, cwd=tmp_path)
    away = tmp_path / "elsewhere"
    away.mkdir()
    clean = {k: v for k, v in __import__("os").environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    first = subprocess.run([str(venv / "bin" / "workbench-notebooks"), "course"], cwd=away, env=clean,
                           capture_output=True, text=True, check=True)
    assert first.stdout.startswith(f"{len(notebooks)} notebooks copied to course.")
    for n in notebooks:
        assert (away / "course" / n).read_bytes() == (ROOT / "notebooks" / n).read_bytes(), n
    (away / "course" / notebooks[0]).write_text("a learner's answers")
    again = subprocess.run([str(venv / "bin" / "python"), "-m", "workbench", "notebooks", "course"], cwd=away, env=clean,
                           capture_output=True, text=True, check=True)
    assert f"{len(notebooks)} kept as they were" in again.stdout
    assert (away / "course" / notebooks[0]).read_text() == "a learner's answers"
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import workbench; print(workbench.__file__)"], cwd=away,
                           env=clean, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(venv)), where
