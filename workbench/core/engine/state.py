"""The training loop's state: its recorder and data position, its losses on the device.

`LoopState` is the run's `Recorder` (so an interrupted run still returns its curve) plus
where the loop is in its data; `LossWindow` holds the losses between log steps on the
device; `evaluate` scores the trained model.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import torch
import torch.nn.functional as F

from workbench.core.config import RunConfig
from workbench.core.data import build_dataloader
from workbench.core.engine import resume
from workbench.core.measure.meters import LOSS_WINDOW_SLOTS
from workbench.core.measure.recorder import Recorder


class LoopState(Recorder):
    """The loop's recorder (`measure.recorder.Recorder`: what it has measured so far), and
    where the loop is: a resumed run carries on its data position and its id."""

    def __init__(self, **recorder: Any) -> None:
        super().__init__(**recorder)
        self.data_position = resume.DataPosition()  # epoch and batch: where a resumed run goes on
        self.run_id = uuid.uuid4().hex[:12]
        """Names this run's saves: a resumed run takes the id it saved, and a run never
        saves into a folder that holds another run's steps."""


class LossWindow:
    """The micro-batch losses since the last log step, held on the device: adding one copies
    it into a slot (one tiny kernel, no sync, no reference to the loss kept). `close()` (at the
    log step, where the loop syncs anyway) gives the window's mean and, when a loss was not
    finite, where the first one was.

    Its memory is constant: `slots` floats plus three running figures, allocated once. A window
    longer than the slots folds them into the running figures (finite sum, finite count, first
    non-finite position) on the device, so the first non-finite position stays exact. Constant,
    because the estimate replays the step and must find the same live bytes at every step of
    every interval (a list of held losses would grow by a tensor each micro-batch).

    Example:
        >>> window = LossWindow(torch.device("cpu"), slots=2)
        >>> for x in (1.0, 3.0, float("nan"), 5.0):
        ...     window.add(torch.tensor(x))
        >>> window.close()  # mean of 1, 3 and 5; 3 finite; the third (index 2) was not
        (3.0, 3, 2)
    """

    def __init__(self, device: torch.device, *, slots: int = LOSS_WINDOW_SLOTS) -> None:
        self.device = device
        self._slots = torch.zeros(slots, device=device)
        self._running = torch.tensor([0.0, 0.0, math.inf], device=device)  # finite sum, count, first bad
        self._filled = 0  # slots holding this window's latest losses
        self._folded = 0  # losses already folded into _running

    def add(self, loss: torch.Tensor) -> None:
        if self._filled == len(self._slots):
            self._fold()
        self._slots[self._filled] = loss.detach()
        self._filled += 1

    def _stats(self) -> torch.Tensor:
        """[sum of the finite losses, how many, index of the first non-finite (inf: none)], the
        running figures included."""
        losses = self._slots[: self._filled]
        finite = torch.isfinite(losses)
        positions = torch.arange(self._filled, device=self.device, dtype=torch.float32) + self._folded
        mine = torch.stack([torch.where(finite, losses, 0.0).sum(), finite.sum().float(),
                            torch.where(finite, math.inf, positions).min()])
        return torch.stack([mine[0] + self._running[0], mine[1] + self._running[1],
                            torch.minimum(mine[2], self._running[2])])

    def _fold(self) -> None:
        self._running.copy_(self._stats())
        self._folded += self._filled
        self._filled = 0

    def close(self, gather: Any = None) -> tuple[float, int, int | None]:
        """(mean loss, finite micro-batches, index of the first non-finite one or None) over
        the window, which then starts afresh. The mean is of the finite losses (nan if none).
        One device sync. `gather` (accelerator.gather) joins every process's figures first, so
        all processes see the same numbers and stop, or go on, together."""
        count = self._folded + self._filled
        if count == 0:
            return float("nan"), 0, None
        stats = self._stats()
        rows = (stats if gather is None else gather(stats)).view(-1, 3).tolist()  # the sync
        self._running[:2].zero_()
        self._running[2].fill_(math.inf)
        self._filled = self._folded = 0
        finite_rows = [row for row in rows if row[1]]
        mean = sum(r[0] / r[1] for r in finite_rows) / len(finite_rows) if finite_rows else float("nan")
        first_bad = min(row[2] for row in rows)
        return mean, int(sum(row[1] for row in rows)), None if first_bad == float("inf") else int(first_bad)


@torch.no_grad()
def evaluate(accelerator, model, dataset, cfg: RunConfig, *, collate_fn=None) -> tuple[float, float]:
    """Held-out loss and accuracy, in fp32 with autocast off (reduced precision is
    for training speed; the reported accuracy should not depend on it). `collate_fn`: the
    data's own (a dataset passed in), None for torch's default.

    Batches of the training micro-batch, so that a run sized to fit (the planner's micro-batch)
    does not run out of memory at its end. At 64 it could: on an H200, notebook 07's bf16 4 x 4
    plan (GPT, 85.6M parameters, 512 tokens) peaked at 4,056,432,128 bytes, within 1% of the
    replayed evaluation at 64 sequences (fp32, no grad: 4,017,502,208 with the model state) and
    1.25x the replayed training step (3,238,283,776); at 4 sequences that evaluation needs 1.28 GB."""
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    plain.eval()
    # Uneven shares across processes: with accelerate's default (even_batches) the last
    # processes would repeat samples to even out, and the reduced sums would count them.
    even_batches, accelerator.even_batches = accelerator.even_batches, False
    loader = accelerator.prepare_data_loader(
        build_dataloader(dataset, batch_size=cfg.batch_size, shuffle=False, seed=cfg.seed, drop_last=False,
                         collate_fn=collate_fn)
    )
    accelerator.even_batches = even_batches
    loss_sum = torch.zeros((), device=accelerator.device, dtype=torch.float64)
    correct = torch.zeros((), device=accelerator.device, dtype=torch.float64)
    count = torch.zeros((), device=accelerator.device, dtype=torch.float64)
    for batch in loader:
        logits = plain(batch["inputs"]).float()
        labels = batch["labels"]
        loss_sum += F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="sum")
        correct += (logits.argmax(-1) == labels).sum()
        count += labels.numel()
    totals = accelerator.reduce(torch.stack([loss_sum, correct, count]), reduction="sum")
    loss_sum, correct, count = totals.tolist()
    return loss_sum / count, correct / count
