"""What the training loop has measured, and how it becomes a RunResult.

`LoopState` accumulates as the loop runs, so an interrupted run still returns its
curve; `build_result` turns it into rates over the timed steps (the probe step
excluded) plus the exact byte counts; `evaluate` scores the trained model.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from workbench.engine import resume
from workbench.core.config import RunConfig
from workbench.measure.counters import gradient_bytes, optimizer_state_bytes, parameter_bytes
from workbench.measure.meters import Throughput, mfu
from workbench.measure.result import MemoryBreakdown, RunResult


class LoopState:
    """What the loop has measured so far; partial results survive an interruption."""

    def __init__(self) -> None:
        self.step = 0
        self.loss_steps: list[int] = []
        self.losses: list[float] = []
        self.interval_times: list[float] = []
        self.timed_seconds = 0.0
        self.timed_steps = 0
        self.timed_samples = 0
        self.timed_tokens = 0
        self.data_wait_s = 0.0
        self.activation_bytes: int | None = None
        self.flops_per_step: int | None = None
        self.start_memory: int | None = None
        self.data_position = resume.DataPosition()  # epoch and batch: where a resumed run goes on
        self.skipped_steps = 0
        self.loss_scales: list[float] = []


def build_result(cfg, name, status, message, state: LoopState, model, optimizer, meter, peak, peak_source,
                 eval_loss, accuracy, device, warnings, wall_start, num_processes=1) -> RunResult:
    """The RunResult of a finished (or stopped) loop: rates over the timed steps, exact counts."""
    timed = state.timed_seconds > 0 and state.timed_steps > 0
    rates = Throughput.over(
        seconds=state.timed_seconds, steps=state.timed_steps, samples=state.timed_samples,
        tokens=state.timed_tokens if cfg.model in ("gpt", "minilm") else None,
        flops=(state.flops_per_step or 0) * state.timed_steps or None,
    ) if timed else None
    peak_bytes = meter.peak_bytes()
    memory = MemoryBreakdown(
        parameter_bytes=parameter_bytes(model),
        gradient_bytes=gradient_bytes(model, expected=True),
        optimizer_state_bytes=optimizer_state_bytes(optimizer),
        activation_bytes=state.activation_bytes,
        peak_bytes=peak_bytes,
        peak_increase_bytes=None if peak_bytes is None or state.start_memory is None
        else max(0, peak_bytes - state.start_memory),
        peak_kind="CUDA allocator peak" if meter.on_cuda else "process VmHWM",
    )
    return RunResult(
        name=name, config=cfg, status=status, message=message, steps_done=state.step,
        loss_steps=state.loss_steps, losses=state.losses,
        step_time_s=rates.step_time_s if rates else None,
        interval_step_times_s=state.interval_times,
        samples_per_sec=rates.samples_per_sec if rates else None,
        tokens_per_sec=rates.tokens_per_sec if rates else None,
        flops_per_step=state.flops_per_step,
        tflops_per_sec=rates.tflops_per_sec if rates else None,
        mfu=mfu(rates.tflops_per_sec, peak) if rates else None, peak_flops_source=peak_source,
        data_wait_fraction=state.data_wait_s / state.timed_seconds if timed else None,
        memory=memory, eval_loss=eval_loss, accuracy=accuracy, device=device.type,
        warnings=warnings, wall_s=time.perf_counter() - wall_start, num_processes=num_processes,
        loss_scales=state.loss_scales, skipped_steps=state.skipped_steps,
    )


@torch.no_grad()
def evaluate(accelerator, model, dataset, cfg: RunConfig) -> tuple[float, float]:
    """Held-out loss and accuracy, in fp32 with autocast off (reduced precision is
    for training speed; the reported accuracy should not depend on it)."""
    from workbench.core.data import build_dataloader

    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    plain.eval()
    # Uneven shares across processes: with accelerate's default (even_batches) the last
    # processes would repeat samples to even out, and the reduced sums would count them.
    even_batches, accelerator.even_batches = accelerator.even_batches, False
    loader = accelerator.prepare_data_loader(
        build_dataloader(dataset, batch_size=max(cfg.batch_size, 64), shuffle=False, seed=cfg.seed, drop_last=False)
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
