"""The install matrix: the lock installs where learners are, checked without installing (CI, ~1-3 min).

    python .ci/install_matrix.py                      # (1): what .ci/run runs, ~0.5-1 min
    python .ci/install_matrix.py --only environment   # (2): pip's full resolution, ~6 min here
    python .ci/install_matrix.py --only debian        # (3): a non-root learner's dry run, ~3-4 min here

(1) Every pin of requirements/lock.txt that applies to a target (its marker evaluated for that
    target, not for this machine) has a wheel there, not yanked, whose Requires-Python admits the
    target's Python: Linux x86_64 with the lowest claimed Python (3.11.0, glibc 2.35: Ubuntu 22.04,
    Debian 12), macOS 14 arm64 and Windows x86_64 with 3.12, Linux x86_64 with 3.13. Read from the
    index's JSON file lists (one request a package, wheel tags from the file names). Why not pip's
    `install --dry-run --platform ...`: the index here serves no PEP 658 metadata (checked: none of
    numpy's 4,415 files, nor torch's, nor pip's, carry `core-metadata`), so pip downloads every whole
    wheel to read it, ~2 GB for the four targets; and pip evaluates the lock's markers for the machine
    it runs on (a Linux host checking Windows would want uvloop, which Windows never installs).
    The lock's versions are consistent with each other on every target by construction: one
    universal resolution (scripts/lock.py, uv); `pip check` after each real install checks it again.
(2) environment.yml's pip section resolves with pip's own resolver (no --no-deps) for this machine's
    Python 3.11, as `conda env create` runs it: `pip install --dry-run --ignore-installed -r` those
    lines. conda itself is not checked (neither conda nor the conda-forge channel is reachable here;
    the conda part is only `python=3.11` and `pip`). Needs a CPU torch wheel pip can find (root's pip
    config here): PyPI's torch==2.13.0 for Linux is the CUDA build, whose libraries pip would download.
(3) A learner who is not root, with Debian's own python3 and no pip configuration: a fresh clone's
    `python3 scripts/install.py learn --dry-run` (a throw-away venv, pip 26 installed into it, every pin
    of requirements/learn.txt found for Python 3.11.2, torch's command said, nothing installed). Needs
    root (to add the user `wb-learner`) and Debian's /usr/bin/python3 with python3-venv.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.markers import Marker
from packaging.specifiers import SpecifierSet
from packaging.tags import compatible_tags, cpython_tags, mac_platforms
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "lock.txt"
INDEX = os.environ.get("WORKBENCH_MATRIX_INDEX", "https://pypi.org/simple")


def _linux(arch: str, glibc_minor: int) -> list[str]:
    legacy = [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]  # = glibc 2.17, 2.12, 2.5
    return [f"manylinux_2_{m}_{arch}" for m in range(glibc_minor, 4, -1)] + legacy


TARGETS = {
    # name: (python version, platform tags, marker environment)
    "linux-x86_64-py3.11": ((3, 11, 0), _linux("x86_64", 35),
                            {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"}),
    "macos-arm64-py3.12": ((3, 12, 0), list(mac_platforms((14, 0), "arm64")),
                           {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64", "os_name": "posix"}),
    "windows-amd64-py3.12": ((3, 12, 0), ["win_amd64"],
                             {"sys_platform": "win32", "platform_system": "Windows", "platform_machine": "AMD64", "os_name": "nt"}),
    "linux-x86_64-py3.13": ((3, 13, 0), _linux("x86_64", 35),
                            {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"}),
}


def read_pins(path: Path) -> list[tuple[str, str, str]]:
    """(name, version, marker) per pin, read as the set-up reads them (scripts/install.py)."""
    spec = importlib.util.spec_from_file_location("workbench_install_script", ROOT / "scripts" / "install.py")
    install = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = install  # its dataclasses look their module up there
    spec.loader.exec_module(install)
    return [tuple(pin) for pin in install.read_pins(path)]


# A package's file list, kept a day: the pinned versions' files do not change (a yank would show a day late).
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "workbench" / "index-files"


def files_of(name: str) -> list[dict]:
    cached = CACHE / f"{name}.json"
    if cached.is_file() and time.time() - cached.stat().st_mtime < 86400:
        return json.loads(cached.read_text())
    request = urllib.request.Request(f"{INDEX}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    for attempt in range(3):
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                files = [{k: f.get(k) for k in ("filename", "requires-python", "yanked")} for f in json.load(answer)["files"]]
            CACHE.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(files))
            return files
        except OSError:
            if attempt == 2:
                raise
            time.sleep(2)
    return []


def marker_env(python: tuple[int, int, int], env: dict[str, str]) -> dict[str, str]:
    return {**env, "python_version": f"{python[0]}.{python[1]}", "python_full_version": ".".join(map(str, python)),
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "implementation_version": ".".join(map(str, python)), "platform_release": "", "platform_version": ""}


def wheel_problems(pins: list[tuple[str, str, str]], listing: dict[str, list[dict]]) -> dict[str, list[str]]:
    problems = {}
    for target, (python, platforms, env) in TARGETS.items():
        tags = set(cpython_tags(python[:2], platforms=platforms)) | set(
            compatible_tags(python[:2], f"cp{python[0]}{python[1]}", platforms))
        environment = marker_env(python, env)
        bad = []
        for name, version, marker in pins:
            if marker and not Marker(marker).evaluate(environment):
                continue
            ok, why = False, f"{name}=={version}: no file of that version on the index"
            for f in listing[name]:
                if not f["filename"].endswith(".whl") or f"-{version}-" not in f["filename"]:
                    continue  # (a wheel's name holds its normalized version: most files are skipped unparsed)
                try:
                    wname, wversion, _, wtags = parse_wheel_filename(f["filename"])
                except Exception:
                    continue
                if wversion != Version(version) or f.get("yanked"):
                    continue
                why = f"{name}=={version}: no wheel for {target}"
                if not set(wtags) & tags:
                    continue
                requires = f.get("requires-python")
                if requires and not SpecifierSet(requires).contains(".".join(map(str, python)), prereleases=True):
                    why = f"{name}=={version}: its wheels need Python {requires}"
                    continue
                ok = True
                break
            if not ok:
                bad.append(why)
        problems[target] = bad
    return problems


def check_wheels() -> bool:
    start = time.time()
    pins = read_pins(LOCK)
    names = sorted({name for name, _, _ in pins})
    with ThreadPoolExecutor(16) as pool:
        listing = dict(zip(names, pool.map(files_of, names)))
    problems = wheel_problems(pins, listing)
    for target, bad in problems.items():
        applicable = sum(1 for _, _, m in pins if not m or Marker(m).evaluate(marker_env(TARGETS[target][0], TARGETS[target][2])))
        print(f"(1) {target}: {applicable - len(bad)}/{applicable} pins have a wheel" + ("" if not bad else ": " + "; ".join(bad)))
    print(f"(1) {len(pins)} pins of {LOCK.relative_to(ROOT)}, {len(names)} index pages read in {time.time() - start:.0f} s")
    return not any(problems.values())


def environment_pip_lines() -> list[str]:
    lines, inside = [], False
    for raw in (ROOT / "environment.yml").read_text().splitlines():
        if raw.strip() == "- pip:":
            inside = True
            continue
        if inside and raw.strip().startswith("- "):
            lines.append(raw.strip()[2:].strip().strip('"'))
    return lines


def check_environment_yml() -> bool | None:
    start = time.time()
    lines = environment_pip_lines()
    torch = next((line for line in lines if line.startswith("torch==")), "")
    if not local_cpu_torch(torch):
        print(f"(2) environment.yml: skipped: pip's configuration here finds no local CPU wheel for {torch} "
              "(PyPI's Linux torch is the CUDA build: pip would download its ~2.7 GB of libraries)")
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--dry-run",
                               "--ignore-installed", "--quiet", "--report", "-", "-r", f.name],
                              cwd=ROOT, capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if done.returncode:
        print("(2) environment.yml's pip section does not resolve:\n" + done.stderr.strip()[-3000:])
        return False
    installs = json.loads(done.stdout)["install"]
    pinned = {canonicalize_name(line.split("==")[0]) for line in lines if "==" in line}
    extra = sorted(canonicalize_name(i["metadata"]["name"]) for i in installs
                   if canonicalize_name(i["metadata"]["name"]) not in pinned | {"torch-workbench"})
    print(f"(2) environment.yml: pip resolves its {len(lines)} lines for Python "
          f"{'.'.join(map(str, sys.version_info[:3]))} to {len(installs)} packages"
          + (f" ({len(extra)} not pinned there: {', '.join(extra)})" if extra else ", every one pinned there")
          + f", {time.time() - start:.0f} s")
    return not extra or all(n.startswith(("nvidia-", "cuda-", "triton")) for n in extra)


def local_cpu_torch(torch: str) -> bool:
    """Whether pip here finds torch's locked version as a local CPU wheel (a find-links folder)."""
    version = torch.partition("==")[2]
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    links = re.findall(r"find-links='([^']+)'", out) + os.environ.get("PIP_FIND_LINKS", "").split()
    for folder in (Path(p.removeprefix("file://")) for link in links for p in link.split()):
        if folder.is_dir() and any(folder.glob(f"torch-{version}+cpu-*.whl")):
            return True
    return False


