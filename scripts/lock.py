"""The lock: the exact versions the set-up installs, for every Python and platform the project claims.

    python scripts/lock.py            # re-resolve (newest releases within pyproject), write them all
    python scripts/lock.py --check    # the files cover pyproject and follow each other (no network)

One universal resolution (`uv pip compile --universal`, Python 3.11 and up, Linux, macOS and
Windows: a pin that only one platform needs carries its marker, e.g. `appnope==... ; sys_platform ==
'darwin'`) writes requirements/lock.txt: every package of every extra, what CI tested. From it, with
the same versions (it is their constraints file), one file per set the set-up installs:

    requirements/learn.txt   `make learn`, `make lab`      the package, JupyterLab, torchao
    requirements/room.txt    `make room`                   + JupyterHub, its proxy and idle culler
    requirements/test.txt    `make test`, `make setup`     + pytest, nbval, playwright (and the room's)
    requirements/dali.txt    opt-in, Linux                 NVIDIA DALI

scripts/install.py installs a set with `pip install --no-deps -r requirements/SET.txt` (no resolution:
a missing pin fails at once, naming itself) and then `pip check`. torch==2.13.0 is pinned like the
rest, but its CUDA build's own libraries (nvidia-*, cuda-*, triton: torch pins them exactly) are left
out: the set-up installs torch first and on its own (PyTorch's CPU build where there is no GPU).
environment.yml (conda) is generated from requirements/test.txt. `make drift` shows what the newest
releases would break before the lock moves to them.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements"
LOCK = REQUIREMENTS / "lock.txt"
ENVIRONMENT = ROOT / "environment.yml"
# The set-up's sets: name -> extras (scripts/install.py reads requirements/NAME.txt).
SETS = {"learn": ("lab", "quantization"), "room": ("lab", "quantization", "room"),
        "test": ("lab", "quantization", "test", "room"), "dali": ("dali",)}
EXTRAS = ("lab", "quantization", "test", "room", "dali")
TORCH = "torch==2.13.0"
LOWEST_PYTHON = "3.11"
# The build backend pyproject names: in every set, so the package builds offline (--no-build-isolation);
# and pip itself: install.py brings a venv's pip to it first (Debian 12's venv has pip 23.0.1, whose
# --dry-run downloads whole wheels, torch's CUDA libraries included, where a newer one reads PEP 658 metadata).
BUILD = ["setuptools>=77", "pip>=25"]
UV = "uv==0.13.9"  # the resolver `make lock` installs into the environment if it has none


def _install_script():
    """scripts/install.py, loaded by its path (tests load this file the same way, not as a module)."""
    spec = importlib.util.spec_from_file_location("workbench_install_script", Path(__file__).with_name("install.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# One reading of a requirements file, the set-up's (install.py: standard library only).
_install = _install_script()
Pin, _name = _install.Pin, _install.pin_name


def read_pins(path: Path = LOCK) -> list[Pin]:
    return _install.read_pins(path)


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """Package name -> locked version (one version per package: the lock is resolved with
    --fork-strategy fewest, and check() refuses a package pinned twice)."""
    return {pin.name: pin.version for pin in read_pins(path)}


def off_the_lock(path: Path = LOCK) -> list[str]:
    """Installed packages whose version is not the lock's, as "name have (lock: version)" (an extra
    not installed is not counted; setuptools is the build's, not the environment's)."""
    import importlib.metadata

    # Only what is installed, not what a package vendors: once setuptools is imported it puts its
    # own _vendor folder on sys.path, and wheel 0.46.3 inside it read as the environment's wheel
    # (make test failed on it when an earlier test in the same worker had imported setuptools).
    installed = [entry for entry in sys.path if Path(entry).name != "_vendor"]
    moved = []
    for name, locked in read_lock(path).items():
        if name in ("setuptools", "pip"):
            continue
        found = next(iter(importlib.metadata.distributions(name=name, path=installed)), None)
        if found is None:
            continue
        have = found.version.split("+")[0]
        if have != locked:
            moved.append(f"{name} {have} (lock: {locked})")
    return moved


def _uv() -> list[str]:
    if shutil.which("uv"):
        return ["uv"]
    probe = subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True)
    if probe.returncode:
        print(f"lock: installing {UV} (the resolver) into {sys.prefix}")
        subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", UV], check=True)
    return [sys.executable, "-m", "uv"]


def torch_cuda_stack(uv: list[str], tmp: Path) -> set[str]:
    """The packages PyPI's torch pins for its CUDA build (Linux only): left out of the lock."""
    (tmp / "torch.in").write_text(TORCH + "\n")
    out = tmp / "torch.txt"
    subprocess.run([*uv, "pip", "compile", "--quiet", "--universal", "--python-version", LOWEST_PYTHON, "--no-header",
                    "--no-annotate", str(tmp / "torch.in"), "-o", str(out)], check=True)
    return {pin.name for pin in read_pins(out) if "linux" in pin.marker}


