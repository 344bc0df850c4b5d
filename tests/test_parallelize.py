"""planner.parallelize: the GPT split by tensor (Megatron, sequence parallel) and by pipeline
stage, on 2 CPU processes over gloo: the same losses as one process, each process's exact share
of the parameters."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from workbench.core.models import GPT
from workbench.launching.launch import launch_function
from workbench.planner.parallelize import pipeline_stages, stage_layers, tensor_parallel

V, S, L, A, H, B = 50, 8, 2, 4, 32, 4  # vocab, sequence, layers, heads, width, batch


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=V, seq_len=S, n_layer=L, n_head=A, d_model=H)


def _batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, V, (B, S + 1), generator=g) for _ in range(3)]


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _train(model: torch.nn.Module) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for batch in _batches():
        loss = _loss(model(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _local_bytes(model: torch.nn.Module) -> int:
    return sum((p.to_local() if hasattr(p, "to_local") else p).nbytes for p in model.parameters())


def _tensor_parallel_child(sequence_parallel: bool) -> tuple[list[float], int]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    model = tensor_parallel(_gpt(), init_device_mesh("cpu", (dist.get_world_size(),)), sequence_parallel)
    return _train(model), _local_bytes(model)


def _pipeline_child(schedule: str, microbatches: int) -> tuple[list[float], int]:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from workbench.planner.parallelize import sync_tied_grads

    rank, world = dist.get_rank(), dist.get_world_size()
    part = pipeline_stages(_gpt(), world, rank)
    stage = PipelineStage(part, rank, world, torch.device("cpu"))
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    steps = kind(stage, n_microbatches=microbatches, loss_fn=_loss)
    optimizer = torch.optim.AdamW(part.parameters(), lr=1e-2)
    losses = []
    for batch in _batches():
        if rank == 0:
            steps.step(batch[:, :-1])
        else:  # the last of 2 stages: the targets, and the micro-batches' losses
            micro: list[torch.Tensor] = []
            steps.step(target=batch[:, 1:], losses=micro)
            losses.append(torch.stack(micro).mean().item())
        sync_tied_grads(part, world)
        optimizer.step()
        optimizer.zero_grad()
    return losses, _local_bytes(part)


def _block_bytes(parts: int) -> int:
    """One block's parameters held by one of `parts` tensor-parallel processes, by hand (fp32):
    c_attn 3h x h + 3h and mlp.0 4h x h + 4h split by columns; c_proj h x h and mlp.2 h x 4h
    split by rows, their biases whole; two LayerNorms (2h each) whole."""
    return 4 * ((3 * H * H + 3 * H + H * H + 4 * H * H + 4 * H + 4 * H * H) // parts + H + H + 4 * H)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tensor_parallel_trains_like_one_process_and_holds_its_share(sequence_parallel):
    alone = _train(_gpt())
    results = launch_function(_tensor_parallel_child, sequence_parallel, num_processes=2, device="cpu", timeout_s=120)
    rest = 4 * (V * H + S * H + 2 * H)  # embeddings (the head's weight is the token embedding's), final norm
    assert _block_bytes(1) * L + rest == _local_bytes(_gpt())  # the by-hand count holds for one process
    for losses, held in results:
        assert losses == pytest.approx(alone, abs=1e-5)  # float summation order only
        assert held == _block_bytes(2) * L + rest


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_stages_train_like_one_process_and_hold_their_blocks(schedule):
    alone = _train(_gpt())
    (_, first), (losses, last) = launch_function(_pipeline_child, schedule, 2, num_processes=2, device="cpu",
                                                 timeout_s=120)
    assert losses == pytest.approx(alone, abs=1e-5)
    block = _block_bytes(1)
    assert first == 4 * (V * H + S * H) + block * (L // 2)  # embeddings, first blocks
    assert last == block * (L // 2) + 4 * (2 * H + V * H)  # last blocks, final norm, its copy of the tied head


def test_stage_layers_split_the_blocks_evenly_first_stages_longer():
    assert stage_layers(5, 2) == [range(0, 3), range(3, 5)]
    assert stage_layers(4, 4) == [range(i, i + 1) for i in range(4)]
    with pytest.raises(ValueError, match="n_stages=3 must be a whole number from 1 to n_layer=2"):
        stage_layers(2, 3)


def test_refusals_name_the_field_and_the_fix():
    class Mesh:
        ndim = 1

        def size(self) -> int:
            return 3

    with pytest.raises(ValueError, match="n_head=4 is not divisible by the 3 tensor-parallel processes"):
        tensor_parallel(_gpt(), Mesh())
    with pytest.raises(TypeError, match="splits the built-in GPT"):
        pipeline_stages(torch.nn.Linear(2, 2), 2, 0)
    with pytest.raises(ValueError, match="rank=2 must be a stage index from 0 to 1"):
        pipeline_stages(_gpt(), 2, 2)


@pytest.mark.parametrize("kind", ["tensor", "sequence", "gpipe", "1f1b"])
def test_each_process_holds_saves_and_sends_exactly_the_formulas_bytes(kind):
    """Notebook 10's measurements (lessons.parallelism): on 2 processes, every process's weights,
    saved activations and collective/send bytes equal the formulas, and its losses one process's."""
    import workbench as wb
    from workbench.lessons import parallelism as lesson

    config = wb.RunConfig(model="gpt", preset="cpu-quick", device="cpu", steps=2, log_every=1, eval_samples=0)
    reports = launch_function(lesson.train_split, config, kind, num_processes=2, device="cpu", timeout_s=120)
    lesson.check_formulas(reports)
    lesson.agree(reports, reports, wb.run(config, sinks=[]))
    if kind in ("gpipe", "1f1b"):  # the bubble of 2 stages and 4 micro-batches, from the order they ran in
        assert lesson.bubble(reports) == pytest.approx(lesson.bubble_formula(2, 4)) == pytest.approx(1 / 5)


def test_the_bubble_is_read_off_the_order_of_actions():
    from workbench.lessons.parallelism import RankReport, bubble

    def stage(rank, order):
        return RankReport(rank, 2, "gpipe", {}, 0, 0, 0, {}, {}, actions=[(k, mb, 0.0, 0.0) for k, mb in order])

    gpipe = [stage(0, [("F", 0), ("F", 1), ("B", 0), ("B", 1)]), stage(1, [("F", 0), ("F", 1), ("B", 0), ("B", 1)])]
    assert bubble(gpipe, forward=1, backward=2) == pytest.approx(1 / 3)  # (p-1)/(m+p-1), p=m=2
    one_at_a_time = [stage(0, [("F", 0), ("B", 0), ("F", 1), ("B", 1)]), stage(1, [("F", 0), ("B", 0), ("F", 1), ("B", 1)])]
    assert bubble(one_at_a_time, forward=1, backward=2) == pytest.approx(1 / 2)  # no overlap at all: half idle


def test_a_launch_that_hangs_is_stopped_at_its_timeout_not_started_again(capsys):
    import time

    from workbench.launching.launch import LaunchError
    from workbench.lessons.parallelism import launch

    with pytest.raises(LaunchError, match=r"^timed out after 3 s \(timeout_s\); the children were stopped$"):
        launch(time.sleep, 600, num_processes=2, timeout_s=3)
    assert "again" not in capsys.readouterr().out  # one launch, stopped: no second try
