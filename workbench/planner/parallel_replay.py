"""One rank of a parallel plan, replayed in one process: a fake world, fake tensors, the real wrappers.

No peer is started: torch's fake process group (`torch.testing._internal.distributed.fake_pg`,
backend "fake") lets this process be rank r of a world of N, where every collective returns at
once without moving data, while the model lives on the estimator's fake tensors (shapes, no
storage). The real wrappers then run as they would on rank r (FSDP2 shards and gathers,
DTensor's TP all-reduces, a pipeline stage sends and receives); the counters the real runs
use (`planner.live.LiveTensors`, `planner.communication.CollectiveCounter`) read them.
TP and PP use `planner.parallelize` (the GPT split by tensor and by stage), the same code
a launched run calls.

DDP itself cannot be built on fake tensors (its C++ reducer reads their data), so 'dp' is
replayed with what DDP does: the gradients laid out in buckets of torch's sizes (1 MiB first,
then 25 MiB: `dist._compute_bucket_assignment_by_size`), each bucket's flat buffer held all
along, each all-reduced once per step.

The step replayed is `parallel_step`: forward, loss, backward, the optimizer step, gradients
set to None; the second of two steps is read (the optimizer state exists). The measured runs
(tests/test_plan_parallel.py: real tensors, a gloo group) call `steady_step` too.

Example:
    >>> figures = replay(RunConfig(model="gpt", preset="cpu-quick"), "fsdp", processes=8, rank=0)  # doctest: +SKIP
    >>> figures.parameter_bytes, figures.collective_bytes                                            # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from workbench.core.config import RunConfig
from workbench.core.measure.counters import gradient_bytes, optimizer_state_bytes, parameter_bytes
from workbench.core.models import loss_fn
from workbench.core.switches.optimizer import make_optimizer
from workbench.core.switches.sharding import shard_model
from workbench.planner import parallelize
from workbench.planner.communication import CollectiveCounter
from workbench.planner.estimate import _freeze, _spec_key, input_spec, model_key
from workbench.planner.fakemodel import fake_mode
from workbench.planner.fakestate import build
from workbench.planner.fakestep import _inputs
from workbench.planner.live import LiveTensors
from workbench.planner.parallelize import pipeline_stages, sync_tied_grads, tensor_parallel

__all__ = ["RankFigures", "make_mesh", "parallel_step", "plain_backward", "replay", "steady_step", "wrap"]

DDP_BUCKET_BYTES = (1024 * 1024, 25 * 1024 * 1024)
"""DistributedDataParallel's bucket caps: the first bucket (`dist._DEFAULT_FIRST_BUCKET_BYTES`), then `bucket_cap_mb=25`."""




@dataclasses.dataclass(frozen=True, slots=True)
class RankFigures:
    """One rank's bytes in a steady-state step, and the collectives that step calls."""

    peak_bytes: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    collective_bytes: dict[str, int]
    collective_calls: dict[str, int]


def ddp_buckets(model: nn.Module) -> list[torch.Tensor]:
    """Flat gradient buffers laid out as DDP lays them out (its default caps, reverse order)."""
    params = [p for p in model.parameters() if p.requires_grad][::-1]
    buckets, _ = dist._compute_bucket_assignment_by_size(params, list(DDP_BUCKET_BYTES), [False] * len(params))
    return [torch.zeros(sum(params[i].numel() for i in bucket), dtype=params[bucket[0]].dtype) for bucket in buckets]


