"""What the newest releases would break, before the lock moves to them (`make drift`).

    python scripts/drift.py [--venv .venv-newest] [--out benchmarks/results/drift.json] [-- PYTEST_ARGS]

Installs the workbench with WORKBENCH_UNLOCKED=1 (scripts/install.py: the newest releases pyproject
admits, torch included: TORCH_SPEC, default `torch`) into its own virtualenv, runs the test suite there (unit tests and notebooks,
the cpu-quick preset, as `make test` does), and reports each package whose version differs from
requirements/lock.txt (old -> new) and each test that failed, by name. The report goes to --out as
JSON and to the terminal; the exit status is 0 either way (drift is news, not an error), 2 if the
install itself failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from lock import _name, read_lock  # noqa: E402


def installed(python: Path) -> dict[str, str]:
    out = subprocess.run([str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
                         capture_output=True, text=True, check=True).stdout
    return {_name(p["name"]): p["version"].split("+")[0] for p in json.loads(out)}


def changes(lock: dict[str, str], now: dict[str, str]) -> list[dict[str, str | None]]:
    """Packages of the lock installed at another version in the new environment (a package it
    does not have is an extra it did not ask for: DALI and its libraries)."""
    return [{"package": n, "locked": v, "newest": now[n]} for n, v in lock.items()
            if n in now and now[n] != v and n not in ("setuptools", "wheel")]


def failures(junit: Path) -> list[dict[str, str]]:
    if not junit.exists():
        return []
    failed = []
    for case in ET.parse(junit).iter("testcase"):
        for kind in ("failure", "error"):
            bad = case.find(kind)
            if bad is not None:
                message = (bad.get("message") or "").strip().splitlines()
                # nbval's message is only "Notebook cell execution failed": its last line says why.
                detail = [line.strip() for line in re.sub(r"(\x1b|#x1B)\[[0-9;]*m", "", bad.text or "").splitlines() if line.strip()]
                failed.append({"test": f"{case.get('classname')}::{case.get('name')}", "kind": kind,
                               "message": message[0][:300] if message else "",
                               "detail": detail[-1][:300] if detail else ""})
    return failed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", default=".venv-newest")
    parser.add_argument("--out", default="benchmarks/results/drift.json")
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    venv = (ROOT / args.venv).resolve()
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = dict(os.environ, VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}:{os.environ['PATH']}",
               WORKBENCH_UNLOCKED="1", TORCH_SPEC=os.environ.get("TORCH_SPEC", "torch"))
    env.pop("CONDA_PREFIX", None)
    start = time.time()
    if subprocess.run([str(venv / "bin" / "python"), "scripts/install.py", "test"], cwd=ROOT, env=env).returncode:
        print("drift: the newest releases did not install (see pip's message above)")
        return 2
    installed_s = time.time() - start
    junit = venv / "drift-junit.xml"
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               WORKBENCH_PRESET="cpu-quick")
    run = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-q", f"--junitxml={junit}", *pytest_args],
                         cwd=ROOT, env=env)
    report = {"date": time.strftime("%Y-%m-%d"), "install_s": round(installed_s),
              "tests_s": round(time.time() - start - installed_s), "pytest_exit": run.returncode,
              "changed": changes(read_lock(), installed(venv / "bin" / "python")), "failed": failures(junit)}
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\ndrift against requirements/lock.txt ({out.relative_to(ROOT)}):")
    for c in report["changed"]:
        print(f"  {c['package']}: {c['locked']} -> {c['newest'] or 'not installed'}")
    for f in report["failed"]:
        print(f"  FAILED {f['test']}: {f['message']} {f['detail']}")
    print(f"  {len(report['changed'])} packages moved, {len(report['failed'])} tests failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
