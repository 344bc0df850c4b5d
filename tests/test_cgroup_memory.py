"""free_bytes() holds a run to the memory limit of the process's own cgroup, v2 or v1, and its
parents' (the room's JupyterHub puts each learner in a cgroup of their own: room/)."""

from workbench.planner.fit import cgroup_memory_left

GiB = 2**30


def _write(folder, **files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text + "\n")


def test_v2_reads_the_own_cgroup_and_its_parents(tmp_path):
    (tmp_path / "cgroup").write_text("0::/workbench-room/learner01\n")
    root = tmp_path / "sys"
    _write(root / "workbench-room", memory_max=str(8 * GiB), memory_current=str(5 * GiB))
    _write(root / "workbench-room/learner01", memory_max=str(4 * GiB), memory_current=str(1 * GiB))
    assert sorted(cgroup_memory_left(str(tmp_path / "cgroup"), str(root))) == [3 * GiB, 3 * GiB]


def test_v2_max_means_no_limit(tmp_path):
    (tmp_path / "cgroup").write_text("0::/a\n")
    _write(tmp_path / "sys/a", memory_max="max", memory_current=str(GiB))
    assert cgroup_memory_left(str(tmp_path / "cgroup"), str(tmp_path / "sys")) == []


def test_v1_reads_the_memory_tree_only(tmp_path):
    (tmp_path / "cgroup").write_text("5:cpu,cpuacct:/x\n4:memory:/workbench-room/learner02\n0::/\n")
    root = tmp_path / "sys"
    _write(root / "memory/workbench-room/learner02", memory_limit_in_bytes=str(2 * GiB),
           memory_usage_in_bytes=str(GiB // 2))
    _write(root / "cpu/x", memory_limit_in_bytes="1", memory_usage_in_bytes="0")  # not a memory tree
    assert cgroup_memory_left(str(tmp_path / "cgroup"), str(root)) == [GiB + GiB // 2]


def test_no_proc_file_no_figures(tmp_path):
    assert cgroup_memory_left(str(tmp_path / "missing"), str(tmp_path)) == []
