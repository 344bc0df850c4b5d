"""Parallel plans: each rank's memory and each step's communication, replayed in one process.

`plan_parallel(config, cluster)` predicts, for data parallel ('dp': DistributedDataParallel)
and fully sharded ('fsdp': FSDP2's `fully_shard`, ZeRO stage 3) over a cluster's N devices:
each rank's peak bytes, its parameter, gradient and optimizer-state bytes, and the bytes of
every collective one optimizer step calls, by kind. No peer is started: torch's fake process
group (`torch.testing._internal.distributed.fake_pg`, backend "fake") lets this process be
rank r of a world of N, where every collective returns at once without moving data, while
the model lives on the estimator's fake tensors (shapes, no storage). The real wrapper then
runs as it would on rank r: FSDP2 shards, all-gathers and reduce-scatters; the counters the
real runs use (`measure.live.LiveTensors`, `measure.communication.CollectiveCounter`) read it.

DDP itself cannot be built on fake tensors (its C++ reducer reads their data), so 'dp' is
replayed with what DDP does: the gradients laid out in buckets of torch's sizes (1 MiB first,
then 25 MiB: `dist._compute_bucket_assignment_by_size`), each bucket's flat buffer held all
along, each all-reduced once per step.

The step replayed is `parallel_step`: forward, loss, backward, the optimizer step, gradients
set to None; the second of two steps is read (the optimizer state exists). Rank r's figures
depend on r only through the rows FSDP2 gives it, so one replay per distinct share is made: 64
ranks cost a few replays. The communication time is a bandwidth-only estimate: the bytes a ring
sends per rank (`measure.communication.wire_bytes`) over the link's bandwidth; no latency, no
overlap with compute.

Example:
    >>> plans = plan_parallel(RunConfig(model="gpt", preset="cpu-quick"), Cluster(gpus=8, memory_gib=80, link_gbps=100))  # doctest: +SKIP
    >>> plans[0].peak_bytes, plans[0].collective_bytes                                                                 # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from workbench.core.config import RunConfig
from workbench.core.report import Report, format_bytes
from workbench.measure.communication import CollectiveCounter, wire_bytes
from workbench.measure.counters import gradient_bytes, optimizer_state_bytes, parameter_bytes, shard_rows
from workbench.measure.live import LiveTensors

__all__ = ["STRATEGIES", "Cluster", "ParallelPlan", "ParallelPlans", "parallel_step", "plan_parallel", "replay"]

STRATEGIES = ("dp", "fsdp")
"""'dp': every rank holds the whole model state and all-reduces the gradients; 'fsdp': each rank
holds 1/N of it (FSDP2), gathering a block's parameters to run it."""

DDP_BUCKET_BYTES = (1024 * 1024, 25 * 1024 * 1024)
"""DistributedDataParallel's bucket caps: the first bucket (`dist._DEFAULT_FIRST_BUCKET_BYTES`), then `bucket_cap_mb=25`."""


