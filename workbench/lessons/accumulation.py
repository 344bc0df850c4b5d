"""Notebook 02, gradient accumulation: the checks and pitfalls its cells call.

- `accumulation_check`: one batch of k·b against k micro-batches of b (manual loss / k,
  `accelerator.accumulate`, and the loss left undivided);
- `window_peak`: the peak memory of one window (it follows the micro-batch);
- `padded_labels`: token labels cut to random lengths, for the token-count pitfall;
- `claim_rows`: the notebook's claims against what it measured (asserting what must hold);
- the other pitfalls, each measured: `batchnorm_check`, `lr_schedule_check`,
  `partial_window_check`, `stepping_check`, `allreduce_check`;
- `effective_batch`: micro-batch × accumulation steps × processes.

Each check runs a few steps outside `run()` and returns a small table (`Rows`).

Example:
    >>> partial_window_check(micro_batches=10, accum_steps=4).value(3, "gradient (accelerate: / k)")
    0.5
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from workbench.base.report import Table
from workbench.core.config import RunConfig
from workbench.core.engine.accelerator import make_accelerator
from workbench.core.models import loss_fn
from workbench.lessons import evidence
from workbench.lessons.figures_accumulation import memory_timeline_figure  # re-exported for the notebook

# make_probe, gradients, max_relative_difference: re-exported for the notebook's own cells
from workbench.lessons.probe import PeakReading, Probe, gradients, make_probe, max_relative_difference, step_peak

__all__ = ["Rows", "accumulation_check", "window_peak", "padded_labels", "claim_rows", "effective_batch",
           "make_probe", "gradients", "max_relative_difference", "memory_timeline_figure"]


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

    ref_norm = torch.stack([g.norm() for g in reference]).norm().item()

    def row(name: str, grads: list[torch.Tensor], steps: int) -> tuple:
        norm = torch.stack([g.norm() for g in grads]).norm().item()
        return (name, max_relative_difference(grads, reference), steps, norm / ref_norm)

    return Rows(title=f"{k} micro-batches of {n // k} against one batch of {n} (fp32)",
                header=("method", "max relative difference", "optimizer steps", "gradient norm / reference"),
                rows=(row(f"one batch of {n} (reference)", reference, 1),
                      row(f"manual: loss / {k}, backward per micro-batch", manual(True), 1),
                      row("accelerate: accumulate() + backward()", seen[0], len(seen)),
                      row("pitfall: loss not divided", manual(False), 1)))


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


def padded_labels(labels: torch.Tensor, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels with each sequence cut to a random length (the rest -100, i.e. padding), sorted
    longest first, as a length-grouping sampler would batch them. Returns (labels, lengths)."""
    T = labels.shape[1]
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, T // 16), T + 1, (labels.shape[0],), generator=g).sort(descending=True).values
    keep = torch.arange(T)[None, :] < lengths[:, None]
    return torch.where(keep.to(labels.device), labels, torch.full_like(labels, -100)), lengths


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


def claim_rows(baseline, accumulated) -> list[tuple[Any, ...]]:
    """The notebook's claims against this session's runs: `baseline` (one batch of k·b) and
    `accumulated` (k micro-batches of b). Measures the gradients and the window peaks on the
    baseline's first batch; raises AssertionError where what must hold does not."""
    k, b = accumulated.config.grad_accum_steps, accumulated.config.batch_size
    probe = make_probe(baseline.config, samples=k * b)
    same = accumulation_check(probe, accum_steps=k)
    manual, accel = (same.value(m, "max relative difference") for m in
                     (f"manual: loss / {k}, backward per micro-batch", "accelerate: accumulate() + backward()"))
    gap = max(abs(x - y) / abs(y) for x, y in zip(accumulated.losses, baseline.losses))
    assert max(manual, accel) <= 1e-5 and gap <= 1e-2, f"accumulation should equal one batch: {manual}, {accel}, {gap}"
    saved = accumulated.memory.activation_bytes / baseline.memory.activation_bytes
    big, window = (window_peak(probe, micro_batch=m, accum_steps=n) for m, n in ((k * b, 1), (b, k)))
    assert saved * k < 1.01 and window.bytes < 0.6 * big.bytes, "memory should follow the micro-batch"
    assert accumulated.flops_per_step == baseline.flops_per_step, "the same FLOPs per optimizer step"
    gated = stepping_check(micro_batches=3 * k, accum_steps=k).rows[1][2]  # steps taken, gated by hand
    assert gated == 0
    return [
        ("k micro-batches with loss / k give the gradient of one batch of k·b", "seed 004 §4.1",
         f"gradients {max(manual, accel):.1e} from one batch's (manual, accelerate); loss curves {gap:.1e} apart",
         "holds: to float rounding", evidence.count()),
        ("total batch = per-device batch x accumulation steps x GPUs", "seed 000 §5.1",
         f"{b} x {k}: the FLOPs of one batch of {k * b} per optimizer step, exactly",
         "holds in part: one process here (notebook 06 adds processes)", evidence.count()),
        ("accumulation saves memory", "seed 004 §4.1, seed 000 §5.1",
         f"saved activations x{saved:.2f} (exact); window peak x{window.bytes / big.bytes:.2f} ({window.kind})",
         "holds: memory follows the micro-batch", evidence.count()),
        ("`if i % k == 0: optimizer.step()` inside `accumulate()`", "seed 003 §5.1",
         f"{gated} optimizer steps in {3 * k} micro-batches", "does not hold here: it never steps; drop the if",
         evidence.count()),
    ]


