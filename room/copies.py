"""The room's notebooks reach each learner without touching their work (at every spawn, and when the
teacher runs `make room-update`).

For each notebook of the room's copies (scripts/learner_copies.py's: no outputs, no solutions), in the
learner's ~/workbench:
- not there: copied;
- there and unchanged since the room delivered it (its hash is the one delivered): replaced by the new
  version, so a learner who has not started it gets the fix silently;
- there and changed by the learner (their answers): kept as it is, and the new version is put beside it
  as `NN_name (update N).ipynb`, to open side by side (as nbgitpuller keeps a learner's edits and
  does not overwrite them).
What was delivered (name -> hash and version) is the room's, in its state folder, not the learner's.

The copying runs as the learner (`python -m room.copies`, started with the learner's uid and gid): a
learner's link planted in their own folder can then lead nowhere they could not write themselves.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write(target: Path, data: bytes) -> None:
    """Whole or not at all: a temporary file in the folder, renamed over the name (never through a link)."""
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=".room-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(temporary, 0o600)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def deliver(copies: Path, folder: Path, delivered: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Bring `folder` up to `copies`; (what is delivered now, {'new'|'updated'|'beside'|'kept': names})."""
    folder.mkdir(mode=0o700, exist_ok=True)
    done: dict[str, list[str]] = {"new": [], "updated": [], "beside": [], "kept": []}
    now = dict(delivered)
    for source in sorted(copies.glob("*.ipynb")):
        data, name = source.read_bytes(), source.name
        new_hash = hashlib.sha256(data).hexdigest()
        target = folder / name
        last = delivered.get(name) or {}
        version = int(last.get("version", 0))
        if target.is_symlink() or (target.exists() and not target.is_file()):
            done["kept"].append(name)  # not a notebook file: leave it to the learner
            continue
        if not target.exists():
            _write(target, data)
            now[name] = {"sha256": new_hash, "version": version + 1 if last else 1}
            done["new"].append(name)
            continue
        if last.get("sha256") == new_hash:
            done["kept"].append(name)  # nothing new for this one
            continue
        mine = digest(target)
        if mine == new_hash:
            now[name] = {"sha256": new_hash, "version": version or 1}
            done["kept"].append(name)
        elif last and mine == last.get("sha256"):
            _write(target, data)  # the learner has not changed it: the fix replaces it
            now[name] = {"sha256": new_hash, "version": version + 1}
            done["updated"].append(name)
        else:
            version += 1
            _write(folder / f"{source.stem} (update {version}).ipynb", data)  # theirs stays as it is
            now[name] = {"sha256": new_hash, "version": version, "beside": True}
            done["beside"].append(name)
    return now, done


def deliver_as(name: str, copies: Path, state: Path, python: str = sys.executable) -> dict[str, list[str]]:
    """As root: deliver `copies` to learner `name`'s ~/workbench, the copying done as the learner;
    what was delivered is kept in <state>/delivered/<name>.json (root's)."""
    import pwd
    import subprocess

    account = pwd.getpwnam(name)
    ledger = state / "delivered" / f"{name}.json"
    ledger.parent.mkdir(mode=0o700, exist_ok=True)
    delivered = ledger.read_text() if ledger.exists() else "{}"
    repo = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run([python, "-m", "room.copies", "--copies", str(copies),
                           "--folder", str(Path(account.pw_dir) / "workbench")],
                          input=delivered, capture_output=True, text=True, timeout=120, cwd=account.pw_dir,
                          user=account.pw_uid, group=account.pw_gid,
                          extra_groups=os.getgrouplist(name, account.pw_gid),  # workbench-room: the ACL that lets them run Python
                          env={"PYTHONPATH": repo, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": account.pw_dir})
    if proc.returncode:
        raise RuntimeError(f"the notebooks could not reach {name}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    answer = json.loads(proc.stdout)
    ledger.write_text(json.dumps(answer["delivered"]))
    ledger.chmod(0o600)
    return answer["done"]


def main(argv: list[str] | None = None) -> int:
    """As the learner: read what was delivered (JSON) on stdin, deliver, print the new state and a report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=Path, required=True)
    parser.add_argument("--folder", type=Path, required=True)
    args = parser.parse_args(argv)
    os.umask(0o077)
    delivered = json.loads(sys.stdin.read() or "{}")
    now, done = deliver(args.copies, args.folder, delivered)
    print(json.dumps({"delivered": now, "done": done}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