def compile_set(uv: list[str], extras: tuple[str, ...], out: Path, skip: set[str], constraints: Path | None,
                tmp: Path) -> None:
    (tmp / "build.in").write_text("\n".join([TORCH, *BUILD]) + "\n")
    command = [*uv, "pip", "compile", "--quiet", "--universal", "--python-version", LOWEST_PYTHON,
               "--fork-strategy", "fewest", "--no-header", "--no-annotate", str(ROOT / "pyproject.toml"),
               str(tmp / "build.in"), "-o", str(out)]
    command += [arg for extra in extras for arg in ("--extra", extra)]
    command += [arg for name in sorted(skip) for arg in ("--no-emit-package", name)]
    if constraints:
        command += ["-c", str(constraints)]
    subprocess.run(command, check=True, cwd=ROOT)


def header(what: str) -> str:
    return ("# Generated by `make lock` (python scripts/lock.py): do not edit. " + what + "\n"
            f"# Universal: Python >= {LOWEST_PYTHON} on Linux, macOS and Windows (a line with a marker is one platform's).\n"
            "# torch's CUDA libraries are not pinned here: scripts/install.py installs torch on its own.\n")


def write_all() -> dict[str, int]:
    uv = _uv()
    counts = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        skip = torch_cuda_stack(uv, tmp)
        full = tmp / "lock.txt"
        if LOCK.exists():  # the current pins are uv's preferences: only what must move moves
            shutil.copy(LOCK, full)
        for _ in range(3):
            compile_set(uv, EXTRAS, full, skip, None, tmp)
            # A preferred version some Python cannot have forks the package (soupsieve 4.1.3 needs
            # 3.11.5; Debian 12 has 3.11.2): forget the preference, so one version serves every Python.
            names = [pin.name for pin in read_pins(full)]
            forked = {name for name in names if names.count(name) > 1}
            if not forked:
                break
            full.write_text("".join(line + "\n" for line in full.read_text().splitlines() if _name(line) not in forked))
        LOCK.write_text(header(f"Every package of workbench[{','.join(EXTRAS)}], what CI tested.") + full.read_text())
        counts["lock"] = len(read_pins(LOCK))
        for set_name, extras in SETS.items():
            out = REQUIREMENTS / f"{set_name}.txt"
            compile_set(uv, extras, tmp / f"{set_name}.txt", skip, LOCK, tmp)
            text = (tmp / f"{set_name}.txt").read_text()
            if set_name == "dali":  # DALI's own packages only: what the other sets lack
                base = {pin.name for pin in read_pins(REQUIREMENTS / "test.txt")}
                text = "".join(line + "\n" for line in text.splitlines() if _name(line) not in base)
            out.write_text(header(f"The set `{set_name}`: workbench[{','.join(extras)}], at requirements/lock.txt's versions.")
                           + text)
            counts[set_name] = len(read_pins(out))
    ENVIRONMENT.write_text(environment_text(read_pins(REQUIREMENTS / "test.txt")))
    return counts


