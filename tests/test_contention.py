"""The free-core guard and interleaved timing: what lets timing claims survive a busy machine."""

import os
import time

import pytest

from workbench.lessons.contention import CoreShare, OtherWork, busy_core, core_share, interleaved_speedup, other_work


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_block_that_waits_gets_almost_no_core_and_is_not_free():
    with core_share(threads=1) as share:
        time.sleep(0.2)
    assert share.wall_s >= 0.2 and share.share < 0.2 and not share.free
    assert "not asserted" in share.note()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_sharing_the_hogs_core_halves_the_share_and_the_guard_says_so():
    with busy_core() as hog:
        core = next(iter(os.sched_getaffinity(hog.pid)))
        mine = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {core})  # this process now takes turns with the hog
        try:
            with core_share(threads=1) as share:
                _spin(0.6)
        finally:
            os.sched_setaffinity(0, mine)
        assert hog.poll() is None, "the hog keeps running inside the block"
    assert hog.poll() is not None, "and is stopped after it"
    assert share.share < 0.8 and not share.free


def test_free_is_the_share_against_the_threshold():
    assert CoreShare(cpu_s=0.9, wall_s=1.0).free and "asserted" in CoreShare(cpu_s=0.9, wall_s=1.0).note()
    assert not CoreShare(cpu_s=0.9, wall_s=1.0, threads=2).free  # 45% of two cores
    assert CoreShare().share == 0.0


def test_interleaved_speedup_reads_the_faster_function_as_faster():
    s = interleaved_speedup(lambda: _spin(0.004), lambda: _spin(0.001), rounds=5)
    assert s.ratio > 1.5 and len(s.ratios) == 5
    assert s.baseline_s > s.seconds and s.core.wall_s > 0


def test_interleaved_speedup_rejects_no_rounds():
    with pytest.raises(ValueError, match="rounds=0"):
        interleaved_speedup(lambda: None, lambda: None, rounds=0)


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="other_work reads Linux's /proc/stat")
def test_other_work_counts_this_process_and_its_children_as_its_own():
    import subprocess
    import sys

    # CPU-time bound (not wall-time): the same work however busy the machine is
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"
    with other_work() as own:
        subprocess.run([sys.executable, "-c", burn], check=True)  # a child, like a DataLoader worker
        start = time.process_time()
        while time.process_time() - start < 0.3:  # and this process itself
            pass
    assert own.own_s >= 0.8  # both counted as this process tree's, so not as other work


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="other_work reads Linux's /proc/stat")
def test_other_work_sees_a_busy_core():
    with busy_core():
        time.sleep(0.3)
        with other_work() as busy:
            time.sleep(1.0)
    # the hog alone would read ~1 core; on a machine loaded by others it still gets a good share
    assert busy.cpu_s >= 0.3 and busy.cores >= 0.3 and "core(s) busy meanwhile" in str(busy)


def test_other_work_is_the_machine_busy_time_minus_this_process_trees(monkeypatch):
    from workbench.lessons import contention

    machine, own = iter([100.0, 103.0]), iter([10.0, 11.5])
    monkeypatch.setattr(contention, "_machine_busy_s", lambda: next(machine))
    monkeypatch.setattr(contention, "_own_tree_s", lambda: next(own))
    with other_work() as measured:
        pass
    assert measured.cpu_s == pytest.approx(1.5) and measured.own_s == pytest.approx(1.5)
    assert not OtherWork(cpu_s=1.5, wall_s=2.0).quiet


def test_other_work_unknown_counts_as_quiet():
    unknown = OtherWork(cpu_s=None, wall_s=1.0)
    assert unknown.cores is None and unknown.quiet and "unknown" in str(unknown)
    assert not OtherWork(cpu_s=0.5, wall_s=1.0).quiet and OtherWork(cpu_s=0.2, wall_s=1.0).quiet


def test_a_spawned_parallel_speedup_child_imports_no_torch():
    # Under spawn (macOS, Windows) each of parallel_speedup's nine children imports the module its
    # target lives in: kept free of torch, a child starts in a tenth of a second, not three.
    import subprocess
    import sys

    probe = ("import sys, workbench.lessons.contention as c; "
             "assert c._spin.__module__ == 'workbench.lessons.contention'; print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
