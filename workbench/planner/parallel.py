"""Parallel plans: each rank's memory and each step's communication, replayed in one process.

`plan_parallel(config, cluster)` predicts, for each way of splitting a step over a cluster's N
devices (`STRATEGIES`: data parallel, FSDP, tensor parallel, pipeline stages, FSDP x TP on a
2-D mesh), each rank's peak bytes, its parameter, gradient and optimizer-state bytes, and the
bytes of every collective (and point-to-point send) one optimizer step calls, by kind. No peer
is started: torch's fake process group (`torch.testing._internal.distributed.fake_pg`, backend
"fake") lets this process be rank r of a world of N, where every collective returns at once
without moving data, while the model lives on the estimator's fake tensors (shapes, no
storage). The real wrappers then run as they would on rank r (FSDP2 shards and gathers,
DTensor's TP all-reduces, a pipeline stage sends and receives); the counters the real runs
use (`measure.live.LiveTensors`, `measure.communication.CollectiveCounter`) read them.
TP and PP use `switches.parallelize` (the GPT split by tensor and by stage), the same code
a launched run calls.

DDP itself cannot be built on fake tensors (its C++ reducer reads their data), so 'dp' is
replayed with what DDP does: the gradients laid out in buckets of torch's sizes (1 MiB first,
then 25 MiB: `dist._compute_bucket_assignment_by_size`), each bucket's flat buffer held all
along, each all-reduced once per step.

The step replayed is `parallel_step`: forward, loss, backward, the optimizer step, gradients
set to None; the second of two steps is read (the optimizer state exists). Rank r's figures
depend on r only through its share (the rows FSDP2 gives it; its pipeline stage), so one
replay per distinct share is made: 64 ranks cost a few replays. The communication time is a bandwidth-only estimate: the bytes a ring
sends per rank (`measure.communication.wire_bytes`) over the link's bandwidth; no latency, no
overlap with compute. The peak is counted as CPU processes hold it (tensor bytes, exactly):
a GPU's allocator rounding and cuBLAS workspaces, which `estimate(device='cuda')` adds, are
not added here.

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

STRATEGIES = ("dp", "fsdp", "tp", "pp", "fsdp+tp")
"""'dp': every rank holds the whole model state and all-reduces the gradients; 'fsdp': each rank
holds 1/N of it (FSDP2), gathering a block's parameters to run it; 'tp': each rank holds 1/N of
every block's matrices and heads (switches.parallelize.tensor_parallel), all-reducing the
stream; 'pp': rank r runs stage r of N (switches.parallelize.pipeline_stages) under GPipe, N
micro-batches a step, sending the stream forward and its gradient back; 'fsdp+tp': a 2-D
mesh, TP within each row of `tp` ranks, FSDP down the columns of N/tp ranks. The config's
`batch_size` is what one rank computes on: its own batch (dp, fsdp), its TP group's shared
batch (tp), the pipeline's whole batch, split into N micro-batches (pp)."""

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
    tp: int = 1
    """Tensor-parallel ranks ('tp': all of them; 'fsdp+tp': a row of the mesh)."""

    def ring(self, kind: str) -> int:
        """The ranks a collective of `kind` runs over: FSDP x TP all-reduces within a row of tp
        ranks (TP) and gathers and scatters down a column of N/tp (FSDP); else all N."""
        if self.strategy == "pp":  # all-reduce: the tied head's gradient, first and last stage
            return 2
        if self.strategy != "fsdp+tp":
            return self.processes
        return self.tp if kind == "all_reduce" else self.processes // self.tp

    @property
    def peak_bytes(self) -> int:
        """The largest rank's peak: the figure to hold against one device."""
        return max(r.peak_bytes for r in self.ranks)

    @property
    def collective_bytes(self) -> dict[str, int]:
        """Bytes of the full tensors each collective kind moves per step (rank 0's calls; a
        pipeline's ranks differ: see `ranks`)."""
        return self.ranks[0].collective_bytes

    @property
    def wire_bytes(self) -> float:
        """Bytes the busiest rank sends per step, collectives over a ring (measure.communication.wire_bytes)."""
        return max(sum(wire_bytes(kind, n, self.ring(kind)) for kind, n in r.collective_bytes.items())
                   for r in self.ranks)

    @property
    def comm_seconds(self) -> float:
        """The step's communication at the link's bandwidth alone: no latency, no overlap."""
        return self.wire_bytes / self.cluster.link_bytes_per_s

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.cluster.memory_bytes


