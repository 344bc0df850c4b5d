"""RunResult: what one run measured, in plain fields that compare() lays side by side."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.base.arguments import shown
from workbench.base.errors import ArgumentError
from workbench.base.report import Report, Table, counted_rows, format_bytes
from workbench.core.config import RunConfig


@dataclass(frozen=True, slots=True)
class MemoryBreakdown(Report):
    """Exact bytes of one training step, plus the measured peak.

    The first four are deterministic counts (nbval checks them); the peak is a
    reading of the allocator (GPU) or the process high-water mark (CPU).
    """

    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    activation_bytes: int | None
    """Saved-for-backward bytes of one micro-batch (unique storages, parameters excluded)."""
    peak_bytes: int | None
    """The peak over the training steps (evaluation, after them, is not in it). On a GPU the
    run's own: CUDA max_memory_allocated less `held_before_bytes`, what `estimate()` predicts;
    on a CPU the process VmHWM (includes Python and libraries); without /proc the process's peak
    since it started (macOS, Windows), or None where not even that is available."""
    peak_increase_bytes: int | None
    """Peak minus the memory in use when training started."""
    peak_kind: str
    """What the peak is: 'CUDA allocator peak', 'process VmHWM' or, without /proc, what
    measure.meters.cpu_peak() read instead."""
    held_before_bytes: int | None = None
    """GPU: memory already allocated when the run began (a notebook's own tensors, what an
    earlier run left), taken out of `peak_bytes`; None on a CPU and for a monitored loop."""

    @property
    def model_state_bytes(self) -> int:
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_state_bytes

    header = ("part", "bytes")

    def rows(self) -> list[tuple[str, str]]:
        return [
            *counted_rows(self),
            (f"peak ({self.peak_kind})", format_bytes(self.peak_bytes)),
            ("peak increase during training", format_bytes(self.peak_increase_bytes)),
            *([("held by others when the run began (not in the peak)", format_bytes(self.held_before_bytes))]
              if self.held_before_bytes else []),
        ]


@dataclass(frozen=True, slots=True)
class LoopDescription:
    """What a hand-written loop under `wb.monitor` does, in the fields the results table shows
    (a `wb.run` result holds its resolved RunConfig instead)."""

    model: str
    precision: str
    batch_size: int | None
    grad_accum_steps: int
    activation_checkpointing: str
    device: str


@dataclass(frozen=True, slots=True)
class RunResult:
    name: str
    config: RunConfig | LoopDescription
    """The resolved config: every value the run used (a monitored hand-written loop: its description)."""
    status: str
    """'ok'; 'oom' (out of memory: a real allocation failure or the simulated budget);
    'diverged' (the loss stopped being finite: the message names the step); 'interrupted'
    (Ctrl-C); 'failed' (an error, raised to the caller too). Views treat any status but
    'ok' and 'interrupted' as a failure, so a status added later still shows as one."""
    message: str
    steps_done: int
    loss_steps: list[int]
    losses: list[float]
    """Training loss at each log step (mean over the micro-batches since the last)."""
    step_time_s: float | None
    """Mean seconds per optimizer step, the first (probe and warm-up) step excluded."""
    interval_step_times_s: list[float]
    """Mean step time of each log interval: shows the spread."""
    samples_per_sec: float | None
    tokens_per_sec: float | None
    flops_per_step: int | None
    """FLOPs of one optimizer step (forward + backward, all micro-batches), counted."""
    tflops_per_sec: float | None
    mfu: float | None
    """Achieved over peak FLOP/s; None where there is no honest peak (peak_flops_source says why)."""
    peak_flops_source: str
    data_wait_fraction: float | None
    """Share of the timed steps spent waiting for the next batch on the host (the loader's
    fetch; the copy to a GPU is not counted: it waits for the GPU's queued work)."""
    memory: MemoryBreakdown | None
    eval_loss: float | None
    accuracy: float | None
    """Held-out accuracy (next-token accuracy for language models)."""
    device: str
    warnings: tuple[str, ...] = ()
    wall_s: float = 0.0
    num_processes: int = 1
    """Data-parallel processes the run trained on (its samples_per_sec counts them all)."""
    extra: dict[str, Any] = field(default_factory=dict)
    model: Any = field(default=None, repr=False, compare=False)
    """The trained model (unwrapped, eval mode) when run(..., keep_model=True); else None."""
    loss_scales: list[float] = field(default_factory=list)
    """fp16: the GradScaler's scale at each log step (loss_steps); empty otherwise."""
    skipped_steps: int = 0
    """fp16: optimizer steps the GradScaler skipped (inf/NaN gradients); counted every step."""
    peak_flops: float | None = None
    """The peak FLOP/s MFU is measured against (one process); None with the reason in peak_flops_source."""
    first_step_s: float | None = None
    """Seconds of the first optimizer step (wait for data included), which the timings leave out:
    exact counters, one-off warm-up and, with torch.compile, the compile. None for a resumed run."""

    @property
    def final_loss(self) -> float | None:
        return self.losses[-1] if self.losses else None

    def summary(self) -> dict[str, Any]:
        """Headline figures as a plain dict (sent to sinks in RunEnd)."""
        m = self.memory
        return {
            "status": self.status,
            "steps": self.steps_done,
            "final_loss": self.final_loss,
            "accuracy": self.accuracy,
            "step_time_s": self.step_time_s,
            "samples_per_sec": self.samples_per_sec,
            "tokens_per_sec": self.tokens_per_sec,
            "activation_bytes": m.activation_bytes if m else None,
            "peak_bytes": m.peak_bytes if m else None,
        }

    def _repr_html_(self) -> str:
        return results_table([self]).to_html()

    def __repr__(self) -> str:
        loss = f"{self.final_loss:.4f}" if self.final_loss is not None else "n/a"
        ms = f"{self.step_time_s * 1e3:.1f} ms/step" if self.step_time_s else "n/a"
        return f"RunResult({self.name!r}, {self.status}, {self.steps_done} steps, loss {loss}, {ms})"


# metric -> (column title, formatter); ratios are shown for the starred ones.
_COLUMNS: dict[str, tuple[str, Any]] = {
    "step_time_s": ("ms / step", lambda v: f"{v * 1e3:.1f}"),
    "samples_per_sec": ("samples / s", lambda v: f"{v:,.0f}"),
    "tokens_per_sec": ("tokens / s", lambda v: f"{v:,.0f}"),
    "activation_bytes": ("saved activations", format_bytes),
    "peak_increase_bytes": ("peak increase", format_bytes),
    "final_loss": ("final train loss", lambda v: f"{v:.4f}"),
    "accuracy": ("held-out accuracy", lambda v: f"{v:.3f}"),
}
_RATIO_METRICS = ("step_time_s", "samples_per_sec", "activation_bytes", "peak_increase_bytes")


def format_metric(name: str, value: float | None) -> str:
    """A figure as `results_table` writes it ('n/a' when missing): views that show the same
    figure use this, so a run's live view ends on the table's very strings.

    Example:
        >>> format_metric("step_time_s", 0.00759), format_metric("samples_per_sec", 8451.2)
        ('7.6', '8,451')
    """
    return "n/a" if value is None else _COLUMNS[name][1](value)


def metric(result: RunResult, name: str) -> float | None:
    """One figure of a result by name (memory figures included)."""
    if name in ("activation_bytes", "peak_bytes", "peak_increase_bytes", "parameter_bytes",
                "gradient_bytes", "optimizer_state_bytes"):
        return getattr(result.memory, name) if result.memory else None
    if name == "final_loss":
        return result.final_loss
    if not isinstance(name, str) or name.startswith("_") or not hasattr(result, name):
        raise ArgumentError(f"metric {shown(name)} is not a figure of a run; use one of {', '.join(_COLUMNS)}")
    return getattr(result, name)


def results_table(results: Sequence[RunResult]) -> Table:
    """The comparison as rows of formatted text, first run as the baseline."""
    base = results[0]
    shown = [m for m in _COLUMNS if any(metric(r, m) is not None for r in results)]
    header = ["run", "status", "precision", "batch x accum", "checkpointing"]
    for m in shown:
        header.append(_COLUMNS[m][0])
        if m in _RATIO_METRICS and len(results) > 1:
            header.append("x first")
    rows = []
    for r in results:
        c = r.config
        batch = "?" if c.batch_size is None else c.batch_size
        row = [r.name, r.status, c.precision, f"{batch} x {c.grad_accum_steps}", c.activation_checkpointing]
        for m in shown:
            value = metric(r, m)
            row.append(format_metric(m, value))
            if m in _RATIO_METRICS and len(results) > 1:
                b = metric(base, m)
                row.append("n/a" if value is None or not b else f"{value / b:.2f}")
        rows.append(row)
    return Table(header, rows)
