"""Notebook 10: tensor and pipeline parallelism on CPU processes. The measurements beside the
learner's own lines, and the formulas they are held against.

The learner splits the GPT with PyTorch's own APIs in launched processes (`parallelize_module`
with `ColwiseParallel`/`RowwiseParallel`; `PipelineStage` with `ScheduleGPipe`/`Schedule1F1B`);
these helpers measure what each process holds and sends:

- `Meter(model, optimizer)`: around each step of a hand loop (`with meter.step(): ...`,
  `meter.loss(loss)`): the collectives and the saved activations of the first step, the tensor
  peak of the second, the losses of all; `meter.report()` is what a process returns;
- `formulas(report)`: the same figures from the shapes alone (Megatron's all-reduces, Korthikanti
  et al.'s activations, the pipeline's sends), `check_formulas(reports)` holds them exactly;
- `bubble(schedule)`: the idle share of a pipeline schedule, simulated from its own order of actions;
- `agree(by_hand, library, alone)`: the hand loop and the library's split did the same thing,
  and both trained like one process.

Example:
    >>> stage_layers(4, 2)
    [range(0, 2), range(2, 4)]
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from workbench.base.report import format_bytes
from workbench.core import custom
from workbench.core.measure.counters import SavedActivationCounter, parameter_bytes
from workbench.core.switches import data_loading
from workbench.launching.launch import launch_function
from workbench.lessons.probe import tensor_peak
from workbench.planner.communication import CollectiveCounter, wire_bytes
from workbench.planner.parallelize import (
    group_qkv_by_process,
    pipeline_stages,
    stage_layers,
    sync_tied_grads,
    tensor_parallel,
)

__all__ = ["launch", "Meter", "on_the_wire", "RankReport", "formulas", "check_formulas", "bubble", "timed_bubble", "bubble_formula", "agree", "table",
           "tensor_parallel", "pipeline_stages", "sync_tied_grads", "stage_layers", "heads_side_by_side"]

heads_side_by_side = group_qkv_by_process
"""Reorder a fused q, k, v Linear so a column-wise split gives each process whole heads' q, k and v."""


@dataclass(frozen=True)
class RankReport:
    """What one process measured: per step, in bytes (its own share), and its losses."""

    rank: int
    world: int
    kind: str
    """'tensor', 'sequence' (tensor + sequence parallel), 'gpipe' or '1f1b'; 'one' for one process."""
    shape: dict[str, int]
    """s, b, h, a, L, V (and m micro-batches, the stage's blocks for a pipeline)."""
    parameter_bytes: int
    activation_bytes: int
    peak_bytes: int
    collective_bytes: dict[str, int]
    collective_calls: dict[str, int]
    losses: list[float] = field(default_factory=list)
    actions: list[tuple[str, int, float, float]] = field(default_factory=list)
    """A pipeline stage's last step, in the order it ran: ('F' or 'B', micro-batch, start s, end s)."""


class Meter:
    """Measures a hand loop in one process; see the module docstring."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, kind: str,
                 stage: Any = None, microbatches: int = 1) -> None:
        self.model, self.optimizer, self.kind = model, optimizer, kind
        self.microbatches = microbatches
        self.blocks = len(model.blocks) if stage is not None else None
        self.steps, self.losses = 0, []
        self.actions: list[tuple[str, int, float, float]] = []
        if stage is not None:  # a pipeline stage: log what its schedule runs, in order, timed
            stage.forward_one_chunk = self._logged("F", stage.forward_one_chunk)
            stage.backward_one_chunk = self._logged("B", stage.backward_one_chunk)
        self.comm = CollectiveCounter()
        self.saved: SavedActivationCounter | None = None
        self.peak: int | None = None
        self.shape: dict[str, int] = {}

    def _logged(self, kind: str, run: Any) -> Any:
        def logged(chunk: int, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = run(chunk, *args, **kwargs)
            self.actions.append((kind, chunk, start, time.perf_counter()))
            return out

        return logged

    @contextlib.contextmanager
    def step(self, batch: dict[str, torch.Tensor]) -> Iterator[None]:
        b, s = batch["inputs"].shape
        self.shape = {"b": b, "s": s}
        self.actions = []
        with contextlib.ExitStack() as stack:
            # The second step: the first also makes the optimizer's state and (a pipeline) agrees
            # the stages' shapes; every later step sends, saves and peaks the same.
            if self.steps == 1:
                reading = stack.enter_context(tensor_peak([self.model, self.optimizer], per_module=False))
                stack.enter_context(self.comm)
                # The batch is the loop's: a pipeline's micro-batches are views of it, saved again by
                # each forward after a backward (1F1B), so it is left out, for every kind alike.
                self.saved = stack.enter_context(SavedActivationCounter(self.model, exclude=batch.values()))
            yield
        if self.steps == 1:
            self.peak = reading.result.bytes
        self.steps += 1

    def loss(self, loss: torch.Tensor) -> None:
        self.losses.append(float(loss.detach()))

    def report(self, model: nn.Module) -> RankReport:
        """This process's figures (`model`: the whole GPT before it was split, for its shapes)."""
        attn = model.blocks[0].attn
        heads = attn.n_head * (dist.get_world_size() if self.kind in ("tensor", "sequence") else 1)  # n_head: the local heads
        shape = {**self.shape, "h": attn.c_proj.out_features, "a": heads, "L": len(model.blocks),
                 "V": model.wte.num_embeddings, "m": self.microbatches, "blocks": self.blocks or len(model.blocks)}
        return RankReport(dist.get_rank(), dist.get_world_size(), self.kind, shape, parameter_bytes(self.model),
                          self.saved.bytes, self.peak or 0, dict(self.comm.bytes), dict(self.comm.calls), self.losses,
                          self.actions)


