"""Parallel plans: each rank's memory and each step's communication, replayed in one process.

`plan_parallel(config, cluster)` predicts, for each way of splitting a step over a cluster's N
devices (`STRATEGIES`: data parallel, FSDP, tensor parallel, pipeline stages, FSDP x TP on a
2-D mesh), each rank's peak bytes, its parameter, gradient and optimizer-state bytes, and the
bytes of every collective (and point-to-point send) one optimizer step calls, by kind. No peer
is started: rank r's step is replayed in this process, in a fake world of N ranks, on fake
tensors, through the real wrappers (`planner.parallel_replay`).

Rank r's figures depend on r only through its share (the rows FSDP2 gives it; its pipeline
stage), so one replay per distinct share is made: 64 ranks cost a few replays. A plan that
takes more than a few seconds says so while it runs (`planner.heartbeat`: which replay, how
many are done and left, the time so far and left). The communication time is a
bandwidth-only estimate: the bytes a ring sends per rank (`planner.communication.wire_bytes`)
over the link's bandwidth; no latency, no overlap with compute. The peak is counted as CPU
processes hold it (tensor bytes, exactly): a GPU's allocator rounding and cuBLAS workspaces,
which `estimate(device='cuda')` adds, are not added here.

Every argument is checked before the first replay (`base.arguments`): one line naming it and
the fix.

Example:
    >>> plans = plan_parallel(RunConfig(model="gpt", preset="cpu-quick"), Cluster(gpus=8, memory_gib=80, link_gbps=100))  # doctest: +SKIP
    >>> plans[0].peak_bytes, plans[0].collective_bytes                                                                 # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from workbench.base.arguments import ArgumentError, instance, names, number, whole_number
from workbench.base.report import Report, format_bytes
from workbench.core.config import RunConfig, run_config
from workbench.core.custom import shown_model
from workbench.core.measure.counters import shard_rows
from workbench.planner.communication import wire_bytes
from workbench.planner.estimate import _freeze, _spec_key, input_spec, model_key
from workbench.planner.fakemodel import cannot_trace, fake_mode
from workbench.planner.fakestate import build
from workbench.planner.heartbeat import Heartbeat
from workbench.planner.parallel_replay import (  # noqa: F401 - the replay's parts, as tests and the measured runs call them
    RankFigures,
    make_mesh,
    outside_a_process_group,
    parallel_step,
    plain_backward,
    replay,
    steady_step,
    wrap,
)
from workbench.planner.parallelize import stage_layers

__all__ = ["STRATEGIES", "Cluster", "ParallelPlan", "ParallelPlans", "parallel_step", "plan_parallel", "replay"]

STRATEGIES = ("dp", "fsdp", "tp", "pp", "fsdp+tp")
"""'dp': every rank holds the whole model state and all-reduces the gradients; 'fsdp': each rank
holds 1/N of it (FSDP2), gathering a block's parameters to run it; 'tp': each rank holds 1/N of
every block's matrices and heads (planner.parallelize.tensor_parallel), all-reducing the
stream; 'pp': rank r runs stage r of N (planner.parallelize.pipeline_stages) under GPipe, N
micro-batches a step, sending the stream forward and its gradient back; 'fsdp+tp': a 2-D
mesh, TP within each row of `tp` ranks, FSDP down the columns of N/tp ranks. The config's
`batch_size` is what one rank computes on: its own batch (dp, fsdp), its TP group's shared
batch (tp), the pipeline's whole batch, split into N micro-batches (pp)."""

MOST_GPUS = 4096
MOST_GIB = 2**20
"""A device of more memory than this (1 PiB) is a typo, not a plan."""
LEAST_GBPS, MOST_GBPS = 0.001, 10**6
"""A link of less than 1 Mb/s or more than 1 Pb/s is a typo, not a plan."""


@dataclasses.dataclass(frozen=True, slots=True)
class Cluster:
    """N devices of `memory_gib` each, joined by a link of `link_gbps` gigabits per second."""

    gpus: int
    memory_gib: float
    link_gbps: float

    def __post_init__(self) -> None:
        example = "Cluster(gpus=8, memory_gib=80, link_gbps=100)"
        whole_number("gpus", self.gpus, most=MOST_GPUS, example=example)
        number("memory_gib", self.memory_gib, most=MOST_GIB, unit=" of GiB", example=example)
        number("link_gbps", self.link_gbps, least=LEAST_GBPS, most=MOST_GBPS, unit=" of Gb/s", example=example)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    @property
    def link_bytes_per_s(self) -> float:
        return self.link_gbps * 1e9 / 8


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
        """Bytes the busiest rank sends per step, collectives over a ring (planner.communication.wire_bytes)."""
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