@dataclasses.dataclass(frozen=True, slots=True)
class Cluster:
    """N devices of `memory_gib` each, joined by a link of `link_gbps` gigabits per second."""

    gpus: int
    memory_gib: float
    link_gbps: float

    def __post_init__(self) -> None:
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or not 1 <= self.gpus <= 4096:
            raise ValueError(f"Cluster(gpus={self.gpus!r}) must be a whole number from 1 to 4096; pass e.g. gpus=8")
        for name in ("memory_gib", "link_gbps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"Cluster({name}={value!r}) must be a positive number; pass e.g. {name}=80")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    @property
    def link_bytes_per_s(self) -> float:
        return self.link_gbps * 1e9 / 8


@dataclasses.dataclass(frozen=True, slots=True)
class RankFigures:
    """One rank's bytes in a steady-state step, and the collectives that step calls."""

    peak_bytes: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    collective_bytes: dict[str, int]
    collective_calls: dict[str, int]


@dataclasses.dataclass(frozen=True, slots=True)
class ParallelPlan:
    """A strategy on a cluster: every rank's figures, the step's communication and its time."""

    strategy: str
    processes: int
    ranks: tuple[RankFigures, ...]
    """Rank r's figures at index r."""
    cluster: Cluster

    @property
    def peak_bytes(self) -> int:
        """The largest rank's peak: the figure to hold against one device."""
        return max(r.peak_bytes for r in self.ranks)

    @property
    def collective_bytes(self) -> dict[str, int]:
        """Bytes of the full tensors each collective kind moves per step (rank 0's calls)."""
        return self.ranks[0].collective_bytes

    @property
    def wire_bytes(self) -> float:
        """Bytes one rank sends per step over a ring (see measure.communication.wire_bytes)."""
        return sum(wire_bytes(kind, n, self.processes) for kind, n in self.collective_bytes.items())

    @property
    def comm_seconds(self) -> float:
        """The step's communication at the link's bandwidth alone: no latency, no overlap."""
        return self.wire_bytes / self.cluster.link_bytes_per_s

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.cluster.memory_bytes


class ParallelPlans(Report, tuple):
    """Plans, one per strategy, shown as a table."""

    header = ("strategy", "peak per rank", "params / grads / optimizer (rank 0)", "collectives per step", "comm time")

    def rows(self) -> list[tuple[str, ...]]:
        out = []
        for p in self:
            r = p.ranks[0]
            kinds = ", ".join(f"{k} {format_bytes(n)}" for k, n in sorted(p.collective_bytes.items())) or "none"
            out.append((f"{p.strategy} x {p.processes}" + ("" if p.fits else " (does not fit)"), format_bytes(p.peak_bytes),
                        " / ".join(format_bytes(n) for n in (r.parameter_bytes, r.gradient_bytes, r.optimizer_state_bytes)),
                        kinds, f"{p.comm_seconds * 1e3:.3g} ms (bandwidth only)"))
        return out

    def caption(self) -> str:
        c = self[0].cluster if self else None
        return f"{c.gpus} devices of {c.memory_gib:g} GiB, link {c.link_gbps:g} Gb/s" if c else ""


def ddp_buckets(model: nn.Module) -> list[torch.Tensor]:
    """Flat gradient buffers laid out as DDP lays them out (its default caps, reverse order)."""
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.requires_grad][::-1]
    buckets, _ = dist._compute_bucket_assignment_by_size(params, list(DDP_BUCKET_BYTES), [False] * len(params))
    return [torch.zeros(sum(params[i].numel() for i in bucket), dtype=params[bucket[0]].dtype) for bucket in buckets]


def wrap(model: nn.Module, strategy: str, mesh: Any) -> tuple[nn.Module, list[torch.Tensor]]:
    """The model as `strategy` runs it on this rank, and (dp) the gradient buckets it all-reduces."""
    if strategy == "fsdp":
        from workbench.switches.sharding import shard_model
        return shard_model(model, mesh=mesh), []
    return model, ddp_buckets(model)


def parallel_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
                  buckets: list[torch.Tensor] = ()) -> tuple[int, int]:
    """One training step (forward, loss, backward, all-reduce of `buckets`, optimizer step,
    gradients set to None); (gradient bytes, optimizer-state bytes) as they stood at the step."""
    import torch.distributed as dist

    from workbench.core.models import loss_fn

    loss = loss_fn(model(batch["inputs"]), batch["labels"])
    loss.backward()
    del loss
    for bucket in buckets:  # what DDP's reducer does with the gradients it copied in
        dist.all_reduce(bucket)
    grads = gradient_bytes(model)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grads, optimizer_state_bytes(optimizer)


