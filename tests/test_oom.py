"""Reading out-of-memory messages, and run()'s simulated memory budget and OOM path."""

from __future__ import annotations

import pytest
import torch

from workbench import ConfigError, RunConfig, run
from workbench.core.measure.oom import check_budget, format_size, oom_message, parse_oom, parse_size

GiB, MiB = 2**30, 2**20
SEED = ("RuntimeError: CUDA out of memory. Tried to allocate 2.34 GiB (GPU 0; 40.00 GiB total capacity; "
        "32.54 GiB already allocated; 1.25 GiB free; 34.00 GiB reserved)")
CURRENT = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of "
           "14.57 GiB of which 1.58 GiB is free. Process 2493055 has 12.02 GiB memory in use. Including non-PyTorch "
           "memory, this process has 966.00 MiB memory in use. Of the allocated memory 734.07 MiB is allocated by "
           "PyTorch, and 33.93 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
           "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def test_the_seeds_message_reads_as_40_gib_with_32_54_allocated_and_2_34_requested():
    r = parse_oom(SEED)
    assert (r.format, r.device) == ("torch<2.1", "GPU 0")
    assert (r.total_bytes, r.reserved_bytes) == (40 * GiB, 34 * GiB)
    assert (r.allocated_bytes, r.free_bytes, r.requested_bytes) == (
        round(32.54 * GiB), round(1.25 * GiB), round(2.34 * GiB))
    assert r.shortfall_bytes == round(2.34 * GiB) - round(1.25 * GiB)
    assert r.outside_pytorch_bytes == 40 * GiB - round(1.25 * GiB) - 34 * GiB  # context, other processes


def test_the_current_torch_message_reads_with_reserved_as_allocated_plus_unallocated():
    r = parse_oom(CURRENT)
    assert (r.format, r.device, r.simulated) == ("torch>=2.1", "GPU 0", False)
    assert (r.requested_bytes, r.total_bytes, r.free_bytes) == (
        round(1.95 * GiB), round(14.57 * GiB), round(1.58 * GiB))
    assert r.allocated_bytes == round(734.07 * MiB)
    assert r.reserved_bytes == round(734.07 * MiB) + round(33.93 * MiB)


def test_sizes_print_like_torchs_allocator_and_read_back():
    assert [format_size(n) for n in (512, 1024, 1025, MiB, MiB + 1, GiB, 3 * GiB)] == [
        "512 bytes", "1024 bytes", "1.00 KiB", "1024.00 KiB", "1.00 MiB", "1024.00 MiB", "3.00 GiB"]
    assert parse_size("2.34 GiB") == round(2.34 * GiB) and parse_size("512 bytes") == 512
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


def test_a_written_message_reads_back():
    text = oom_message(requested=3 * MiB, total=GiB, free=MiB, allocated=500 * MiB, reserved=600 * MiB)
    r = parse_oom(text)
    assert (r.requested_bytes, r.total_bytes, r.free_bytes, r.allocated_bytes, r.reserved_bytes) == (
        3 * MiB, GiB, MiB, 500 * MiB, 600 * MiB)


def test_text_that_is_not_an_oom_gets_one_clear_line():
    for bad in ("CUDA error: device-side assert triggered", ""):
        with pytest.raises(ValueError, match="not an out-of-memory message") as info:
            parse_oom(bad)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="without the device figures"):
        parse_oom("CUDA out of memory. Tried to allocate 2.00 MiB.")
    with pytest.raises(ValueError, match="as text"):
        parse_oom(None)  # type: ignore[arg-type]


def test_check_budget_raises_torchs_oom_that_accelerate_recognises():
    from accelerate.utils.memory import should_reduce_batch_size

    check_budget(10 * MiB, model_state_bytes=4 * MiB, activation_bytes=6 * MiB)  # exactly fits
    with pytest.raises(torch.OutOfMemoryError) as info:
        check_budget(10 * MiB, model_state_bytes=4 * MiB, activation_bytes=6 * MiB + 1)
    assert should_reduce_batch_size(info.value)
    r = parse_oom(str(info.value))
    assert r.simulated and (r.total_bytes, r.allocated_bytes, r.free_bytes) == (10 * MiB, 4 * MiB, 6 * MiB)


def test_config_rejects_a_budget_that_is_not_a_positive_whole_number():
    with pytest.raises(ConfigError, match="memory_budget_bytes=0 must be at least 1"):
        RunConfig(memory_budget_bytes=0)
    with pytest.raises(ConfigError, match="memory_budget_bytes must be"):
        RunConfig(memory_budget_bytes="16MiB")  # type: ignore[arg-type]


def test_a_run_over_its_simulated_budget_ends_oom_and_the_next_run_works():
    over = run(RunConfig(model="mlp", steps=3, eval_samples=0, memory_budget_bytes=MiB), sinks=[])
    assert (over.status, over.steps_done, over.accuracy) == ("oom", 1, None)
    m = over.memory
    counted = m.parameter_bytes + m.gradient_bytes + m.optimizer_state_bytes + m.activation_bytes
    r = parse_oom(over.message)
    assert r.simulated and r.total_bytes == MiB
    assert abs(r.allocated_bytes + r.requested_bytes - counted) < 0.01 * counted  # sizes print rounded
    assert f"need {counted:,} bytes" in over.message  # and exactly, in the note
    fits = run(RunConfig(model="mlp", steps=3, eval_samples=0, memory_budget_bytes=counted), sinks=[])
    assert fits.status == "ok" and fits.steps_done == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: a real OOM")
def test_a_real_cuda_oom_inside_run_ends_oom_with_memory_freed():
    free, _ = torch.cuda.mem_get_info()
    # A GPT whose saved activations alone exceed the free memory: 8 layers, seq 1024.
    cfg = RunConfig(model="gpt", device="cuda", steps=2, eval_samples=0, seq_len=1024,
                    dims={"n_layer": 8, "n_head": 8, "d_model": 1024},
                    batch_size=max(1, int(free // (8 * 1024 * 1024 * 1024 * 40))) + 64)
    result = run(cfg, sinks=[])
    assert result.status == "oom" and "out of memory" in result.message
    assert torch.cuda.memory_allocated() < 64 * MiB  # model, optimizer and activations freed
    assert run(RunConfig(model="mlp", device="cuda", steps=2, eval_samples=0), sinks=[]).status == "ok"
