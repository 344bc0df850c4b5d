"""The lock: requirements/lock.txt is what the set-up installs, environment.yml follows it, and
`make drift` reports what the newest releases change (scripts/lock.py, setup.sh, drift.py)."""

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
    """make setup installs from the lock (scripts/setup.sh: pip install -c requirements/lock.txt).
    torch is left out: a torch the environment already had (conda's, Colab's) is kept on purpose,
    and setup.sh says so (conftest's session header names it)."""
    moved = [m for m in off_the_lock() if not m.startswith("torch ")]
    assert not moved, "installed versions that are not the lock's (run make setup, or make lock on purpose): " + ", ".join(moved)


def test_a_lock_line_is_a_name_and_an_exact_version():
    for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert name == _name(name) and version and "+" not in version, line


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