def steady_step(build: Callable[[], nn.Module], cfg: RunConfig, strategy: str, mesh: Any, batch: Callable[[], dict],
                wrapper: Callable[[nn.Module, str, Any], tuple[nn.Module, list]] = wrap) -> RankFigures:
    """Build, wrap and train two steps under the counters; the second step's figures. The
    measured runs (real tensors, a gloo group) call this too, with DDP itself as `wrapper`."""
    from workbench.core.optim import make_optimizer

    with LiveTensors() as live:
        model, buckets = wrapper(build(), strategy, mesh)
        optimizer = make_optimizer(model, cfg)
        parallel_step(model, optimizer, batch(), buckets)
        live.reset_peak()
        with CollectiveCounter() as comm:
            grads, state = parallel_step(model, optimizer, batch(), buckets)
        return RankFigures(live.peak_bytes, parameter_bytes(model), grads, state, dict(comm.bytes), dict(comm.calls))


@contextlib.contextmanager
def fake_world(processes: int, rank: int) -> Iterator[Any]:
    """This process as rank `rank` of a fake world of `processes`: its device mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("plan_parallel() replays a world of its own; call it outside a launched process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=processes)
    try:
        yield init_device_mesh("cpu", (processes,))  # made outside fake mode: it reads its ranks' values
    finally:
        dist.destroy_process_group()


def replay(config: RunConfig, strategy: str, processes: int, rank: int = 0) -> RankFigures:
    """Rank `rank`'s figures of `strategy` over `processes`, on fake tensors in a fake world."""
    from workbench.planner.estimate import _freeze, _spec_key, input_spec, model_key
    from workbench.planner.fakemodel import fake_mode
    from workbench.planner.fakestate import build
    from workbench.planner.fakestep import _inputs

    cfg = config.resolved()
    key = model_key(cfg)
    spec = _spec_key(input_spec(cfg), key)
    with fake_world(processes, rank) as mesh, fake_mode():
        return steady_step(lambda: build(key, spec, _freeze(cfg.dims)), cfg, strategy, mesh,
                           lambda: _inputs(spec, cfg.batch_size))


def _share(config: RunConfig, strategy: str, processes: int) -> list[tuple]:
    """Each rank's share of the model as FSDP2 splits it (rows per parameter); one for dp."""
    if strategy != "fsdp":
        return [()] * processes
    from workbench.planner.estimate import _freeze, _spec_key, input_spec, model_key
    from workbench.planner.fakemodel import fake_mode
    from workbench.planner.fakestate import build

    cfg = config.resolved()
    key = model_key(cfg)
    with fake_mode():
        rows = [p.shape[0] for p in build(key, _spec_key(input_spec(cfg), key), _freeze(cfg.dims)).parameters()]
    return [tuple(shard_rows(n, processes, r) for n in rows) for r in range(processes)]


def plan_parallel(config: RunConfig, cluster: Cluster, *, strategies: tuple[str, ...] = STRATEGIES) -> ParallelPlans:
    """Every strategy over the cluster's `gpus` ranks: each rank's figures, replayed (one replay
    per distinct share of the model), the step's collectives and their bandwidth-only time."""
    if not isinstance(cluster, Cluster):
        raise ValueError(f"cluster={cluster!r} must be a Cluster; pass cluster=wb.Cluster(gpus=8, memory_gib=80, link_gbps=100)")
    for strategy in strategies:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy {strategy!r} is not known; use one of {', '.join(STRATEGIES)}")
    n = cluster.gpus
    if config.resolved().sharding != "none":
        raise ValueError("plan_parallel() chooses the sharding itself; pass a config with sharding='none'")
    plans = []
    for strategy in strategies:
        if n < 2 and strategy != "dp":
            continue
        shares, seen = _share(config, strategy, n), {}
        for rank, share in enumerate(shares):
            if share not in seen:
                seen[share] = replay(config, strategy, n, rank)
        plans.append(ParallelPlan(strategy, n, tuple(seen[s] for s in shares), cluster))
    return ParallelPlans(plans)
