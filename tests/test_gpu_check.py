"""The GPU check's parts that run anywhere: the kernel-free notebook runner and the summary."""

import json
import os
import pathlib
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


def test_two_lanes_put_the_timed_notebooks_first_and_one_lane_keeps_every_notebook_in_order():
    one, = gpu_check.lanes_for(gpu_check.NOTEBOOKS, 1)
    assert one == gpu_check.NOTEBOOKS
    timed, rest = gpu_check.lanes_for(gpu_check.NOTEBOOKS, 2)
    assert timed == list(gpu_check.TIMED_LANE) and sorted(timed + rest) == sorted(gpu_check.NOTEBOOKS)
    assert gpu_check.lanes_for(["00_tour", "08_speed_without_changing_the_math"], 2) == [
        ["08_speed_without_changing_the_math"], ["00_tour"]]


def test_the_lanes_run_side_by_side_and_what_the_budget_cannot_start_is_not_run(monkeypatch, tmp_path):
    """The scheduler alone: each notebook is a stub that ends after a set number of polls."""
    started = []

    class Stub:
        def __init__(self, name, executed, env, timeout):
            self.name, self.polls = name, {"a": 2, "b": 1, "c": 1}[name]
            self.log_path = tmp_path / f"{name}.log"
            self.log_path.write_text(f"{name} ran\n")
            started.append((name, [n for n, _ in started if n not in done]))

        def record(self):
            self.polls -= 1
            if self.polls > 0:
                return None
            done.add(self.name)
            return {"status": "ok", "seconds": 0.0}

    done: set = set()
    monkeypatch.setattr(gpu_check, "_Notebook", Stub)
    monkeypatch.setattr(gpu_check.time, "sleep", lambda s: None)
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        records = gpu_check.run_notebooks([["a", "c"], ["b"]], tmp_path, {}, deadline=gpu_check.time.perf_counter() + 60,
                                          log=f)
    assert records == {"a": {"status": "ok", "seconds": 0.0}, "b": {"status": "ok", "seconds": 0.0},
                       "c": {"status": "ok", "seconds": 0.0}}
    assert started[1] == ("b", ["a"])  # b started while a still ran: side by side
    assert "a ran" in log.read_text() and not list(tmp_path.glob("*.log"))
    with open(log, "w") as f:
        late = gpu_check.run_notebooks([["a"]], tmp_path, {}, deadline=gpu_check.time.perf_counter() + 5, log=f)
    assert late == {"a": {"status": "not run", "error": "the check's budget was spent"}}


def test_the_viewer_files_of_this_check_are_packed_and_an_oversized_one_is_named(monkeypatch, tmp_path):
    import tarfile
    import time

    runs = tmp_path / "notebooks" / "runs"
    runs.mkdir(parents=True)
    old = runs / "old.json"
    old.write_text("{}")
    import os
    os.utime(old, (1, 1))  # from an earlier check: not this one's
    since = time.time() - 1
    (runs / "07_predicted_step.pickle").write_bytes(b"p" * 100)
    (runs / "08_profile_trace.json").write_bytes(b"t" * 300)
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)
    monkeypatch.setattr(gpu_check, "VIEWER_FILES_MAX_BYTES", 250)
    packed = gpu_check._pack_viewer_files(since, tmp_path)
    assert packed == {"files": {"07_predicted_step.pickle": 100}, "left_out": ["08_profile_trace.json (300 B)"]}
    with tarfile.open(tmp_path / "viewers.tar.gz") as tar:
        assert tar.getnames() == ["runs/07_predicted_step.pickle"]


def test_the_summary_reads_07s_snapshots_and_08s_trace_from_their_namespaces(tmp_path, monkeypatch):
    from types import SimpleNamespace as S

    predicted, measured = S(peak_bytes=1000, source="predicted: ..."), S(peak_bytes=1010, source="measured: ...")
    claims = gpu_check.notebook_claims("07_planner", {"predicted": predicted, "measured": measured})
    assert claims["memory_snapshots"]["measured_over_predicted"] == 1.01
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "forward"}]}))
    claims = gpu_check.notebook_claims("08_speed_without_changing_the_math", {"TRACE": trace})
    ranges = {"forward": 1, "backward": 0, "optimizer": 0}
    assert claims["profiler_trace"] == {"file": str(trace), "bytes": trace.stat().st_size, "ranges": ranges}
    summary = gpu_check.headline({"08_speed_without_changing_the_math": {"claims": claims}})
    assert summary["profiler_trace"]["ranges"] == ranges and summary["memory_snapshots"] is None


def test_the_recipe_arms_grow_the_batch_to_what_the_estimate_says_fits(monkeypatch):
    """scripts/gpu_recipe.py's plan, with a stand-in estimate (bytes = batch x seq x width): on a CPU
    (the dry run) the 'card' is 4 x the first arm's peak, the arms stay eager and autotune is left out."""
    from types import SimpleNamespace as S

    import gpu_recipe

    import workbench

    def estimate(cfg, device):
        return S(peak_bytes=cfg.batch_size * cfg.seq_len * cfg.dims["d_model"])

    monkeypatch.setattr(workbench, "estimate", estimate)
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("WORKBENCH_PRESET", "cpu-quick")
    base = gpu_recipe.base_config(3).resolved()
    first = base.batch_size * base.seq_len * base.dims["d_model"]
    arms = {a["arm"]: a for a in gpu_recipe.plan_arms(3)}
    assert list(arms) == ["recipe", "seq", "wider"]  # no autotune arm on a CPU
    assert all(a["config"]["compile"] == "none" and a["memory_bytes"] == 4 * first for a in arms.values())
    fits = [b for b in gpu_recipe.BATCHES if b * 2 * base.seq_len * base.dims["d_model"] <= 0.8 * 4 * first]
    assert arms["seq"]["config"]["batch_size"] == max(fits) and arms["seq"]["config"]["seq_len"] == 2 * base.seq_len
    wide = arms["wider"]["config"]
    assert wide["dims"]["d_model"] == 2 * base.dims["d_model"] and wide["dims"]["d_model"] // wide["dims"]["n_head"] in (
        2 * base.dims["d_model"], 128)
