"""Metric math on hand-picked numbers; memory readings on this machine."""

import mmap

import pytest

from workbench.core.measure.meters import MemoryMeter, Throughput, mfu


def test_throughput_divides_counts_by_the_interval():
    t = Throughput.over(seconds=2.0, steps=10, samples=640, tokens=81920, flops=3e12)
    assert (t.step_time_s, t.samples_per_sec, t.tokens_per_sec, t.tflops_per_sec) == (0.2, 320.0, 40960.0, 1.5)


def test_throughput_without_tokens_or_flops_says_none():
    t = Throughput.over(seconds=1.0, steps=1, samples=8, tokens=None, flops=None)
    assert t.tokens_per_sec is None and t.tflops_per_sec is None


def test_throughput_refuses_an_empty_interval():
    with pytest.raises(ValueError, match="positive interval"):
        Throughput.over(seconds=0.0, steps=1, samples=1, tokens=None, flops=None)


def test_mfu_is_achieved_over_peak():
    assert mfu(494.5, 989e12) == pytest.approx(0.5)
    assert mfu(None, 1e12) is None and mfu(1.0, None) is None


def test_cpu_meter_reads_rss_and_a_peak_that_resets():
    meter = MemoryMeter("cpu")
    assert meter.kind == "process RSS" and meter.reserved_bytes() is None
    meter.reset_peak()
    before = meter.peak_bytes()
    # 64 MiB of fresh anonymous pages, each touched. Not a tensor: in a process that has made and
    # freed large tensors (an xdist worker late in its run), the allocator hands back memory still
    # resident, and RSS did not move (CI: VmHWM 1,528,938,496 before and after torch.ones of 64 MiB).
    big = mmap.mmap(-1, 64 * 2**20)
    for page in range(0, len(big), mmap.PAGESIZE):
        big[page] = 1
    after = meter.peak_bytes()
    assert meter.current_bytes() > 0
    if meter.peak_kind == "process VmHWM":  # reset per phase (Linux, clear_refs writable)
        assert after - before >= 60 * 2**20
    big.close()


def test_a_peak_that_cannot_be_reset_says_it_is_the_one_since_the_process_started(monkeypatch):
    from workbench.core.measure import meters

    meter = MemoryMeter("cpu")
    if meter.peak_kind != "process VmHWM":
        pytest.skip(f"no per-phase peak to lose here ({meter.peak_kind})")

    def forbidden(*args, **kwargs):  # a container with /proc read-only
        raise PermissionError("[Errno 13] Permission denied: '/proc/self/clear_refs'")

    monkeypatch.setattr(meters, "open", forbidden, raising=False)
    meter.reset_peak()
    assert meter.peak_kind == "process VmHWM since it started (/proc/self/clear_refs not writable)"
