"""A run's timed steps do not pay for a full garbage collection of the kernel's heap
(workbench/core/measure/heap.py): the objects alive when training begins are frozen until it ends."""

import gc

import pytest

import workbench as wb
from workbench.core.measure.heap import frozen_heap
from workbench.core.views.sinks import RecordingSink

CFG = wb.RunConfig(model="mlp", steps=4, log_every=2, eval_samples=0, preset="cpu-quick")


class FreezeSeen(RecordingSink):
    """Records how many objects the collector skipped at each log step."""

    def __init__(self):
        super().__init__()
        self.frozen = []

    def log(self, record):
        super().log(record)
        self.frozen.append(gc.get_freeze_count())


def test_a_run_freezes_the_heap_while_it_steps_and_hands_it_back():
    assert gc.get_freeze_count() == 0
    sink = FreezeSeen()
    wb.run(CFG, sinks=[sink])
    assert len(sink.frozen) == 2 and all(n > 1000 for n in sink.frozen)  # the interpreter's own objects, at least
    assert gc.get_freeze_count() == 0


def test_a_hand_loop_that_fails_hands_the_heap_back():
    import torch

    model = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match="bad batch"):
        with wb.monitor(model, steps=3, sinks=[]) as mon:
            with mon.step(samples=1):
                assert gc.get_freeze_count() > 0
                raise ValueError("bad batch")
    assert gc.get_freeze_count() == 0


def test_a_heap_frozen_by_someone_else_stays_theirs():
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with frozen_heap():
            pass
        wb.run(CFG, sinks=[])
        assert gc.get_freeze_count() > before // 2  # not unfrozen by the run (some frozen objects die meanwhile)
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