__all__ += ["batchnorm_check", "lr_schedule_check", "partial_window_check", "stepping_check", "allreduce_check"]


def batchnorm_check(probe: Probe, *, accum_steps: int) -> Rows:
    """A Linear-Norm-ReLU-Linear classifier on the probe's images, with BatchNorm or LayerNorm.

    BatchNorm normalises with the statistics of the batch it sees: a micro-batch of b, not
    the window of k·b, so the gradients differ, and its running statistics take k momentum
    updates instead of one. LayerNorm normalises each sample alone: accumulation is exact.
    """
    k, n = accum_steps, len(probe.inputs)
    check_accum_steps(k, n)
    if probe.inputs.dim() != 4:
        raise ValueError("batchnorm_check needs image inputs (B, C, H, W): use model='mlp' or 'cnn'")
    features = probe.inputs[0].numel()
    classes = int(probe.labels.max()) + 1

    def net(norm: type[nn.Module]) -> nn.Sequential:
        torch.manual_seed(probe.config.seed)
        return nn.Sequential(nn.Flatten(), nn.Linear(features, 32), norm(32), nn.ReLU(),
                             nn.Linear(32, classes)).to(probe.inputs.device).train()

    rows = []
    for norm in (nn.BatchNorm1d, nn.LayerNorm):
        whole = net(norm)
        loss_fn(whole(probe.inputs), probe.labels).backward()
        micro = net(norm)
        for x, y in zip(probe.inputs.chunk(k), probe.labels.chunk(k)):
            (loss_fn(micro(x), y) / k).backward()
        stats = "n/a"
        if norm is nn.BatchNorm1d:
            stats = max_relative_difference([micro[2].running_mean], [whole[2].running_mean])
        rows.append((norm.__name__, max_relative_difference(gradients(micro), gradients(whole)), stats))
    return Rows(title=f"{k} micro-batches of {n // k} against one batch of {n}, by normalisation",
                header=("normalisation", "gradient max relative difference", "running mean max relative difference"),
                rows=tuple(rows))


def lr_schedule_check(*, accum_steps: int, optimizer_steps: int = 4, warmup_steps: int = 4,
                      lr: float = 1.0) -> Rows:
    """A linear warm-up over `warmup_steps` optimizer steps, traced micro-batch by micro-batch.

    Columns: the learning rate when `scheduler.step()` is called after every micro-batch
    (the warm-up ends k times too early); when it is called after every optimizer step
    (right); and accelerate's prepared scheduler called after every micro-batch (it steps
    only when the optimizer did, so it is right too).
    """
    check_accum_steps(accum_steps)
    k = accum_steps
    warmup = lambda step: min(1.0, (step + 1) / warmup_steps)  # noqa: E731

    def plain():
        opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=lr)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup)

    per_micro, per_step, accel = [], [], []
    opt_a, sched_a = plain()
    opt_b, sched_b = plain()
    accelerator = make_accelerator(_plain_config(k))
    opt_c, sched_c = plain()
    opt_c, sched_c = accelerator.prepare(opt_c, sched_c)
    for micro_batch in range(k * optimizer_steps):
        per_micro.append(opt_a.param_groups[0]["lr"])
        per_step.append(opt_b.param_groups[0]["lr"])
        accel.append(opt_c.param_groups[0]["lr"])
        opt_a.step()
        sched_a.step()  # the pitfall: once per micro-batch
        if (micro_batch + 1) % k == 0:
            opt_b.step()
            sched_b.step()
        with accelerator.accumulate():
            opt_c.step()
            sched_c.step()  # called every micro-batch; acts only on optimizer steps
    rows = tuple((i, i // k + 1, a, b, c) for i, (a, b, c) in enumerate(zip(per_micro, per_step, accel)))
    return Rows(title=f"learning rate during a {warmup_steps}-optimizer-step warm-up, k={k}",
                header=("micro-batch", "optimizer step", "scheduler.step() per micro-batch",
                        "per optimizer step", "accelerate, per micro-batch"),
                rows=rows)


def _plain_config(accum_steps: int):
    return RunConfig(model="mlp", grad_accum_steps=accum_steps, device="cpu")


def partial_window_check(*, micro_batches: int, accum_steps: int) -> Rows:
    """Windows of an epoch of `micro_batches` micro-batches under accelerate.

    Every micro-batch's loss is w·1, so its gradient is exactly 1 and a correctly averaged
    window has gradient 1. accelerate steps at the end of the data loader even when the
    last window is short, but its backward still divides by k: that window's gradient is
    (micro-batches in it) / k. Dividing by the window's real size instead gives 1 again.
    """
    check_accum_steps(accum_steps)
    if micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches} must be at least 1")
    k = accum_steps
    # accelerate's own default (sync_with_dataloader=True) is what this shows; run()
    # turns it off so that its windows are always k micro-batches long.
    cpu = make_accelerator(_plain_config(k)).device.type == "cpu"  # also resets accelerate's state
    accelerator = Accelerator(cpu=cpu, gradient_accumulation_steps=k)
    w = nn.Linear(1, 1, bias=False)
    nn.init.ones_(w.weight)
    optimizer = torch.optim.SGD(w.parameters(), lr=0.0)  # lr 0: w stays 1, grads stay exact
    seen: list[float] = []
    optimizer.register_step_pre_hook(lambda *_: seen.append(w.weight.grad.item()))
    loader = torch.utils.data.DataLoader(torch.ones(micro_batches, 1), batch_size=1)
    model, optimizer, loader = accelerator.prepare(w, optimizer, loader)
    in_window = 0
    sizes = []
    for x in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(x).sum())
            in_window += 1
            if accelerator.sync_gradients:
                sizes.append(in_window)
                in_window = 0
            optimizer.step()
            optimizer.zero_grad()
    rows = tuple((i + 1, size, grad, grad * k / size) for i, (size, grad) in enumerate(zip(sizes, seen)))
    return Rows(title=f"an epoch of {micro_batches} micro-batches, k={k}",
                header=("window", "micro-batches", "gradient (accelerate: / k)", "gradient / real size"),
                rows=rows)


