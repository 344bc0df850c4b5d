"""The planner's parallel plans: predicted in one process on a fake process group, measured on
N gloo processes. Each rank's peak within 5% (FSDP: and one gathered block, see BLOCK_BYTES), model-state
and collective bytes and calls exactly.

The measured side runs the same two steps (`parallel.steady_step`) on real tensors in N real
processes, wrapped by the real thing: DistributedDataParallel itself (its C++ reducer, whose
all-reduce torch's default comm hook makes countable; the replay stands in its buckets), FSDP2's
`fully_shard`, DTensor's tensor parallel, torch.distributed.pipelining's stages, over gloo.
"""

from __future__ import annotations

import pytest

from workbench import RunConfig
from workbench.launching.launch import launch_function
from workbench.planner import parallel
from workbench.planner.parallel import Cluster, plan_parallel

D, L, S, V = 32, 2, 16, 256  # a small GPT: width, blocks, sequence, byte vocabulary
GPT = RunConfig(model="gpt", dims={"n_layer": L, "n_head": 4, "d_model": D}, seq_len=S, batch_size=4, device="cpu")
DEEP = RunConfig(model="gpt", dims={"n_layer": 4, "n_head": 4, "d_model": D}, seq_len=S, batch_size=4, device="cpu")
ALL = V * D + S * D + L * (12 * D * D + 13 * D) + 2 * D  # parameters (wte tied to the head)
# FSDP's measured peak once held one all-gathered block more than the replay's, under load in CI: fsdp-4
# rank 1 measured 1,007,224 B against 956,408 predicted, 50,816 B apart, exactly one block's fp32
# parameters, 4 x (12 D^2 + 13 D). The other runs here matched within 5%, so the extra block's lifetime
# depends on timing (most likely the previous gather's buffer, still held by its gloo work when the next
# block is gathered); 5% of these small peaks is less than a block, so the bound allows one more.
BLOCK_BYTES = 4 * (12 * D * D + 13 * D)


def _real_wrap(model, strategy, mesh, cfg):
    if strategy == "dp":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model)
        # DDP's reducer all-reduces its buckets from C++, where CollectiveCounter's Python wrappers
        # see nothing; torch's own default hook (divide by the world size, all-reduce: the same
        # arithmetic) calls dist.all_reduce per bucket, counted.
        ddp.register_comm_hook(None, allreduce_hook)
        return ddp, parallel.plain_backward(ddp)
    return parallel.wrap(model, strategy, mesh, cfg)


def _measured(cfg: RunConfig, strategy: str) -> parallel.RankFigures:
    """In each gloo process: the real model, really wrapped, two real steps."""
    import torch.distributed as dist
    from accelerate import PartialState

    from workbench.planner.estimate import _freeze, _spec_key, input_spec, model_key
    from workbench.planner.fakestate import build
    from workbench.planner.fakestep import _inputs

    PartialState()
    mesh = parallel.make_mesh(strategy, dist.get_world_size(), tp=2)
    cfg = cfg.resolved()
    key = model_key(cfg)
    spec = _spec_key(input_spec(cfg), key)
    return parallel.steady_step(lambda: build(key, spec, _freeze(cfg.dims)), cfg, strategy, mesh,
                                lambda: _inputs(spec, cfg.batch_size), wrapper=_real_wrap)


@pytest.mark.parametrize(("strategy", "processes"), [
    ("dp", 2), ("dp", 4), ("fsdp", 2), ("fsdp", 4), ("tp", 2), ("tp", 4), ("pp", 2), ("pp", 4), ("fsdp+tp", 4)])
def test_each_ranks_peak_and_the_steps_collectives_are_predicted_as_gloo_processes_measure(strategy, processes):
    cfg = DEEP if strategy == "pp" and processes == 4 else GPT  # a stage per block
    measured = launch_function(_measured, cfg, strategy, num_processes=processes, device="cpu", timeout_s=150)
    plan, = plan_parallel(cfg, Cluster(gpus=processes, memory_gib=1, link_gbps=10), strategies=(strategy,))
    for rank, (got, predicted) in enumerate(zip(measured, plan.ranks, strict=True)):
        slack = BLOCK_BYTES if "fsdp" in strategy else 0
        assert abs(predicted.peak_bytes - got.peak_bytes) <= 0.05 * got.peak_bytes + slack, (rank, predicted, got)
        assert (predicted.parameter_bytes, predicted.gradient_bytes, predicted.optimizer_state_bytes) == (
            got.parameter_bytes, got.gradient_bytes, got.optimizer_state_bytes), rank
        assert (predicted.collective_bytes, predicted.collective_calls) == (got.collective_bytes, got.collective_calls)
    if strategy == "dp":  # every gradient all-reduced once per step
        assert plan.collective_bytes == {"all_reduce": 4 * ALL}
    elif strategy == "fsdp":  # the shares add up to the model
        assert sum(r.parameter_bytes for r in plan.ranks) == 4 * ALL
    elif strategy == "pp":  # the stream (b x s x h fp32) sent on, its gradient sent back; the tied head
        stream = 4 * S * D * 4
        assert [r.collective_bytes["send"] for r in plan.ranks] == [stream] + [2 * stream] * (processes - 2) + [stream]
        assert [r.collective_bytes.get("all_reduce") for r in plan.ranks] == [4 * V * D] + [None] * (processes - 2) + [4 * V * D]
    else:  # TP: per block, the stream (b x s x h fp32) all-reduced twice forward, twice backward
        assert plan.collective_bytes["all_reduce"] == L * 4 * (4 * S * D * 4)


