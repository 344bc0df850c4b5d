"""scripts/run_tests.py, `make test`'s two passes: what each collects."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("run_tests_script", ROOT / "scripts" / "run_tests.py")
run_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_tests)


@pytest.fixture
def conftest(pytestconfig):
    """tests/conftest.py as pytest loaded it (`import conftest` may find tests/browser/'s instead)."""
    path = ROOT / "tests" / "conftest.py"
    return next(p for p in pytestconfig.pluginmanager.get_plugins() if Path(getattr(p, "__file__", "") or "") == path)


def test_the_serial_and_room_passes_collect_only_the_files_conftest_marks(monkeypatch, conftest):
    monkeypatch.chdir(ROOT)
    parallel, serial = run_tests.passes(2, ["--durations=5"])
    serial_files = [key.split("::")[0] for key in conftest.SERIAL]
    assert serial[-len(serial_files):] == serial_files and all((ROOT / f).exists() for f in serial_files)
    assert not any(f in parallel for f in serial_files)  # the xdist pass still collects everything
    assert run_tests.passes(2, [], room=True)[0][-1] == conftest.ROOM


def test_tests_the_user_names_are_collected_as_named_in_both_passes(monkeypatch):
    monkeypatch.chdir(ROOT)
    named = "notebooks/01_mixed_precision.ipynb"
    for command in run_tests.passes(2, [named, "-k", "Cell"]):
        assert command[-3:] == [named, "-k", "Cell"]


def test_from_another_folder_the_marked_files_are_whole_paths(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert run_tests.passes(2, [])[1][-1] == str(ROOT / "tests" / "test_pipeline_bench.py")


def test_the_xdist_pass_hands_out_the_slowest_files_first(monkeypatch, conftest):
    monkeypatch.chdir(ROOT)
    parallel, serial = run_tests.passes(2, [])
    assert "--no-loadscope-reorder" in parallel and "--no-loadscope-reorder" not in serial  # no xdist there
    assert [path for path in conftest.SLOWEST_FIRST if not (ROOT / path).exists()] == []

    class Item:
        def __init__(self, nodeid):
            self.nodeid = nodeid

        def add_marker(self, marker):
            pass

    items = [Item(n) for n in ("tests/test_zz.py::a", "tests/test_cli.py::b", "tests/test_estimate.py::c",
                               "tests/test_cli.py::a", "tests/test_aa.py::d")]
    conftest.pytest_collection_modifyitems(None, items)
    assert [item.nodeid for item in items] == ["tests/test_estimate.py::c", "tests/test_cli.py::b",
                                               "tests/test_cli.py::a", "tests/test_zz.py::a", "tests/test_aa.py::d"]


def test_the_series_script_says_how_it_is_used_and_refuses_what_it_does_not_know():
    """.ci/series (docs/NOTEBOOK_CI.md section 3) runs whole .ci/runs: too long for a test, so only
    its arguments are checked here; its runs are the steadiness record in the issue notes."""
    import subprocess

    usage = subprocess.run(["bash", str(ROOT / ".ci" / "series"), "--help"], capture_output=True, text=True)
    assert usage.returncode == 0 and ".ci/series -n 1 --no-hog" in usage.stdout
    refused = subprocess.run(["bash", str(ROOT / ".ci" / "series"), "--runs", "5"], capture_output=True, text=True)
    assert refused.returncode == 2
    assert refused.stderr == ".ci/series: unknown argument --runs (see .ci/series --help)\n"
    missing = subprocess.run(["bash", str(ROOT / ".ci" / "series"), "-c", "no-such-commit"], capture_output=True, text=True)
    assert missing.returncode == 2 and "no commit no-such-commit" in missing.stderr


def test_xdist_without_dist_hands_a_notebook_to_one_worker_and_an_explicit_dist_is_kept(pytestconfig):
    """The checkout's conftest.py: `pytest -n 2 notebooks/...` alone would be `--dist load`, which can
    send a notebook's later cells to another worker's fresh kernel (a NameError no change caused)."""
    from types import SimpleNamespace

    path = ROOT / "conftest.py"
    root = next(p for p in pytestconfig.pluginmanager.get_plugins() if Path(getattr(p, "__file__", "") or "") == path)
    (impl,) = [i for i in pytestconfig.pluginmanager.hook.pytest_cmdline_main.get_hookimpls() if i.plugin is root]
    assert impl.tryfirst  # before xdist's own hook turns "no --dist" into "load"
    for workers, given, expected in [(2, "no", "loadfile"), (2, "load", "load"), (2, "loadgroup", "loadgroup"),
                                     (None, "no", "no"), (0, "no", "no")]:
        option = SimpleNamespace(numprocesses=workers, dist=given)
        root.pytest_cmdline_main(SimpleNamespace(option=option))
        assert option.dist == expected, (workers, given)