def check_debian_learner() -> bool | None:
    start = time.time()
    debian = Path("/usr/bin/python3")
    if os.geteuid() != 0 or not debian.exists() or not shutil.which("runuser"):
        print("(3) Debian learner: skipped (needs root, /usr/bin/python3 and runuser)")
        return None
    user = "wb-learner"
    if subprocess.run(["id", user], capture_output=True).returncode:
        subprocess.run(["useradd", "-m", user], check=True)
    home = Path(f"/home/{user}")
    clone = home / "workbench"
    shutil.rmtree(clone, ignore_errors=True)
    # A copy of this checkout's files as git has them (a clone of a root-owned repository would need
    # git's safe.directory for the learner): what a learner's `git clone` gives.
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for rel in filter(None, files):
        src = ROOT / rel.decode()
        if src.is_file():
            dst = clone / rel.decode()
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    subprocess.run(["chown", "-R", f"{user}:{user}", str(clone)], check=True)
    env = ["env", "-i", f"HOME={home}", f"USER={user}", "LANG=C.UTF-8", "PATH=/usr/local/bin:/usr/bin:/bin",
           "PIP_CONFIG_FILE=/dev/null"]
    done = subprocess.run(["runuser", "-u", user, "--", *env, str(debian), "scripts/install.py", "learn", "--dry-run"],
                          cwd=clone, capture_output=True, text=True)
    said = [line for line in done.stdout.splitlines() if line.startswith(("install:", "would run"))]
    ok = done.returncode == 0 and any("pip found every pin" in line for line in said)
    print(f"(3) Debian learner ({user}, {subprocess.run([str(debian), '-V'], capture_output=True, text=True).stdout.strip()}, "
          f"no pip config): install.py learn --dry-run {'passed' if ok else 'FAILED'} in {time.time() - start:.0f} s")
    for line in said if ok else (done.stdout + done.stderr).strip().splitlines()[-25:]:
        print(f"    {line[:300]}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["wheels", "environment", "debian"], help="run one check")
    args = parser.parse_args(argv)
    checks = {"wheels": check_wheels, "environment": check_environment_yml, "debian": check_debian_learner}
    # (2) by pip's resolver took 324-352 s here (pip reads each of ~190 whole wheels for its metadata):
    # past CI's budget for this script (~3 min). In CI the same claim is held by two cheaper facts:
    # `scripts/lock.py --check` (environment.yml's pip lines are requirements/test.txt's pins, and
    # `-e .`) and the set-up's `pip check` after installing exactly those pins (every requirement of
    # every installed package met): a complete, consistent, exactly pinned set leaves pip nothing to choose.
    # (3) took 204 s and 251 s here (pip reads each of ~150 whole wheels, cached or not): past the
    # budget too, so it runs on request (--only debian), and by hand before a release.
    default = ("wheels",)
    start = time.time()
    results = {name: check() for name, check in checks.items() if (args.only or name in default) and args.only in (None, name)}
    failed = [name for name, ok in results.items() if ok is False]
    print(f"install matrix: {len(results) - len(failed)} passed, {len(failed)} failed "
          f"({', '.join(f'{n}: ' + ('skipped' if ok is None else 'ok' if ok else 'FAILED') for n, ok in results.items())}) "
          f"in {time.time() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