def test_64_ranks_are_planned_in_one_process_with_shares_that_add_up_to_the_model():
    plans = plan_parallel(GPT, Cluster(gpus=64, memory_gib=1, link_gbps=100))
    dp, fsdp, both = plans
    assert [(p.strategy, len(p.ranks)) for p in plans] == [("dp", 64), ("fsdp", 64), ("fsdp+tp", 64)]
    assert plans.skipped == {"tp": "n_head=4 and d_model=32 must divide by 64 tensor-parallel ranks",
                             "pp": "n_layer=2 gives fewer blocks than 64 stages"}
    assert sum(r.parameter_bytes for r in fsdp.ranks) == 4 * ALL and dp.ranks[0].parameter_bytes == 4 * ALL
    assert fsdp.ranks[0].parameter_bytes > fsdp.ranks[-1].parameter_bytes  # D = 32 rows: the last ranks hold none
    assert fsdp.peak_bytes < dp.peak_bytes and dp.collective_bytes == {"all_reduce": 4 * ALL}
    # bandwidth only: a ring all-reduce sends 2 (N-1)/N of the buffer from each rank
    assert dp.comm_seconds == pytest.approx(2 * 63 / 64 * 4 * ALL / (100e9 / 8))
    # FSDP x TP: TP's all-reduces over rows of 2 ranks, FSDP's gathers and scatters over columns of 32
    c = both.collective_bytes
    assert both.wire_bytes == pytest.approx(c["all_reduce"] * 2 * 1 / 2 + (c["all_gather"] + c["reduce_scatter"]) * 31 / 32)
    assert "bandwidth only" in str(plans) and "tp left out" in str(plans)


def test_a_16_stage_pipeline_is_planned_from_three_replays():
    # First, one middle and last stage replayed, the other 13 middles read off the middle one. The
    # schedule runs as many micro-batches as stages, so a replay's cost grows with the stage count:
    # at 64 stages this test took 64 s on the 2-core CI machine, at 16 it asks the same of the planner.
    stages = 16
    cfg = RunConfig(model="gpt", dims={"n_layer": stages, "n_head": 4, "d_model": D}, seq_len=S, batch_size=stages,
                    device="cpu")
    pp, = plan_parallel(cfg, Cluster(gpus=stages, memory_gib=1, link_gbps=100), strategies=("pp",))
    assert len(pp.ranks) == stages
    block = 4 * (12 * D * D + 13 * D)
    first, middle, last = pp.ranks[0], pp.ranks[1:-1], pp.ranks[-1]
    assert first.parameter_bytes == 4 * (V * D + S * D) + block and last.parameter_bytes == block + 4 * (2 * D + V * D)
    assert {r.parameter_bytes for r in middle} == {block} and len({r.peak_bytes for r in middle}) == 1
    stream = stages * S * D * 4  # every micro-batch's stream forward, its gradient back
    assert [r.collective_bytes["send"] for r in (first, middle[0], last)] == [stream, 2 * stream, stream]


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Cluster(gpus=0, memory_gib=80, link_gbps=100), r"^gpus=0 must be a whole number from 1 to 4,096; pass e\.g\. Cluster\("),
    (lambda: Cluster(gpus=8, memory_gib=-1, link_gbps=100), r"^memory_gib=-1 must be a finite number of GiB above 0"),
    (lambda: plan_parallel(GPT, Cluster(gpus=2, memory_gib=1, link_gbps=1), strategies=("zero2",)), r"'zero2' is not known"),
    (lambda: plan_parallel(GPT, (2, 80, 100)), r"must be a Cluster"),
])
def test_bad_input_is_refused_in_one_line(make, message):
    with pytest.raises(ValueError, match=message):
        make()