def formulas(report: RankReport) -> dict[str, Any]:
    """The report's parameter, activation and communication bytes from its shapes alone (fp32).

    Tensor parallel over t (Shoeybi et al.): each block's 12h² + 7h weights split but for the
    row-wise biases and norms (6h); per layer 2 all-reduces of b·s·h forward, 2 backward.
    Sequence parallel (Korthikanti et al.): each all-reduce an all-gather + a reduce-scatter of
    the same b·s·h, two more all-gathers at the ends of the split stream, and the norms' 4h
    weight gradients all-reduced. Activations per layer (elements): 4sbh + 12sbh/t + as²b/t + 4sb
    (the norms' inputs and the linears' replicated inputs whole); sequence parallel:
    2sbh + 14sbh/t + as²b/t + 4sb/t (the norms split; the gathered inputs kept whole).
    Pipeline: a stage holds its blocks (the first the embeddings, the last the final norm and a
    copy of the tied head), saves its blocks' activations for all m micro-batches of b/m, and
    sends b·s·h forward (all but the last) and b·s·h of gradients backward (all but the first)."""
    x = report.shape
    s, b, h, a, L, V = x["s"], x["b"], x["h"], x["a"], x["L"], x["V"]
    t = report.world if report.kind in ("tensor", "sequence") else 1
    block = (12 * h * h + 7 * h) // t + 6 * h
    bsh = 4 * b * s * h
    # (the token ids and labels are the batch's, which the loop holds: not counted)
    # the final norm's input and statistics, the head's input, the loss's log-probabilities and weight
    ends_out = 4 * (2 * s * b * h + 2 * s * b) + 4 * s * b * V + 4
    if report.kind in ("gpipe", "1f1b"):
        first, last = report.rank == 0, report.rank == report.world - 1
        layers = x["blocks"]
        params = 4 * (block * layers + first * (V * h + s * h) + last * (2 * h + V * h))
        acts = 4 * layers * (16 * s * b * h + a * s * s * b + 4 * s * b)
        acts += last * (ends_out + 4 * (x["m"] - 1))  # one nll weight per micro-batch
        comm = {"send": (not last) * bsh + (not first) * bsh}
        if report.world > 1 and (first or last):
            comm["all_reduce"] = 4 * V * h  # the tied embedding's gradient, summed over the first and last stage
        return {"parameter_bytes": params, "activation_bytes": acts, "collective_bytes": comm}
    params = 4 * (block * L + V * h + s * h + 2 * h)
    if report.kind == "sequence":
        layer = 2 * s * b * h + 14 * s * b * h // t + a * s * s * b // t + 4 * s * b // t
        comm = {"all_gather": (4 * L + 2) * bsh, "reduce_scatter": 4 * L * bsh, "all_reduce": L * 4 * 4 * h}
    else:
        layer = 4 * s * b * h + 12 * s * b * h // t + a * s * s * b // t + 4 * s * b
        comm = {"all_reduce": 4 * L * bsh} if t > 1 else {}
    return {"parameter_bytes": params, "activation_bytes": 4 * L * layer + ends_out, "collective_bytes": comm}


