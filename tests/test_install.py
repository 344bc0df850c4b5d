"""scripts/install.py, the set-up: what it refuses, which torch it asks for and from where, and what the
Makefile asks of it. Seconds: no package is installed here (a real install from a fresh clone, as a
non-root learner with Debian's python3, is .ci/install_matrix.py's third check: a dry run)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import install  # noqa: E402


def _old_python() -> str | None:
    """A Python 3.10 that runs (pyenv's here; a pyenv shim without that version selected does not)."""
    for candidate in [*sorted(Path.home().glob(".pyenv/versions/3.10*/bin/python")), shutil.which("python3.10")]:
        if candidate and subprocess.run([str(candidate), "-c", "pass"], capture_output=True).returncode == 0:
            return str(candidate)
    return None


OLD_PYTHON = _old_python()


@pytest.mark.skipif(OLD_PYTHON is None, reason="no Python 3.10 on this machine")
def test_an_older_python_is_refused_in_one_line_before_anything_is_made(tmp_path):
    done = subprocess.run([str(OLD_PYTHON), str(ROOT / "scripts" / "install.py"), "learn", "--venv", str(tmp_path / "v")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("install: the workbench needs Python >= 3.11 (3.11-3.13 tested); this is 3.10.")
    assert "make learn PYTHON=python3.12" in lines[0]
    assert not (tmp_path / "v").exists()


def test_the_python_floor_is_pyprojects():
    import tomllib

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"] == ">=3.11"
    assert install.python_problem((3, 11, 2)) is None and install.python_problem((3, 13, 0)) is None
    assert "this is 3.10.12" in install.python_problem((3, 10, 12), "/usr/bin/python3")


def test_without_debians_python3_venv_the_fix_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ensurepip", None)  # import ensurepip fails, as without python3.11-venv
    problem = install.venv_problem()
    v = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert problem.endswith(f"`sudo apt install python{v}-venv` (or python3-venv), then run this again") and "\n" not in problem


def test_a_venv_whose_python_is_gone_or_too_old_is_named(tmp_path):
    broken = tmp_path / "broken"
    (broken / "bin").mkdir(parents=True)
    (broken / "pyvenv.cfg").write_text("home = /opt/python3.10/bin\nversion_info = 3.10.4\nexecutable = /opt/python3.10/bin/python3.10\n")
    assert install.existing_venv_problem(broken) == (
        f"{broken} was made by Python 3.10.4 (/opt/python3.10/bin/python3.10), whose interpreter no longer runs")
    good = tmp_path / "good"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(good)], check=True)
    assert install.existing_venv_problem(good) is None
    if OLD_PYTHON:
        old = tmp_path / "old"
        subprocess.run([str(OLD_PYTHON), "-m", "venv", "--without-pip", str(old)], check=True)
        assert install.existing_venv_problem(old).startswith(f"{old} has Python 3.10.")


@pytest.mark.parametrize("system, gpu, env, index, no_deps, fallback", [
    ("Linux", False, {}, install.CPU_INDEX, True, True),                       # a laptop: PyTorch's CPU build
    ("Linux", True, {}, None, False, False),                                   # a GPU box: PyPI's CUDA build + its libraries
    ("Darwin", False, {}, None, True, False),                                  # PyPI's macOS wheel is the CPU/MPS build
    ("Windows", False, {}, None, True, False),
    ("Linux", False, {"TORCH_INDEX_URL": "pip"}, None, False, False),          # the learner's override: pip's own index
    ("Linux", False, {"TORCH_INDEX_URL": "https://download.pytorch.org/whl/cu126"}, "https://download.pytorch.org/whl/cu126", False, False),
    ("Linux", False, {"TORCH_INDEX_URL": "https://mirror.example/torch/whl/cpu/"}, "https://mirror.example/torch/whl/cpu/", True, False),
])
def test_which_torch_from_where(system, gpu, env, index, no_deps, fallback):
    plan = install.torch_plan("2.13.0", env, system, gpu)
    assert (plan.spec, plan.index, plan.no_deps, plan.fallback) == ("torch==2.13.0", index, no_deps, fallback)
    assert install.torch_plan("2.13.0", {"TORCH_SPEC": "torch==2.14.1"}, system, gpu).spec == "torch==2.14.1"


def _commands(monkeypatch, reachable: str | None, fail_first: bool = False) -> tuple[list[list[str]], list[str]]:
    ran, said = [], []
    monkeypatch.setattr(install, "index_reachable", lambda url, timeout=10.0: reachable)
    monkeypatch.setattr(install, "run", lambda command, dry_run=False: ran.append(command) or (1 if fail_first and len(ran) == 1 else 0))
    monkeypatch.setattr("builtins.print", lambda *a, **k: said.append(" ".join(map(str, a))))
    env = install.Env(Path("/v/bin/python"), True, Path("/v"))
    install.install_torch(env, install.torch_plan("2.13.0", {}, "Linux", False), Path("/tmp/rest.txt"), [], False)
    return ran, said


def test_the_cpu_build_command_the_setup_runs(monkeypatch):
    ran, _ = _commands(monkeypatch, reachable=None)
    assert ran == [["/v/bin/python", "-m", "pip", "--disable-pip-version-check", "install", "--retries", "1", "--timeout", "30",
                    "--index-url", "https://download.pytorch.org/whl/cpu", "--no-deps", "torch==2.13.0"]]


@pytest.mark.parametrize("reachable, fail_first", [("[Errno -2] Name or service not known", False), (None, True)])
def test_when_the_cpu_index_cannot_be_had_pips_own_index_is_used_and_said(monkeypatch, reachable, fail_first):
    ran, said = _commands(monkeypatch, reachable, fail_first)
    assert ran[-1] == ["/v/bin/python", "-m", "pip", "--disable-pip-version-check", "install", "-c", "/tmp/rest.txt", "torch==2.13.0"]
    assert any(s.startswith("install: PyTorch's CPU index https://download.pytorch.org/whl/cpu cannot be reached") and
               "set TORCH_INDEX_URL" in s for s in said)


def test_pytorchs_cpu_index_is_unreachable_here_and_that_is_seen_quickly():
    """This machine reaches only the package registries: the probe must say so in seconds, not hang."""
    import time

    start = time.monotonic()
    reason = install.index_reachable(install.CPU_INDEX, timeout=10)
    assert reason and time.monotonic() - start < 15


def test_the_makefile_asks_each_target_for_its_set():
    def dry(target: str) -> str:
        return subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True,
                              env={k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}).stdout

    assert "python3 scripts/install.py learn" in dry("learn") and "python3 scripts/install.py learn" in dry("lab")
    assert "python3 scripts/install.py test" in dry("test") and "python3 scripts/install.py test" in dry("setup")
    assert "python3 scripts/install.py room" in dry("room")
    assert "python3 scripts/install.py wheelhouse wheelhouse --wheelhouse-set test" in dry("wheelhouse")