def make_mesh(strategy: str, processes: int, tp: int) -> Any:
    """The device mesh `strategy` runs on: 1-D over every process, or ('dp', 'tp') for FSDP x TP."""
    if strategy == "fsdp+tp":
        return init_device_mesh("cpu", (processes // tp, tp), mesh_dim_names=("dp", "tp"))
    return init_device_mesh("cpu", (processes,))


def plain_backward(model: nn.Module, buckets: list[torch.Tensor] = ()) -> Callable[[dict], None]:
    """Forward, loss and backward of a whole batch; then each of `buckets` all-reduced, as DDP's
    reducer does with the gradients it copied in (dp)."""
    def backward(batch: dict[str, torch.Tensor]) -> None:
        loss_fn(model(batch["inputs"]), batch["labels"]).backward()
        for bucket in buckets:
            dist.all_reduce(bucket)

    return backward


def pipeline(model: nn.Module, mesh: Any, cfg: RunConfig) -> tuple[nn.Module, Callable[[dict], None]]:
    """This rank's pipeline stage (planner.parallelize.pipeline_stages) under GPipe with as many
    micro-batches as stages; its shapes given up front (no metadata exchanged)."""
    # lazy: `import torch` does not load pipelining (torch._dynamo, half a second)
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

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
    # lazy: `import torch` does not load pipelining (torch._dynamo, half a second)
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
    with LiveTensors() as live:
        model, backward = wrapper(build(), strategy, mesh, cfg)
        optimizer = make_optimizer(model, cfg)
        parallel_step(model, optimizer, batch(), backward)
        live.reset_peak()
        with CollectiveCounter() as comm:
            grads, state = parallel_step(model, optimizer, batch(), backward)
        return RankFigures(live.peak_bytes, parameter_bytes(model), grads, state, dict(comm.bytes), dict(comm.calls))


def outside_a_process_group() -> None:
    """The replay makes a (fake) process group of its own: none may be up already."""
    if dist.is_available() and dist.is_initialized():
        raise RuntimeError("plan_parallel() replays a world of its own; call it outside a launched process")


@contextlib.contextmanager
def fake_world(strategy: str, processes: int, rank: int, tp: int) -> Iterator[Any]:
    """This process as rank `rank` of a fake world of `processes`: the strategy's device mesh."""
    # lazy: torch's test helpers only for the replay (they import torch._dynamo)
    from torch.testing._internal.distributed.fake_pg import FakeStore

    outside_a_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=processes)
    try:
        with _meshes_on_real_tensors(), _one_chunk_at_a_time():
            yield make_mesh(strategy, processes, tp)  # made outside fake mode: it reads its ranks' values
    finally:
        parallelize._TIED_GROUPS.clear()  # its cached head-and-embedding group died with this world
        dist.destroy_process_group()


class _Chunks(Sequence):
    """What `torch.chunk(tensor, n, dim)` padded with empty tensors to n would hold (FSDP2's
    `_chunk_with_empty`), each chunk made when asked for: a view of its rows, or empty."""

    def __init__(self, tensor: torch.Tensor, num_chunks: int, dim: int) -> None:
        self.tensor, self.num_chunks, self.dim = tensor, num_chunks, dim
        self.rows = -(-tensor.size(dim) // num_chunks)  # torch.chunk's chunk size

    def __len__(self) -> int:
        return self.num_chunks

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(self.num_chunks)[i]]
        start = range(self.num_chunks)[i] * self.rows
        length = self.tensor.size(self.dim)
        return self.tensor.narrow(self.dim, start, min(self.rows, length - start)) if start < length else \
            self.tensor.new_empty(0)


@contextlib.contextmanager
def _one_chunk_at_a_time() -> Iterator[None]:
    """FSDP2 cuts every parameter into N chunks (`_chunk_with_empty`) and keeps two: this rank's
    and the first. On fake tensors each chunk is an op through the fake mode and the live-tensor
    counter: a replay of FSDP over 512 ranks spent 444 of its 521 s making chunks (cProfile, on
    this loaded 2-core machine), and 4,096 ranks took hours. In the replay a chunk is made when
    FSDP2 asks for it, as torch.chunk makes it (tests/test_plan_parallel.py holds the replay to
    real FSDP2 on gloo processes)."""
    # lazy: `import torch` does not load FSDP (600 modules, half a second)
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    every = getattr(_fsdp_param, "_chunk_with_empty", None)
    if every is None:  # a torch that cuts its chunks elsewhere: replayed as it is, only slower
        yield
        return
    _fsdp_param._chunk_with_empty = _Chunks
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = every


@contextlib.contextmanager
def _meshes_on_real_tensors() -> Iterator[None]:
    """FSDP2 over a TP model joins the two meshes (`DeviceMesh._concatenate`), indexing a real
    tensor of ranks, inside the replay's fake mode: there it runs with fake mode set aside."""
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
    cfg = config.resolved()
    key = model_key(cfg)
    spec = _spec_key(input_spec(cfg), key)
    with fake_world(strategy, processes, rank, tp) as mesh, fake_mode():
        return steady_step(lambda: build(key, spec, _freeze(cfg.dims)), cfg, strategy, mesh,
                           lambda: _inputs(spec, cfg.batch_size))
