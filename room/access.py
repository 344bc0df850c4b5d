"""Let the room's learners reach the Python and the repository the hub runs, and nothing more.

A venv whose Python lives under /root (pyenv, conda in root's home: common on cloud boxes and in
containers) cannot be run by another user: /root is 0700. The room grants its group `workbench-room`
search (x) on exactly the folders on the way that others cannot pass, by a POSIX ACL entry (the same
as `setfacl -m g:workbench-room:x DIR`, written as the xattr so the `acl` package is not needed):
listing stays forbidden, and no other user gains anything. The repository itself is different: the
learners' Python imports the room's code from it (`python -m room.copies`), and an import lists its
folder (a folder that may be searched but not read finds no module: `No module named 'room'`, seen
with a clone in a 0700 folder from `mktemp -d`). A repository folder others may not read and search
gets read and search (r-x) for the group instead. `make room-reset` removes the entries.
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


def unreadable_folders(folders: list[Path]) -> list[Path]:
    """Of `folders` themselves, those others may not both read and search (r-x)."""
    return [Path(os.path.realpath(f)) for f in folders
            if os.stat(f).st_mode & (stat.S_IROTH | stat.S_IXOTH) != stat.S_IROTH | stat.S_IXOTH]


SEARCH, READ_AND_SEARCH = 1, 5  # the group entry's permission bits: x, r-x


def _acl(mode: int, gid: int, perms: int = SEARCH) -> bytes:
    """An access ACL equal to `mode` plus `perms` for group `gid` (entries in the kernel's order)."""
    entries = [(_USER_OBJ, (mode >> 6) & 7, _UNDEFINED_ID), (_GROUP_OBJ, (mode >> 3) & 7, _UNDEFINED_ID),
               (_GROUP, perms, gid), (_MASK, ((mode >> 3) & 7) | perms, _UNDEFINED_ID), (_OTHER, mode & 7, _UNDEFINED_ID)]
    return struct.pack("<I", _VERSION) + b"".join(struct.pack("<HHI", *entry) for entry in entries)


def grant(folders: list[Path], perms: int = SEARCH) -> list[dict]:
    """Give the room's group `perms` on each folder; what to undo (the folder and its old mode)."""
    gid = grp.getgrnam(GROUP).gr_gid
    done = []
    for folder in folders:
        mode = stat.S_IMODE(os.stat(folder).st_mode)
        os.setxattr(folder, _XATTR, _acl(mode, gid, perms))
        done.append({"folder": str(folder), "mode": mode})
    return done


def revoke(grants: list[dict]) -> None:
    """Undo `grant`s, the latest first: a folder granted twice (a second `make room`) recorded the mode
    the first grant left, so its first record, restored last, is the one it had before the room."""
    for entry in reversed(grants):
        try:
            os.removexattr(entry["folder"], _XATTR)
        except OSError:
            pass  # already gone
        os.chmod(entry["folder"], entry["mode"])