def test_each_set_file_is_what_its_extras_need():
    from lock import SETS

    assert install.EXTRAS == {name: ",".join(extras) for name, extras in SETS.items() if name != "dali"}
    assert set(install.SETS.values()) == set(install.EXTRAS)


def test_install_learn_open_makes_the_copies_and_starts_jupyterlab(tmp_path):
    """The no-make path (Windows, a Mac without developer tools): the install (here: nothing to do), the
    learner's copies in LEARNERS, JupyterLab on them. Skipped where this environment is not installed as
    the lock says (the command would install: a test must not)."""
    import signal
    import time

    facts = install.probe(Path(sys.executable), install.read_pins(ROOT / "requirements" / "learn.txt"))
    stamp = install.read_stamp(Path(sys.prefix))
    if not stamp or [n for n, v in facts["pins"] if facts["have"].get(n) != v and n != "torch"]:
        pytest.skip("this environment is not the lock's (run make setup first)")
    learners = tmp_path / "learners"
    log = tmp_path / "log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "install.py"), "learn", "--open"], cwd=ROOT,
                                env={**os.environ, "LEARNERS": str(learners), "JUPYTER_PORT": "0"}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            for _ in range(180):
                if "http://127.0.0.1" in log.read_text() or proc.poll() is not None:
                    break
                time.sleep(1)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    text = log.read_text()
    assert "http://127.0.0.1" in text, text[-3000:]
    assert "install: learn is installed" in text and f"jupyter lab {learners}/" in text
    copies = sorted(p.name for p in learners.glob("[0-9][0-9]_*.ipynb"))
    assert copies == sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