def stepping_check(*, micro_batches: int, accum_steps: int) -> Rows:
    """How often the optimizer really steps under `accelerator.accumulate`, by how it is called.

    accelerate's prepared optimizer ignores `step()` and `zero_grad()` except on the last
    micro-batch of a window, so the loop calls them every micro-batch. Gating them again
    by hand with `if i % k == 0` (i from 0) asks for a step exactly when accelerate will not
    take one: the two conditions never meet and the model never updates.
    """
    check_accum_steps(accum_steps)
    k = accum_steps
    rows = []
    for label, gate in (("step() every micro-batch", lambda i: True),
                        (f"step() only if i % {k} == 0, inside accumulate()", lambda i: i % k == 0)):
        accelerator = make_accelerator(_plain_config(k))
        w = nn.Linear(1, 1, bias=False)
        optimizer = torch.optim.SGD(w.parameters(), lr=0.1)
        taken: list[int] = []
        optimizer.register_step_pre_hook(lambda *_, taken=taken: taken.append(1))
        model, optimizer = accelerator.prepare(w, optimizer)
        for i in range(micro_batches):
            with accelerator.accumulate(model):
                accelerator.backward(model(torch.ones(1, 1)).sum())
                if gate(i):
                    optimizer.step()
                    optimizer.zero_grad()
        rows.append((label, micro_batches // k, len(taken)))
    return Rows(title=f"{micro_batches} micro-batches, k={k}: optimizer steps expected and taken",
                header=("loop", "steps expected", "steps taken"), rows=tuple(rows))


def allreduce_check(*, accum_steps: int, seed: int = 0) -> Rows:
    """Count DDP's gradient all-reduces over one accumulation window, with and without no_sync.

    Runs DistributedDataParallel in a one-process gloo group made here (so it works on any
    CPU), with a communication hook that counts each bucket's all-reduce before doing it.
    Without `no_sync` every micro-batch's backward all-reduces all gradients; inside
    `model.no_sync()` they only add up locally, and the last micro-batch all-reduces the
    sum once. `accelerator.accumulate(model)` enters `no_sync` for you on non-final
    micro-batches when it runs distributed. The gradients are the same either way.
    """
    # lazy: `import torch` does not load the DDP hooks (they import torch._dynamo)
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    check_accum_steps(accum_steps)
    if dist.is_initialized():
        raise RuntimeError("allreduce_check makes its own one-process group; call it outside a distributed launch")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        x = torch.randn(8 * accum_steps, 64)
        rows = []
        grads = {}
        for skip in (False, True):
            model = DDP(net)
            sent: list[int] = []

            def counting_hook(state, bucket, sent=sent):
                sent.append(bucket.buffer().numel() * bucket.buffer().element_size())
                return allreduce_hook(state, bucket)

            model.register_comm_hook(None, counting_hook)
            model.zero_grad(set_to_none=True)
            for i, chunk in enumerate(x.chunk(accum_steps)):
                last = i == accum_steps - 1
                with model.no_sync() if skip and not last else contextlib.nullcontext():
                    (model(chunk).square().mean() / accum_steps).backward()
            grads[skip] = gradients(net)
            label = "no_sync() on all but the last micro-batch" if skip else "all-reduce every micro-batch"
            rows.append([label, len(sent), sum(sent)])
            del model
    finally:
        dist.destroy_process_group()
    same = max_relative_difference(grads[True], grads[False]) <= 1e-6
    return Rows(title=f"one window of {accum_steps} micro-batches under DDP",
                header=("accumulation", "all-reduce calls", "bytes all-reduced", "same gradients (<= 1e-6)"),
                rows=tuple((*row, same) for row in rows))