def environment_text(pins: list[Pin]) -> str:
    lines = [
        "# Generated from requirements/test.txt by `make lock` (python scripts/lock.py): do not edit.",
        "# conda: `conda env create -f environment.yml && conda activate workbench`; then `make learn` / `make test`",
        "# (or `python scripts/install.py learn`) use this environment and find everything installed.",
        "# Every package at the locked version, resolved by pip as conda runs it (no --no-deps): CI checks that",
        "# this pip section resolves (.ci/install_matrix.py). torch==2.13.0 from PyPI is a CUDA build on Linux",
        "# (~2.7 GB): on a Linux machine without an NVIDIA GPU make the environment with python=3.11 and pip only,",
        "# then run `python scripts/install.py learn` in it, which installs PyTorch's CPU build.",
        "name: workbench",
        "channels:",
        "  - conda-forge",
        "dependencies:",
        "  - python=3.11",
        "  - pip",
        "  - pip:",
        *[f'      - "{pin.line()}"' for pin in pins],
        '      - "-e ."',
    ]
    return "\n".join(lines) + "\n"


def _direct(pyproject: dict, extras: tuple[str, ...] = EXTRAS) -> list[str]:
    project = pyproject["project"]
    return project["dependencies"] + [r for name in extras for r in project["optional-dependencies"][name]]


def check() -> list[str]:
    """What is wrong with the committed lock files and environment.yml (empty: nothing)."""
    from packaging.requirements import Requirement

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    problems = []
    lock = read_pins(LOCK)
    pins = {}
    for pin in lock:
        if pin.name in pins and pins[pin.name] != pin.version:
            problems.append(f"{pin.name} is pinned twice in {LOCK.relative_to(ROOT)} ({pins[pin.name]}, {pin.version}): "
                            "one version for every Python and platform (run make lock)")
        pins[pin.name] = pin.version
    for text in _direct(pyproject):
        req = Requirement(text)
        pinned = pins.get(_name(req.name))
        if pinned is None:
            problems.append(f"{req.name}: in pyproject.toml, not in {LOCK.relative_to(ROOT)}: run make lock")
        elif not req.specifier.contains(pinned, prereleases=True):
            problems.append(f"{req.name}=={pinned} in the lock does not satisfy pyproject's {req}: run make lock")
    for set_name, extras in SETS.items():
        path = REQUIREMENTS / f"{set_name}.txt"
        if not path.exists():
            problems.append(f"{path.relative_to(ROOT)} is missing: run make lock")
            continue
        names = set()
        for pin in read_pins(path):
            names.add(pin.name)
            if pins.get(pin.name) != pin.version:
                problems.append(f"{path.relative_to(ROOT)}: {pin.name}=={pin.version}, the lock has "
                                f"{pins.get(pin.name, 'no such pin')}: run make lock")
        wanted = {_name(Requirement(r).name) for r in _direct(pyproject, extras)} | {"setuptools", "pip"}
        if set_name != "dali" and wanted - names:
            problems.append(f"{path.relative_to(ROOT)} lacks {', '.join(sorted(wanted - names))}: run make lock")
    if ENVIRONMENT.read_text() != environment_text(read_pins(REQUIREMENTS / "test.txt")):
        problems.append("environment.yml does not follow requirements/test.txt: run make lock")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="check the committed lock files and environment.yml")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        print("\n".join(problems) or "requirements/*.txt and environment.yml are current")
        return 1 if problems else 0
    os.environ.setdefault("UV_INDEX_URL", "https://pypi.org/simple")  # what learners resolve against
    counts = write_all()
    print("wrote " + ", ".join(f"requirements/{name}.txt ({n} pins)" for name, n in counts.items()) + " and environment.yml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
