"""The GPU check's parts that run anywhere: the kernel-free notebook runner and the summary."""

import json
import pathlib
import os
import subprocess
import sys

import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))  # gpu_check imports nothing heavy at module level

import gpu_check  # noqa: E402


def _notebook(tmp_path: pathlib.Path, *sources: str) -> pathlib.Path:
    cells = [{"cell_type": "code", "metadata": {}, "source": s, "outputs": [], "execution_count": None}
             for s in sources]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# t"}, *cells],
                                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def _run(tmp_path: pathlib.Path, *sources: str) -> tuple[int, list[dict]]:
    """scripts/nbrun.py in its own process (IPython's shell is a per-process singleton)."""
    pytest.importorskip("IPython")
    out = tmp_path / "out.ipynb"
    proc = subprocess.run([sys.executable, str(SCRIPTS / "nbrun.py"), str(_notebook(tmp_path, *sources)), str(out)],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, json.loads(out.read_text())["cells"]


def test_the_runner_keeps_streams_displays_and_the_last_expression(tmp_path):
    code, cells = _run(tmp_path, "x = 2\nprint('hello', x)", "display(x + 1)\nx * 10")
    assert code == 0
    assert cells[1]["outputs"][0] == {"output_type": "stream", "name": "stdout", "text": "hello 2\n"}
    assert [o["output_type"] for o in cells[2]["outputs"]] == ["display_data", "execute_result"]
    assert cells[2]["outputs"][1]["data"]["text/plain"] == "20"


def test_the_runner_stops_at_the_first_error_and_saves_what_ran(tmp_path):
    code, cells = _run(tmp_path, "print('ran')", "raise ValueError('broken on purpose')", "print('never')")
    assert code == 1 and cells[1]["outputs"][0]["text"] == "ran\n"
    assert cells[2]["outputs"][-1]["ename"] == "ValueError" and "broken on purpose" in cells[2]["outputs"][-1]["evalue"]
    assert cells[3]["outputs"] == [] and cells[3]["execution_count"] is None


def test_rich_reprs_reach_the_saved_outputs(tmp_path):
    code, cells = _run(tmp_path, "class Rich:\n    def _repr_html_(self):\n        return '<b>rich</b>'\n"
                                 "    def __repr__(self):\n        return 'Rich()'\nRich()")
    data = cells[1]["outputs"][0]["data"]
    assert code == 0 and data["text/html"] == "<b>rich</b>" and data["text/plain"] == "Rich()"


def test_the_summary_says_why_a_gpu_figure_is_missing_on_a_cpu():
    summary = gpu_check.headline({"01_mixed_precision": {"claims": {"runs": [
        {"name": "fp32", "device": "cpu", "mfu": 0.3}], "bf16_peak_vs_fp32": None}}})
    assert summary["mfu_vs_spec_sheet_peak"] == {"value": None, "why_null": gpu_check.NO_GPU}
    assert summary["amp_vs_fp32"] == {"bf16_peak_vs_fp32": None}
    assert summary["checkpointing"] is None and summary["estimate_vs_max_memory_allocated"] is None


def test_every_timeout_fits_the_budget_and_a_new_notebook_gets_the_default():
    assert all(0 < t < 450 for t in gpu_check.TIMEOUT_S.values())  # each fits the default --budget-s
    assert gpu_check.DEFAULT_TIMEOUT_S < 450 and set(gpu_check.NOTEBOOKS) >= {"00_tour", "07_planner"}


def _state_of(folder: str) -> str:
    """What git sees in `folder`: changed, untracked and ignored files alike."""
    return subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all", "--", folder],
                          cwd=SCRIPTS.parent, capture_output=True, text=True, check=True).stdout


def test_make_gpu_check_without_a_gpu_says_so_in_one_line_and_writes_nothing():
    """The README's `make gpu-check`, its recipe as written (`-o setup`: this environment is installed
    already, and a test must not re-install it): on a CPU machine one line, status 0, and
    docs/gpu-reference/ exactly as it was."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: make gpu-check would run the whole check")
    before = _state_of("docs/gpu-reference")
    # as typed at a shell: not a sub-make of `make test` (which would print "Entering directory")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    proc = subprocess.run(["make", "-o", "setup", "gpu-check", f"PY={sys.executable}"], cwd=SCRIPTS.parent,
                          capture_output=True, text=True, timeout=120, env=env)
    out = SCRIPTS.parent / "docs" / "gpu-reference"
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stdout + proc.stderr
    # make's echo of the recipe, then the check's one line
    assert proc.stdout.splitlines() == [f"{sys.executable} scripts/gpu_check.py --out docs/gpu-reference",
                                        gpu_check.NO_CUDA_LINE.format(out=out)]
    assert _state_of("docs/gpu-reference") == before


def test_a_relative_out_is_the_callers_folder_not_the_notebooks(tmp_path, monkeypatch):
    """--out is made absolute before anything changes directory: a notebook's child process runs
    from notebooks/ and wrote its record to notebooks/<out>/, a folder that was not there
    (FileNotFoundError for all ten). The notebook itself is not run here: nbrun.execute is stubbed."""
    nbrun = pytest.importorskip("nbrun")
    ran = []
    monkeypatch.setattr(nbrun, "execute", lambda src, dst: ran.append((pathlib.Path.cwd(), src, dst)) or ("ok", None, {}))
    (tmp_path / "rel").mkdir()  # the parent makes it before it starts any child
    monkeypatch.chdir(tmp_path)  # (and back to the test's folder afterwards: child() changes it)
    assert gpu_check.main(["--child", "00_tour", "--out", "rel"]) == 0
    assert ran == [(SCRIPTS.parent / "notebooks", SCRIPTS.parent / "notebooks" / "00_tour.ipynb",
                    tmp_path / "rel" / "00_tour.ipynb")]
    assert json.loads((tmp_path / "rel" / "00_tour.json").read_text())["status"] == "ok"