class ParallelPlans(Report, tuple):
    """Plans, one per strategy, shown as a table; `skipped`: strategy -> why it cannot split."""

    def __new__(cls, plans: list[ParallelPlan], skipped: dict[str, str] | None = None) -> ParallelPlans:
        self = super().__new__(cls, plans)
        self.skipped = dict(skipped or {})
        return self

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
        left = "; ".join(f"{k} left out: {why}" for k, why in self.skipped.items())
        return "; ".join(x for x in (f"{c.gpus} devices of {c.memory_gib:g} GiB, link {c.link_gbps:g} Gb/s" if c else "", left) if x)


def ddp_buckets(model: nn.Module) -> list[torch.Tensor]:
    """Flat gradient buffers laid out as DDP lays them out (its default caps, reverse order)."""
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.requires_grad][::-1]
    buckets, _ = dist._compute_bucket_assignment_by_size(params, list(DDP_BUCKET_BYTES), [False] * len(params))
    return [torch.zeros(sum(params[i].numel() for i in bucket), dtype=params[bucket[0]].dtype) for bucket in buckets]


def make_mesh(strategy: str, processes: int, tp: int) -> Any:
    """The device mesh `strategy` runs on: 1-D over every process, or ('dp', 'tp') for FSDP x TP."""
    from torch.distributed.device_mesh import init_device_mesh

    if strategy == "fsdp+tp":
        return init_device_mesh("cpu", (processes // tp, tp), mesh_dim_names=("dp", "tp"))
    return init_device_mesh("cpu", (processes,))


def plain_backward(model: nn.Module, buckets: list[torch.Tensor] = ()) -> Callable[[dict], None]:
    """Forward, loss and backward of a whole batch; then each of `buckets` all-reduced, as DDP's
    reducer does with the gradients it copied in (dp)."""
    import torch.distributed as dist

    from workbench.core.models import loss_fn

    def backward(batch: dict[str, torch.Tensor]) -> None:
        loss_fn(model(batch["inputs"]), batch["labels"]).backward()
        for bucket in buckets:
            dist.all_reduce(bucket)

    return backward


def pipeline(model: nn.Module, mesh: Any, cfg: RunConfig) -> tuple[nn.Module, Callable[[dict], None]]:
    """This rank's pipeline stage (switches.parallelize.pipeline_stages) under GPipe with as many
    micro-batches as stages; its shapes given up front (no metadata exchanged)."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from workbench.core.models import loss_fn
    from workbench.switches.parallelize import pipeline_stages, sync_tied_grads

    stages, rank = mesh.size(), dist.get_rank()
    stage = pipeline_stages(model, stages, rank)
    micro, width = cfg.batch_size // stages, model.wte.embedding_dim
    stream = torch.empty(micro, cfg.seq_len, width, requires_grad=True)  # its gradient flows back
    inputs = torch.zeros(micro, cfg.seq_len, dtype=torch.long) if stage.first else stream
    outputs = torch.empty(micro, cfg.seq_len, model.lm_head.out_features) if stage.last else stream
    schedule = ScheduleGPipe(PipelineStage(stage, rank, stages, torch.device("cpu"), input_args=inputs,
                                           output_args=outputs), stages, loss_fn=loss_fn)
    if dist.get_backend() == "fake":
        _vote_alone(schedule)

    def backward(batch: dict[str, torch.Tensor]) -> None:
        args = (batch["inputs"],) if stage.first else ()
        schedule.step(*args, target=batch["labels"] if stage.last else None)
        sync_tied_grads(stage, stages)

    return stage, backward


def _vote_alone(schedule: Any) -> None:
    """The schedule's first step has the stages vote, over the wire, whether their shapes are known
    up front, and reads the result's value: a fake peer sends nothing. Every stage here has
    the same kind of shapes (given, plain tensors), so its own vote is everyone's."""
    from torch.distributed.pipelining._utils import InferenceMode

    def vote(stages: list, has_backward: bool, p2p_done: bool) -> None:
        for stage in stages:
            dynamic = InferenceMode.needs_dynamic(stage._user_meta, has_backward)
            stage._inference_mode = InferenceMode.DYNAMIC if dynamic else InferenceMode.STATIC

    schedule._warmup_p2p = vote


def wrap(model: nn.Module, strategy: str, mesh: Any, cfg: RunConfig) -> tuple[nn.Module, Callable[[dict], None]]:
    """The model as `strategy` runs it on this rank (what the optimizer holds), and its step's
    forward and backward. FSDP x TP: blocks split by tensor along a row of the mesh, then
    sharded down its columns."""
    from workbench.switches.parallelize import tensor_parallel
    from workbench.switches.sharding import shard_model

    if strategy == "dp":
        return model, plain_backward(model, ddp_buckets(model))
    if strategy == "pp":
        return pipeline(model, mesh, cfg)
    two_d = mesh.ndim == 2
    if "tp" in strategy.split("+"):
        model = tensor_parallel(model, mesh["tp"] if two_d else mesh)
    if "fsdp" in strategy.split("+"):
        model = shard_model(model, mesh=mesh["dp"] if two_d else mesh)
    return model, plain_backward(model)


def parallel_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
                  backward: Callable[[dict], None]) -> tuple[int, int]:
    """One training step (`backward`, the optimizer step, gradients set to None); (gradient
    bytes, optimizer-state bytes) as they stood at the optimizer step."""
    backward(batch)
    grads = gradient_bytes(model)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grads, optimizer_state_bytes(optimizer)


Wrapper = Callable[[nn.Module, str, Any, RunConfig], tuple[nn.Module, Callable[[dict], None]]]


def steady_step(build: Callable[[], nn.Module], cfg: RunConfig, strategy: str, mesh: Any, batch: Callable[[], dict],
                wrapper: Wrapper = wrap) -> RankFigures:
    """Build, wrap and train two steps under the counters; the second step's figures. The
    measured runs (real tensors, a gloo group) call this too, with DDP itself as `wrapper`."""
    from workbench.core.optim import make_optimizer

    with LiveTensors() as live:
        model, backward = wrapper(build(), strategy, mesh, cfg)
        optimizer = make_optimizer(model, cfg)
        parallel_step(model, optimizer, batch(), backward)
        live.reset_peak()
        with CollectiveCounter() as comm:
            grads, state = parallel_step(model, optimizer, batch(), backward)
        return RankFigures(live.peak_bytes, parameter_bytes(model), grads, state, dict(comm.bytes), dict(comm.calls))


@contextlib.contextmanager
def fake_world(strategy: str, processes: int, rank: int, tp: int) -> Iterator[Any]:
    """This process as rank `rank` of a fake world of `processes`: the strategy's device mesh."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("plan_parallel() replays a world of its own; call it outside a launched process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=processes)
    try:
        with _meshes_on_real_tensors():
            yield make_mesh(strategy, processes, tp)  # made outside fake mode: it reads its ranks' values
    finally:
        from workbench.switches import parallelize

        parallelize._TIED_GROUPS.clear()  # its cached head-and-embedding group died with this world
        dist.destroy_process_group()


@contextlib.contextmanager
def _meshes_on_real_tensors() -> Iterator[None]:
    """FSDP2 over a TP model joins the two meshes (`DeviceMesh._concatenate`), indexing a real
    tensor of ranks, inside the replay's fake mode: there it runs with fake mode set aside."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    join = DeviceMesh._concatenate

    def joined(meshes: list) -> Any:
        with unset_fake_temporarily():
            return join(meshes)

    DeviceMesh._concatenate = staticmethod(joined)
    try:
        yield
    finally:
        DeviceMesh._concatenate = staticmethod(join)


def replay(config: RunConfig, strategy: str, processes: int, rank: int = 0, tp: int = 2) -> RankFigures:
    """Rank `rank`'s figures of `strategy` over `processes`, on fake tensors in a fake world."""
    from workbench.planner.estimate import _freeze, _spec_key, input_spec, model_key
    from workbench.planner.fakemodel import fake_mode
    from workbench.planner.fakestate import build
    from workbench.planner.fakestep import _inputs

    cfg = config.resolved()
    key = model_key(cfg)
    spec = _spec_key(input_spec(cfg), key)
    with fake_world(strategy, processes, rank, tp) as mesh, fake_mode():
        return steady_step(lambda: build(key, spec, _freeze(cfg.dims)), cfg, strategy, mesh,
                           lambda: _inputs(spec, cfg.batch_size))


def _rows(config: RunConfig) -> list[int]:
    """The first dimension of every parameter: what FSDP2 splits."""
    from workbench.planner.estimate import _freeze, _spec_key, input_spec, model_key
    from workbench.planner.fakemodel import fake_mode
    from workbench.planner.fakestate import build

    cfg = config.resolved()
    key = model_key(cfg)
    with fake_mode():
        return [p.shape[0] for p in build(key, _spec_key(input_spec(cfg), key), _freeze(cfg.dims)).parameters()]


def _shares(config: RunConfig, strategy: str, processes: int, tp: int) -> list[tuple]:
    """A key per rank that is equal for two ranks only if they hold the same shapes (so one
    replay serves both): the rows FSDP2 gives each parameter (under TP, of its whole or its
    1/tp first dimension, whichever it has); TP alone splits evenly (every rank alike)."""
    if strategy == "pp":  # the first and last stages differ; middle ones by their blocks
        from workbench.switches.parallelize import stage_layers

        layers = stage_layers(config.resolved().dims["n_layer"], processes)
        return [(r == 0, r == processes - 1, len(layers[r])) for r in range(processes)]
    if "fsdp" not in strategy.split("+"):
        return [()] * processes
    rows, dp = _rows(config), processes // (tp if "tp" in strategy.split("+") else 1)
    if dp != processes:
        rows += [n // tp for n in rows]
    coordinate = processes // dp  # rank r sits in row r // tp of the ('dp', 'tp') mesh (1-D: r itself)
    return [tuple(shard_rows(n, dp, rank // coordinate) for n in rows) for rank in range(processes)]


def cannot_split(config: RunConfig, strategy: str, processes: int, tp: int) -> str | None:
    """Why `strategy` cannot run this config on `processes` ranks, or None."""
    cfg = config.resolved()
    if processes < 2 and strategy != "dp":
        return "one device: nothing to split"
    if strategy == "pp":
        return _cannot_pipeline(cfg, processes)
    if "tp" not in strategy.split("+"):
        return None
    if cfg.model != "gpt":
        return "tensor parallel splits the built-in GPT only"
    width = processes if strategy == "tp" else tp
    heads, d_model = cfg.dims["n_head"], cfg.dims["d_model"]
    if heads % width or d_model % width:
        return f"n_head={heads} and d_model={d_model} must divide by {width} tensor-parallel ranks"
    if processes % width or processes == width != 1 and strategy == "fsdp+tp":
        return f"{processes} ranks are not 2 or more rows of tp={width}"
    return None


def _cannot_pipeline(cfg: RunConfig, processes: int) -> str | None:
    if cfg.model != "gpt":
        return "pipeline stages split the built-in GPT only"
    if cfg.dims["n_layer"] < processes:
        return f"n_layer={cfg.dims['n_layer']} gives fewer blocks than {processes} stages"
    if cfg.batch_size % processes:
        return f"batch_size={cfg.batch_size} does not split into {processes} micro-batches"
    if cfg.dims.get("dropout", 0):
        return "dropout must be 0 for a pipeline"
    return None


def plan_parallel(config: RunConfig, cluster: Cluster, *, strategies: tuple[str, ...] = STRATEGIES,
                  tp: int = 2) -> ParallelPlans:
    """Every strategy over the cluster's `gpus` ranks: each rank's figures, replayed (one replay
    per distinct share of the model), the step's collectives and their bandwidth-only time.
    `tp`: the tensor-parallel ranks of 'fsdp+tp' (FSDP across the gpus/tp rows). A strategy
    that cannot split this model over these ranks is left out, its reason in `plans.skipped`."""
    if not isinstance(cluster, Cluster):
        raise ValueError(f"cluster={cluster!r} must be a Cluster; pass cluster=wb.Cluster(gpus=8, memory_gib=80, link_gbps=100)")
    for strategy in strategies:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy {strategy!r} is not known; use one of {', '.join(STRATEGIES)}")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 2:
        raise ValueError(f"tp={tp!r} must be a whole number >= 2 (the tensor-parallel ranks of 'fsdp+tp'); pass e.g. tp=2")
    if config.resolved().sharding != "none":
        raise ValueError("plan_parallel() chooses the sharding itself; pass a config with sharding='none'")
    n, plans, skipped = cluster.gpus, [], {}
    for strategy in strategies:
        if reason := cannot_split(config, strategy, n, tp):
            skipped[strategy] = reason
            continue
        shares, seen = _shares(config, strategy, n, tp), {}
        for rank, share in enumerate(shares):
            if share not in seen:
                seen[share] = replay(config, strategy, n, rank, tp)
        width = {"tp": n, "fsdp+tp": tp}.get(strategy, 1)
        plans.append(ParallelPlan(strategy, n, tuple(seen[s] for s in shares), cluster, width))
    return ParallelPlans(plans, skipped)
