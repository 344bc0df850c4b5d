"""LiveTensors: bytes of live tensor storages, now and at the peak, tracked op by op."""

from __future__ import annotations

import torch

from workbench.planner.live import CUDA_BLOCK_BYTES, LiveTensors


def test_new_storages_count_once_at_full_size_and_go_when_freed():
    with LiveTensors() as live:
        a = torch.ones(1000)        # 4,000 bytes
        view = a[10:20]             # a view: nothing new
        a.mul_(2)                   # in place: nothing new
        b = a * 2                   # 4,000 more
        del a, view
        c = torch.zeros(10, dtype=torch.float64)  # 80
    assert (live.peak_bytes, live.current_bytes) == (8000, 4080)
    del b, c
    assert live.current_bytes == 0


def test_views_of_tensors_made_before_tracking_are_not_counted_unless_added():
    data = torch.ones(10_000)  # a data set made before tracking: 40,000 bytes
    with LiveTensors() as live:
        sample = data[3]           # indexing one sample is a view of the whole storage
        batch = torch.stack([data[0], data[1]])  # 8 new bytes
    assert live.peak_bytes == 8
    tracked = LiveTensors()
    tracked.add([data])
    assert tracked.current_bytes == 40_000
    del sample, batch


def test_tensors_from_python_data_are_counted():
    with LiveTensors() as live:
        t = torch.tensor([1.0, 2.0, 3.0])  # made outside the dispatcher, handed over by lift_fresh
    assert live.current_bytes == 12
    del t


def test_cuda_rounding_counts_each_storage_in_512_byte_blocks():
    with LiveTensors(round_to=CUDA_BLOCK_BYTES) as live:
        small, odd = torch.ones(1), torch.ones(129)  # 4 and 516 bytes
    assert live.current_bytes == 512 + 1024
    del small, odd


def test_levels_and_marks_record_every_allocation_and_the_moments_named():
    with LiveTensors(levels=True) as live:
        a = torch.ones(10)
        live.mark("after a")
        b = torch.ones(5)
        del a
        live.mark("after b")
    assert live.levels == [40, 60]
    assert [(label, index, level) for label, index, level, _ in live.marks] == [("after a", 1, 40), ("after b", 2, 20)]
    made, size, freed = live.released[0]
    assert size == 40 and made < live.marks[0][3] < freed < live.marks[1][3]
    del b


def test_the_peak_of_a_step_agrees_with_torchs_memtracker():
    from torch.distributed._tools.mem_tracker import MemTracker

    from workbench.core.models import GPT, loss_fn
    from workbench.core.switches.activation_checkpointing import set_activation_checkpointing

    torch.manual_seed(0)
    model = set_activation_checkpointing(GPT(256, 40, n_layer=12, n_head=4, d_model=48), "all")
    x = torch.randint(0, 256, (6, 40))
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        loss_fn(model(x), x).backward()
    model.zero_grad(set_to_none=True)
    memtracker = {str(getattr(k, "value", k)): v for k, v in next(iter(tracker.get_tracker_snapshot("peak").values())).items()}
    live = LiveTensors()
    live.add([*model.parameters(), *model.buffers()])
    with live:
        loss_fn(model(x), x).backward()
    # MemTracker also counts the input batch (made before tracking, 6 x 40 int64 = 1,920 bytes)
    assert memtracker["Total"] - live.peak_bytes == x.numel() * x.element_size()
