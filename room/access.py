"""Let the room's learners reach the Python and the repository the hub runs, and nothing more.

A venv whose Python lives under /root (pyenv, conda in root's home: common on cloud boxes and in
containers) cannot be run by another user: /root is 0700. The room grants its group `workbench-room`
search (x) on exactly the folders on the way that others cannot pass, by a POSIX ACL entry (the same
as `setfacl -m g:workbench-room:x DIR`, written as the xattr so the `acl` package is not needed):
listing stays forbidden, and no other user gains anything. `make room-reset` removes the entries.
"""

from __future__ import annotations

import grp
import os
import stat
import struct
from pathlib import Path

GROUP = "workbench-room"
_XATTR = "system.posix_acl_access"
_VERSION = 2
_USER_OBJ, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x04, 0x08, 0x10, 0x20
_UNDEFINED_ID = 0xFFFFFFFF


def closed_folders(paths: list[Path]) -> list[Path]:
    """Folders on the way to `paths` that others may not search (no o+x), outermost first."""
    closed: list[Path] = []
    for path in paths:
        for folder in reversed(Path(os.path.realpath(path)).parents):
            if not os.stat(folder).st_mode & stat.S_IXOTH and folder not in closed:
                closed.append(folder)
    return closed


def _acl(mode: int, gid: int) -> bytes:
    """An access ACL equal to `mode` plus search for group `gid` (entries in the kernel's order)."""
    entries = [(_USER_OBJ, (mode >> 6) & 7, _UNDEFINED_ID), (_GROUP_OBJ, (mode >> 3) & 7, _UNDEFINED_ID),
               (_GROUP, 1, gid), (_MASK, ((mode >> 3) & 7) | 1, _UNDEFINED_ID), (_OTHER, mode & 7, _UNDEFINED_ID)]
    return struct.pack("<I", _VERSION) + b"".join(struct.pack("<HHI", *entry) for entry in entries)


def grant(folders: list[Path]) -> list[dict]:
    """Give the room's group search on each folder; what to undo (the folder and its old mode)."""
    gid = grp.getgrnam(GROUP).gr_gid
    done = []
    for folder in folders:
        mode = stat.S_IMODE(os.stat(folder).st_mode)
        os.setxattr(folder, _XATTR, _acl(mode, gid))
        done.append({"folder": str(folder), "mode": mode})
    return done


def revoke(grants: list[dict]) -> None:
    for entry in grants:
        try:
            os.removexattr(entry["folder"], _XATTR)
        except OSError:
            pass  # already gone
        os.chmod(entry["folder"], entry["mode"])