def check_formulas(reports: Sequence[RankReport]) -> None:
    """Raise, naming the figure, unless every process's measured bytes equal `formulas`'."""
    for r in reports:
        for name, want in formulas(r).items():
            got = getattr(r, name)
            if got != want:
                raise AssertionError(f"{r.kind} rank {r.rank} of {r.world}: {name} measured {got}, formula {want}")


def table(reports: Sequence[RankReport]) -> str:
    """One line per process: what it holds and communicates per step, measured (= the formula: check_formulas);
    a collective's bytes are those of the tensor it is called on (`on_the_wire`: what crosses the wire)."""
    lines = []
    for r in reports:
        sent = ", ".join(f"{k} {format_bytes(v)} ({r.collective_calls[k]} calls)" for k, v in sorted(r.collective_bytes.items()))
        lines.append(f"{r.kind:>8} rank {r.rank}/{r.world}: weights {format_bytes(r.parameter_bytes)}, saved activations "
                     f"{format_bytes(r.activation_bytes)}, tensor peak {format_bytes(r.peak_bytes)}; "
                     f"communication {sent or 'none'}")
    return "\n".join(lines)


def on_the_wire(report: RankReport) -> int:
    """Bytes this process puts on the wire per step: a ring's share of each collective
    (`wire_bytes`: (N-1)/N of an all-gather or reduce-scatter, twice that of an all-reduce), a send whole."""
    return round(sum(nbytes if kind == "send" else wire_bytes(kind, nbytes, report.world)
                     for kind, nbytes in report.collective_bytes.items()))


def _finish_times(order: Sequence[Sequence[tuple[str, int]]], forward: float, backward: float) -> list[float]:
    """Each stage's finish time when it runs its actions in `order` as soon as the one each needs
    is done: a forward needs the previous stage's forward of the same micro-batch, a backward the
    next stage's backward."""
    todo = [list(actions) for actions in order]
    done: dict[tuple[int, str, int], float] = {}
    clock = [0.0] * len(todo)
    last = len(todo) - 1
    while any(todo):
        progressed = False
        for rank, actions in enumerate(todo):
            if not actions:
                continue
            kind, mb = actions[0]
            need = (rank - 1, "F", mb) if kind == "F" and rank > 0 else (rank + 1, "B", mb) if kind == "B" and rank < last else None
            if need is not None and need not in done:
                continue
            start = max(clock[rank], done.get(need, 0.0))
            clock[rank] = done[(rank, kind, mb)] = start + (forward if kind == "F" else backward)
            actions.pop(0)
            progressed = True
        if not progressed:
            raise ValueError("the stages' order of actions deadlocks")
    return clock


def bubble(reports: Sequence[RankReport], *, forward: float = 1.0, backward: float = 2.0) -> float:
    """The share of a step a stage idles when its actions run in the order the schedule ran them
    (`report.actions`, one report per stage), a forward taking `forward`, a backward `backward`."""
    order = [[(kind, mb) for kind, mb, _, _ in r.actions] for r in sorted(reports, key=lambda r: r.rank)]
    span = max(_finish_times(order, forward, backward))
    work = sum(forward if kind == "F" else backward for kind, _ in order[0])
    return 1 - work / span


def timed_bubble(reports: Sequence[RankReport]) -> float:
    """The same share from the clock: 1 - the busiest stage's compute time / the step's span
    (the processes' clocks are one machine's)."""
    starts = [a[2] for r in reports for a in r.actions]
    ends = [a[3] for r in reports for a in r.actions]
    busy = max(sum(end - start for _, _, start, end in r.actions) for r in reports)
    return 1 - busy / (max(ends) - min(starts))


def bubble_formula(stages: int, microbatches: int) -> float:
    """GPipe's (and 1F1B's) bubble: (p - 1) / (m + p - 1) of the step."""
    return (stages - 1) / (microbatches + stages - 1)


def _windows(losses: Sequence[float], steps: Sequence[int]) -> list[float]:
    """Per-step losses as `wb.run` logs them: the mean since the last logged step."""
    out, start = [], 0
    for end in steps:
        window = losses[start:end]
        out.append(sum(window) / len(window))
        start = end
    return out


