"""Gradient accumulation, checked: k micro-batches of b against one batch of k·b.

Each function runs a few steps outside `run()` and returns a small table (`Rows`) of
what it measured, so a notebook shows the evidence without pasting a loop:

- `accumulation_check`: one batch of k·b against k micro-batches of b, with the manual
  loop (loss / k), with `accelerator.accumulate`, and with the loss left undivided;
- `window_peak`: the peak memory of one window (it follows the micro-batch);
- `padding_check`: token-level losses with padding, per-micro-batch means against the
  per-token mean, and the fix (sum over tokens / tokens in the whole window);
- `effective_batch_table`: micro-batch × accumulation × processes, worked out.

The other pitfalls (BatchNorm, schedules, short windows, double gating, DDP all-reduce)
are in `accumulation_pitfalls.py`.

Example:
    >>> probe = make_probe(RunConfig(model="gpt"), samples=16)   # doctest: +SKIP
    >>> accumulation_check(probe, accum_steps=4)                  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from workbench.core.models import loss_fn
from workbench.core.report import Table
from workbench.engine.accelerator import make_accelerator
from workbench.measure.probe import (
    PeakReading,
    Probe,
    gradients,
    max_relative_difference,
    step_peak,
)

__all__ = ["Rows", "accumulation_check", "window_peak", "padding_check", "padded_labels", "token_loss_sum",
           "effective_batch", "effective_batch_table"]


@dataclass(frozen=True)
class Rows:
    """A small table of measured rows; `value(row, column)` reads one cell back."""

    title: str
    header: tuple[str, ...]
    rows: tuple[tuple, ...]

    def value(self, row: object, column: str) -> object:
        """The cell in the row whose first entry is `row`, under `column`."""
        i = self.header.index(column)
        for r in self.rows:
            if r[0] == row:
                return r[i]
        raise KeyError(f"no row {row!r}; rows: {[r[0] for r in self.rows]}")

    def table(self) -> Table:
        """The rows formatted, under the title: Jupyter shows it as HTML, print() as text."""
        return Table(list(self.header), [[_fmt(v) for v in r] for r in self.rows], caption=self.title)

    def _repr_html_(self) -> str:
        return self.table().to_html()

    def __str__(self) -> str:
        return str(self.table())

    __repr__ = __str__


def _fmt(value: object) -> str:
    # Rounding-level differences (1e-7) need an exponent to be read; other floats do not.
    if isinstance(value, float) and value and abs(value) < 1e-2:
        return f"{value:.2e}"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def check_accum_steps(accum_steps: int, samples: int | None = None) -> None:
    if isinstance(accum_steps, bool) or not isinstance(accum_steps, int) or accum_steps < 1:
        raise ValueError(f"accum_steps={accum_steps!r} must be a whole number >= 1, e.g. accum_steps=4")
    if samples is not None and samples % accum_steps:
        raise ValueError(f"accum_steps={accum_steps} must divide the probe's {samples} samples; "
                         f"make the probe with samples = micro-batch x accum_steps")


def _fresh_accelerator(probe_config, accum_steps: int):
    # make_accelerator resets accelerate's process-wide state, as run() needs; fp32 here.
    cfg = dataclasses.replace(probe_config, grad_accum_steps=accum_steps, precision="fp32")
    return make_accelerator(cfg)


def accumulation_check(probe: Probe, *, accum_steps: int) -> Rows:
    """One batch of k·b against k micro-batches of b, all in fp32 on the probe's data.

    Rows: the manual loop dividing each micro-batch loss by k; `accelerator.accumulate`
    (accelerate divides by k in `backward` and steps the optimizer only at the end of the
    window: the 'optimizer steps' column counts real steps); and the pitfall of not
    dividing, whose gradient is k times too large.
    """
    k, n = accum_steps, len(probe.inputs)
    check_accum_steps(k, n)
    xs, ys = probe.inputs.chunk(k), probe.labels.chunk(k)

    model = probe.new_model()
    loss_fn(model(probe.inputs), probe.labels).backward()
    reference = gradients(model)

    def manual(divide: bool) -> list[torch.Tensor]:
        model = probe.new_model()
        for x, y in zip(xs, ys):
            loss = loss_fn(model(x), y)
            (loss / k if divide else loss).backward()  # .grad adds up across backward calls
        return gradients(model)

    accelerator = _fresh_accelerator(probe.config, k)
    model = probe.new_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    seen: list[list[torch.Tensor]] = []
    # Runs only when the real optimizer steps: records the gradient it steps with.
    optimizer.register_step_pre_hook(lambda *_: seen.append(gradients(model)))
    model, optimizer = accelerator.prepare(model, optimizer)
    for x, y in zip(xs, ys):
        with accelerator.accumulate(model):
            accelerator.backward(loss_fn(model(x), y))
            optimizer.step()  # a no-op until the last micro-batch of the window
            optimizer.zero_grad()  # likewise: the partial sum must survive
    if len(seen) != 1:
        raise AssertionError(f"accelerate stepped {len(seen)} times in one window of {k}; expected 1")

    header = ("method", "max relative difference", "optimizer steps", "gradient norm / reference")
    ref_norm = torch.stack([g.norm() for g in reference]).norm().item()

    def row(name: str, grads: list[torch.Tensor], steps: int) -> tuple:
        norm = torch.stack([g.norm() for g in grads]).norm().item()
        return (name, max_relative_difference(grads, reference), steps, norm / ref_norm)

    return Rows(
        title=f"{k} micro-batches of {n // k} against one batch of {n} (fp32)",
        header=header,
        rows=(
            row(f"one batch of {n} (reference)", reference, 1),
            row(f"manual: loss / {k}, backward per micro-batch", manual(True), 1),
            row("accelerate: accumulate() + backward()", seen[0], len(seen)),
            row("pitfall: loss not divided", manual(False), 1),
        ),
    )


def window_peak(probe: Probe, *, micro_batch: int, accum_steps: int) -> PeakReading:
    """Peak memory of one accumulation window: `accum_steps` forward + backward passes of
    `micro_batch` samples from the probe (parameters and the gradients being summed
    included; the optimizer, the same for every setup, left out)."""
    check_accum_steps(accum_steps)
    if micro_batch * accum_steps > len(probe.inputs):
        raise ValueError(f"micro_batch={micro_batch} x accum_steps={accum_steps} needs more than the probe's "
                         f"{len(probe.inputs)} samples; make the probe with samples >= {micro_batch * accum_steps}")
    model = probe.new_model()
    n = micro_batch * accum_steps

    def micro_step(x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
        return lambda: (loss_fn(model(x), y) / accum_steps).backward()

    window = [micro_step(x, y) for x, y in zip(probe.inputs[:n].chunk(accum_steps), probe.labels[:n].chunk(accum_steps))]
    return step_peak(window, track=[model], device=probe.inputs.device)


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy over the labelled tokens (label -100 is padding: skipped)."""
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=-100, reduction="sum")


