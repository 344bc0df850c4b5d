"""The room's parts that need no root, no accounts and no browser (tests/browser/test_room.py runs the
room itself): the command line, sizes, the cgroup files a learner's limits are written to, the ACL entry."""

import importlib.util
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the repository's room/ (as the hub's config puts it)
from room import access, limits  # noqa: E402

# scripts/ is not a package, and on sys.path its modules would shadow others: load the one file by path
_spec = importlib.util.spec_from_file_location("room_hub", ROOT / "scripts/room_hub.py")
room_hub = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(room_hub)


def test_start_help_runs_as_written():
    command = "python scripts/room_hub.py start --help"
    proc = subprocess.run([sys.executable, *command.split()[1:]], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and "--learners" in proc.stdout and "--memory" in proc.stdout, proc.stderr


@pytest.mark.parametrize("text, size", [("4G", 4 * 2**30), ("1.5GiB", 3 * 2**29), ("512M", 512 * 2**20),
                                        ("1536m", 1536 * 2**20), ("1000", 1000)])
def test_memory_sizes(text, size):
    assert room_hub.parse_bytes(text) == size


def test_a_size_it_cannot_read_is_named_with_the_fix():
    with pytest.raises(room_hub.RoomError, match=r"--memory '4 gigs': write a size such as 4G"):
        room_hub.parse_bytes("4 gigs")


def test_cgroup_v2_limits_are_written_where_the_kernel_reads_them(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert limits.mode(tmp_path) == "cgroup v2"
    (folder,) = limits.prepare("learner01", limits.Limits(cores=1.5, memory_bytes=2**30), "cgroup v2", tmp_path)
    assert folder == tmp_path / "workbench-room/learner01"
    assert (folder / "memory.max").read_text() == str(2**30)
    assert (folder / "cpu.max").read_text() == "150000 100000"
    assert (tmp_path / "workbench-room/cgroup.subtree_control").read_text() == "+memory +cpu"


def test_cgroup_v1_limits_go_to_the_memory_and_cpu_trees(tmp_path):
    for tree in ("memory", "cpu"):
        (tmp_path / tree).mkdir()
    (tmp_path / "memory/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert limits.mode(tmp_path) == "cgroup v1"
    memory, cpu = limits.prepare("learner02", limits.Limits(cores=1, memory_bytes=3 * 2**30), "cgroup v1", tmp_path)
    assert (memory / "memory.limit_in_bytes").read_text() == str(3 * 2**30)
    assert (cpu / "cpu.cfs_quota_us").read_text() == "100000"
    assert limits.remove(tmp_path) != []  # folders with files in them: named, not removed silently


def test_no_cgroup_means_rlimits(tmp_path):
    assert limits.mode(tmp_path) == "rlimit" and limits.folders("x", "rlimit", tmp_path) == []


def test_closed_folders_are_the_ones_others_cannot_pass(tmp_path):
    inner = tmp_path / "closed/open/python"
    inner.mkdir(parents=True)
    os.chmod(tmp_path / "closed", 0o700)
    os.chmod(tmp_path / "closed/open", 0o755)
    assert (tmp_path / "closed") in access.closed_folders([inner])
    assert (tmp_path / "closed/open") not in access.closed_folders([inner])


def test_the_acl_entry_gives_the_group_search_only():
    acl = access._acl(0o700, 1234)
    version, entries = struct.unpack("<I", acl[:4])[0], [struct.unpack("<HHI", acl[i:i + 8]) for i in range(4, len(acl), 8)]
    assert version == 2
    assert entries == [(0x01, 7, 0xFFFFFFFF), (0x04, 0, 0xFFFFFFFF), (0x08, 1, 1234), (0x10, 1, 0xFFFFFFFF),
                       (0x20, 0, 0xFFFFFFFF)]