def _rows(config: RunConfig) -> list[int]:
    """The first dimension of every parameter: what FSDP2 splits."""
    cfg = config.resolved()
    key = model_key(cfg)
    with fake_mode():
        return [p.shape[0] for p in build(key, _spec_key(input_spec(cfg), key), _freeze(cfg.dims)).parameters()]


def _shares(config: RunConfig, strategy: str, processes: int, tp: int) -> list[tuple]:
    """A key per rank that is equal for two ranks only if they hold the same shapes (so one
    replay serves both): the rows FSDP2 gives each parameter (under TP, of its whole or its
    1/tp first dimension, whichever it has); TP alone splits evenly (every rank alike)."""
    if strategy == "pp":  # the first and last stages differ; middle ones by their blocks
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
    if "fsdp" in strategy.split("+") and isinstance(cfg.model, nn.Module):
        return (f"FSDP is applied to the built-in models block by block (switches.sharding); model="
                f"{shown_model(cfg.model)} is your own: wrap it with fully_shard yourself")
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


def plan_parallel(config: RunConfig, cluster: Cluster, *,
                  strategies: tuple[str, ...] | list[str] | set[str] = STRATEGIES, tp: int = 2) -> ParallelPlans:
    """Every strategy over the cluster's `gpus` ranks: each rank's figures, replayed (one replay
    per distinct share of the model), the step's collectives and their bandwidth-only time.
    `strategies`: a list, tuple or set of STRATEGIES' names. `tp`: the tensor-parallel ranks of
    'fsdp+tp' (FSDP across the gpus/tp rows). A strategy that cannot split this model over
    these ranks is left out, its reason in `plans.skipped`. A plan that takes more than a few
    seconds prints where it stands every few seconds."""
    cfg, strategies, tp = _checked(config, cluster, strategies, tp)
    n, skipped, shares, figures = cluster.gpus, {}, {}, {}
    with Heartbeat("plan_parallel") as beat:
        beat.now(f"reading the model's shapes for {n} ranks")
        for strategy in strategies:
            if reason := cannot_split(cfg, strategy, n, tp):
                skipped[strategy] = reason
            else:
                shares[strategy] = _shares(cfg, strategy, n, tp)
        todo = [(strategy, ranks.index(s), s) for strategy, ranks in shares.items() for s in dict.fromkeys(ranks)]
        beat.total = len(todo)
        for strategy, rank, share in todo:  # the first rank of each distinct share stands for all
            beat.now(f"replaying {strategy} x {n} (rank {rank})")
            figures[strategy, share] = _replayed(cfg, strategy, n, rank, tp)
            beat.done()
    plans = [ParallelPlan(strategy, n, tuple(figures[strategy, s] for s in ranks), cluster,
                          {"tp": n, "fsdp+tp": tp}.get(strategy, 1)) for strategy, ranks in shares.items()]
    return ParallelPlans(plans, skipped)


def _checked(config: Any, cluster: Any, strategies: Any, tp: Any) -> tuple[RunConfig, tuple[str, ...], int]:
    """plan_parallel's arguments, checked before any replay: the resolved config, the strategies, tp."""
    cfg = run_config(config, example="RunConfig(model='gpt')")
    instance("cluster", cluster, Cluster, "cluster=wb.Cluster(gpus=8, memory_gib=80, link_gbps=100)")
    strategies = names("strategies", strategies, STRATEGIES, "strategies=('dp', 'fsdp')")
    tp = whole_number("tp", tp, least=2, most=MOST_GPUS, example="tp=2 (the tensor-parallel ranks of 'fsdp+tp')")
    if cfg.sharding != "none":
        raise ArgumentError("plan_parallel() chooses the sharding itself; pass a config with sharding='none'")
    if cfg.optimizer == "adamw8bit":  # its step runs bitsandbytes' kernels, which read the values
        raise ArgumentError("optimizer='adamw8bit' cannot be replayed on fake tensors (bitsandbytes' kernels read "
                            "the values); plan with optimizer='adamw', and wb.estimate() gives the 8-bit state's bytes")
    outside_a_process_group()
    return cfg, strategies, tp


def _replayed(cfg: RunConfig, strategy: str, processes: int, rank: int, tp: int) -> RankFigures:
    """replay(), with a learner's module that cannot run on fake tensors said in one line."""
    try:
        return replay(cfg, strategy, processes, rank, tp)
    except Exception as error:
        if not isinstance(cfg.model, nn.Module) or isinstance(error, ValueError):
            raise
        raise cannot_trace(type(cfg.model).__name__, error) from None