def padded_labels(labels: torch.Tensor, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels with each sequence cut to a random length (the rest -100, i.e. padding), sorted
    longest first, as a length-grouping sampler would batch them. Returns (labels, lengths)."""
    T = labels.shape[1]
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, T // 16), T + 1, (labels.shape[0],), generator=g).sort(descending=True).values
    keep = torch.arange(T)[None, :] < lengths[:, None]
    return torch.where(keep.to(labels.device), labels, torch.full_like(labels, -100)), lengths


def padding_check(probe: Probe, *, accum_steps: int, seed: int = 0) -> Rows:
    """Token-level loss with padding, accumulated over k micro-batches.

    Averaging per micro-batch and dividing by k weights every micro-batch equally, so a
    token in a short micro-batch counts more than one in a long micro-batch: not the mean
    over the window's tokens. The fix: sum the loss over tokens and divide by the number
    of labelled tokens in the whole window (counted before the window starts; under data
    parallel, summed over processes too). With accelerate, whose backward divides by k,
    multiply that by k.
    """
    if probe.labels.dim() != 2:
        raise ValueError("padding_check needs token-level labels (B, T): use model='gpt'")
    k, n = accum_steps, len(probe.inputs)
    check_accum_steps(k, n)
    labels, _ = padded_labels(probe.labels, seed=seed)
    xs, ys = probe.inputs.chunk(k), labels.chunk(k)
    window_tokens = int((labels != -100).sum())
    counts = [int((y != -100).sum()) for y in ys]

    model = probe.new_model()
    reference_loss = loss_fn(model(probe.inputs), labels)  # mean over every labelled token
    reference_loss.backward()
    reference = gradients(model)

    def accumulate(per_micro_batch) -> tuple[list[torch.Tensor], float]:
        model, total = probe.new_model(), 0.0
        for x, y in zip(xs, ys):
            loss = per_micro_batch(model(x), y)
            loss.backward()
            total += loss.item()
        return gradients(model), total

    naive, naive_loss = accumulate(lambda logits, y: loss_fn(logits, y) / k)
    fixed, fixed_loss = accumulate(lambda logits, y: token_loss_sum(logits, y) / window_tokens)

    accelerator = _fresh_accelerator(probe.config, k)
    model = probe.new_model()
    model = accelerator.prepare(model)
    acc_loss = 0.0
    for x, y in zip(xs, ys):
        with accelerator.accumulate(model):
            loss = token_loss_sum(model(x), y) / window_tokens * k  # backward divides by k again
            accelerator.backward(loss)
            acc_loss += loss.item() / k

    header = ("method", "max relative difference", "window loss")
    return Rows(
        title=f"padded tokens: {k} micro-batches holding {counts} labelled tokens",
        header=header,
        rows=(
            (f"one batch: mean over all {window_tokens} tokens (reference)", 0.0, reference_loss.item()),
            (f"pitfall: mean per micro-batch, / {k}", max_relative_difference(naive, reference), naive_loss),
            ("fix: token sum / tokens in the window", max_relative_difference(fixed, reference), fixed_loss),
            (f"fix with accelerate: token sum / window tokens x {k}",
             max_relative_difference(gradients(model), reference), acc_loss),
        ),
    )








def effective_batch(micro_batch: int, accum_steps: int, processes: int = 1) -> int:
    """Samples behind one optimizer step: micro-batch × accumulation steps × processes.

    Example:
        >>> effective_batch(8, 4, 2)
        64
    """
    for name, v in (("micro_batch", micro_batch), ("accum_steps", accum_steps), ("processes", processes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a whole number >= 1")
    return micro_batch * accum_steps * processes


def effective_batch_table(setups: Iterable[Sequence[int]], *, train_samples: int) -> Rows:
    """Per (micro-batch, accumulation, processes): the effective batch, and what one epoch of
    `train_samples` becomes (each process gets 1/processes of the data; partial micro-batches
    dropped). A nonzero 'micro-batches left over' is a short last window (see
    `accumulation_pitfalls.partial_window_check`)."""
    rows = []
    for setup in setups:
        b, k, p = (*setup, 1)[:3]  # processes defaults to 1
        per_process = train_samples // (b * p)
        rows.append((b, k, p, effective_batch(b, k, p), per_process, per_process // k, per_process % k))
    return Rows(title=f"effective batch, and one epoch of {train_samples:,} samples",
                header=("micro-batch", "accumulation", "processes", "effective batch",
                        "micro-batches per process", "optimizer steps", "micro-batches left over"),
                rows=tuple(rows))