def agree(by_hand: Sequence[RankReport], library: Sequence[RankReport], alone: Any, *, loss_rtol: float = 1e-4) -> None:
    """One check: the hand-written split and the library's (`tensor_parallel` / `pipeline_stages`)
    measured the same bytes exactly on every process, and each trained like one process (`alone`:
    `wb.run`'s result, its logged losses) within `loss_rtol`, relative. Prints one line."""
    for mine, theirs in zip(by_hand, library, strict=True):
        for name in ("parameter_bytes", "activation_bytes", "collective_bytes"):
            if getattr(mine, name) != getattr(theirs, name):
                raise AssertionError(f"rank {mine.rank}: {name} by hand {getattr(mine, name)}, "
                                     f"library {getattr(theirs, name)}")
    curves = [r for r in (*by_hand, *library) if r.losses]
    worst = 0.0
    for r in curves:
        for step, got, want in zip(alone.loss_steps, _windows(r.losses, alone.loss_steps), alone.losses):
            worst = max(worst, abs(got - want) / abs(want))
            if abs(got - want) > loss_rtol * abs(want):
                raise AssertionError(f"{r.kind} rank {r.rank}: loss at step {step} {got:.6g}, one process {want:.6g} "
                                     f"(more than {loss_rtol:g} apart)")
    print(f"by hand and the library agree: bytes exact on {len(by_hand)} processes; {len(curves)} loss curves "
          f"within {loss_rtol:g} of one process's (worst {worst:.1e})")


def train_split(config: Any, kind: str, microbatches: int = 4) -> RankReport:
    """In each launched process: `config`'s GPT split the library's way (`kind`: 'tensor',
    'sequence', 'gpipe' or '1f1b'), trained for `config.steps`, measured; this process's report.
    The same loop as the notebook's by-hand cells, with `tensor_parallel` / `pipeline_stages`."""
    # lazy: `import torch` does not load pipelining (torch._dynamo, half a second)
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    schedules = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    if kind not in ("tensor", "sequence", *schedules):
        raise ValueError(f"kind={kind!r}: use 'tensor', 'sequence', 'gpipe' or '1f1b'")
    rank, n = dist.get_rank(), dist.get_world_size()
    cfg, model, batches = _parts(config)
    loss_fn = lambda logits, labels: F.cross_entropy(logits.flatten(0, 1), labels.flatten())  # noqa: E731
    if kind in schedules:
        part = pipeline_stages(model, n, rank)
        stage = PipelineStage(part, rank, n, torch.device("cpu"))
        schedule = schedules[kind](stage, n_microbatches=microbatches, loss_fn=loss_fn)
    else:
        part = tensor_parallel(model, init_device_mesh("cpu", (n,)), sequence_parallel=kind == "sequence")
        stage = None
    optimizer = torch.optim.AdamW(part.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    meter = Meter(part, optimizer, kind=kind, stage=stage, microbatches=microbatches if stage else 1)
    for _ in range(cfg.steps):
        batch = next(batches)
        losses: list[torch.Tensor] = []
        with meter.step(batch):
            if stage is None:
                losses.append(loss_fn(part(batch["inputs"]), batch["labels"]))
                losses[0].backward()
            else:
                args = (batch["inputs"],) if rank == 0 else ()
                schedule.step(*args, **({"target": batch["labels"], "losses": losses} if rank == n - 1 else {}))
                sync_tied_grads(part, n)
            optimizer.step()
            optimizer.zero_grad()
        if losses:
            meter.loss(torch.stack(losses).mean())
    return meter.report(model)


def _parts(config: Any) -> tuple[Any, nn.Module, Iterator[dict]]:
    """What `wb.training_parts(config)` gives on the CPU (the top layer's, not importable here):
    the resolved config, the seeded model and the reshuffled batches run() trains on."""
    c = config.resolved()
    bundle = custom.load_bundle(c)
    model = custom.load_model(c, bundle)
    loader = data_loading.loader(bundle.train, c, bundle.collate_fn)

    def batches() -> Iterator[dict]:
        while True:
            yield from loader

    return c, model, batches()


def launch(fn: Any, *args: Any, num_processes: int = 2, timeout_s: float = 120.0) -> list[Any]:
    """`wb.launch_function(fn, *args, num_processes=..., device="cpu", timeout_s=...)`: `fn` in
    `num_processes` connected CPU processes (gloo), their return values; a launch still running
    after `timeout_s` is stopped and raises. (The children come from a fork server that holds no
    thread, so none inherits a held lock: launching/processes.py.)"""
    return launch_function(fn, *args, num_processes=num_processes, device="cpu", timeout_s=timeout_s)
