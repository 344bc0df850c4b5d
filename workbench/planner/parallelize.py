"""Past one device: the built-in GPT split across processes, by tensor or by pipeline.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) splits every block's matrices: the
first linear of the attention (the fused q, k, v) and of the MLP by output columns, the
second of each by input rows, so a process holds 1/N of each block's weights and heads and
the block's output needs one all-reduce of b x s x h in forward per half-block (and one of
the input's gradient in backward). `tensor_parallel(model, mesh)` is that plan in
PyTorch's own API (`torch.distributed.tensor.parallel.parallelize_module`);
`sequence_parallel=True` also splits the LayerNorms along the sequence (Korthikanti et al.
2022): each all-reduce becomes an all-gather before the half-block and a reduce-scatter
after it, the same bytes, and the norms' activations are 1/N per process.

Pipeline parallelism splits the model by depth: `pipeline_stages(model, n_stages, rank)`
is the part stage `rank` runs (the embeddings and the first blocks, the middle blocks, or
the last blocks, the final norm and the head), for `torch.distributed.pipelining`'s
`PipelineStage` and its schedules (GPipe, 1F1B). The head's weight is the token
embedding's (tied): the first and last stages each hold a copy, and `sync_tied_grads`
sums their gradients after backward, so both copies take the same step as one process's.

Both are exact rewrites of one process's step: the same losses up to float summation order.

Example (inside each launched process, after `torch.distributed` is initialised):
    >>> mesh = init_device_mesh("cpu", (world,))            # doctest: +SKIP
    >>> model = tensor_parallel(model, mesh)                  # doctest: +SKIP
    >>> stage = pipeline_stages(model, n_stages=world, rank=rank)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from workbench.core.models import GPT

__all__ = ["tensor_parallel", "tensor_parallel_plan", "group_qkv_by_process", "pipeline_stages", "stage_layers", "sync_tied_grads",
           "PipelineStageModule"]


def _check_gpt(model: Any, what: str) -> None:
    if not isinstance(model, GPT):
        raise TypeError(f"{what} splits the built-in GPT (workbench.core.models.GPT), got {type(model).__name__}; "
                        "build it with build_model('gpt', ...) or wb.training_parts(RunConfig(model='gpt'))")


def _check_divides(model: GPT, parts: int) -> None:
    attn = model.blocks[0].attn
    d_model = attn.c_proj.in_features
    if attn.n_head % parts:
        raise ValueError(f"n_head={attn.n_head} is not divisible by the {parts} tensor-parallel processes: "
                         f"each process holds whole heads; pick n_head a multiple of {parts}")
    if d_model % parts:
        raise ValueError(f"d_model={d_model} is not divisible by the {parts} tensor-parallel processes; "
                         f"pick d_model a multiple of {parts}")


@torch.no_grad()
def group_qkv_by_process(linear: nn.Linear, parts: int) -> None:
    """Reorder the fused q, k, v output rows as [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]: a column-wise
    split then gives process r the q, k and v of its own heads (Megatron's layout). Unchanged
    maths: the attention reads q, k, v off its (local) c_attn output in that order."""
    width = linear.out_features // 3
    order = torch.arange(3 * width).view(3, parts, width // parts).transpose(0, 1).reshape(-1)
    linear.weight.copy_(linear.weight[order])
    if linear.bias is not None:
        linear.bias.copy_(linear.bias[order])


def tensor_parallel_plan(sequence_parallel: bool = False) -> dict[str, Any]:
    """The parallelize_module plan of one block (keys relative to the block):
    q/k/v and the MLP's up projection column-wise, the attention's output and the MLP's down
    projection row-wise; with `sequence_parallel`, the norms split along the sequence and
    the block's input and output sequence-sharded."""
    # lazy: `import torch` does not load DTensor (with FSDP, half a second)
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if not sequence_parallel:
        return {"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
                "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()}
    # The gathered input stays a DTensor into the column-wise linear: its gradient then goes back as a
    # reduce-scatter to the sequence shards. (use_local_output=True here: an all-reduce instead, twice the wire.)
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {"ln_1": SequenceParallel(), "attn": gather,
            "attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(output_layouts=Shard(1)),
            "ln_2": SequenceParallel(), "mlp": gather,
            "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel(output_layouts=Shard(1))}


def tensor_parallel(model: GPT, mesh: Any, sequence_parallel: bool = False) -> GPT:
    """Split `model`'s blocks across the processes of the 1-D `mesh` (in place; returns it).

    Every process must call it with the same model (same seed): each keeps its 1/N of the
    block matrices as DTensor shards. The embeddings, the final norm and the tied head stay
    whole in every process (replicated). With `sequence_parallel` the residual stream
    between the first block and the final norm is split along the sequence (dim 1)."""
    # lazy: `import torch` does not load DTensor (with FSDP, half a second)
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, parallelize_module

    _check_gpt(model, "tensor_parallel")
    if getattr(model, "tensor_parallel_size", 1) != 1:
        raise ValueError("this model is already split by tensor_parallel; build a fresh one")
    if mesh.ndim != 1:
        raise ValueError(f"mesh has {mesh.ndim} dimensions; pass a 1-D mesh of the tensor-parallel processes "
                         "(init_device_mesh('cpu', (N,)), or mesh['tp'] of a larger one)")
    parts = mesh.size()
    _check_divides(model, parts)
    if sequence_parallel and model.seq_len % parts:
        raise ValueError(f"seq_len={model.seq_len} is not divisible by the {parts} processes; "
                         "sequence parallelism splits the sequence evenly")
    plan = tensor_parallel_plan(sequence_parallel)
    for block in model.blocks:
        group_qkv_by_process(block.attn.c_attn, parts)
        parallelize_module(block, mesh, plan)
        block.attn.n_head //= parts  # heads this process holds
    if sequence_parallel:  # split the stream before the first block, gather it before the final norm
        parallelize_module(model, mesh, {
            "blocks.0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                           use_local_output=True),
            "ln_f": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                       use_local_output=True)})
    if sequence_parallel:
        _reduce_norm_grads_once(model)
    model.tensor_parallel_size = parts
    return model


def _reduce_norm_grads_once(model: GPT) -> None:
    """A sequence-parallel norm's weight gradient is a partial sum (each process saw its part of
    the sequence): sum it across the processes once, as soon as backward has made it (Megatron's
    all-reduce of the sequence-parallel gradients). Left partial, the optimizer's DTensor ops
    would all-reduce it again in each op that reads it (measured: 3 times a step in AdamW)."""
    # lazy: `import torch` does not load DTensor (with FSDP, half a second)
    from torch.distributed.tensor import Replicate

    def reduce(p: nn.Parameter) -> None:
        if p.grad is not None and any(x.is_partial() for x in p.grad.placements):
            p.grad = p.grad.redistribute(placements=[Replicate()])

    for block in model.blocks:
        for norm in (block.ln_1, block.ln_2):
            for p in norm.parameters():
                p.register_post_accumulate_grad_hook(reduce)


def stage_layers(n_layer: int, n_stages: int) -> list[range]:
    """The blocks each stage runs: as even as can be, the first stages one more when uneven."""
    if not isinstance(n_stages, int) or not 1 <= n_stages <= n_layer:
        raise ValueError(f"n_stages={n_stages!r} must be a whole number from 1 to n_layer={n_layer}: "
                         "each stage runs at least one block")
    sizes = [n_layer // n_stages + (i < n_layer % n_stages) for i in range(n_stages)]
    starts = [sum(sizes[:i]) for i in range(n_stages)]
    return [range(start, start + size) for start, size in zip(starts, sizes)]


class PipelineStageModule(nn.Module):
    """One stage of a GPT: the first takes token ids (B, T), the others the stream (B, T, h);
    the last returns logits (B, T, vocab), the others the stream. Shares the GPT's modules."""

    def __init__(self, model: GPT, layers: range, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.wte = model.wte if first else None
        self.wpe = model.wpe if first else None
        self.blocks = nn.ModuleList(model.blocks[i] for i in layers)
        self.ln_f = model.ln_f if last else None
        self.lm_head = model.lm_head if last else None
        if last and not first:  # the tied weight: this stage's own copy (sync_tied_grads keeps them equal)
            self.lm_head.weight = nn.Parameter(model.wte.weight.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.wte(x) + self.wpe.weight[: x.size(1)]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x


def pipeline_stages(model: GPT, n_stages: int, rank: int) -> PipelineStageModule:
    """The part of `model` that pipeline stage `rank` (0 .. n_stages-1) runs, for
    `torch.distributed.pipelining.PipelineStage(module, rank, n_stages, device)`."""
    _check_gpt(model, "pipeline_stages")
    if model.dropout > 0:
        raise ValueError(f"dropout={model.dropout}: a stage's micro-batches would draw other random masks "
                         "than one process; build the GPT with dropout=0 for a pipeline")
    layers = stage_layers(len(model.blocks), n_stages)
    if not isinstance(rank, int) or not 0 <= rank < n_stages:
        raise ValueError(f"rank={rank!r} must be a stage index from 0 to {n_stages - 1}")
    return PipelineStageModule(model, layers[rank], first=rank == 0, last=rank == n_stages - 1)


_TIED_GROUPS: dict[tuple[int, int], Any] = {}


def sync_tied_grads(stage: PipelineStageModule, n_stages: int) -> None:
    """Sum the tied embedding/head weight's gradient over the first and last stages (Megatron's
    embedding all-reduce). Every process calls it after backward, in the same order."""
    if n_stages == 1:
        return
    key = (0, n_stages - 1)
    if key not in _TIED_GROUPS:  # new_group: every process of the world takes part in creating it
        _TIED_GROUPS[key] = dist.new_group(list(key))
    weight = stage.wte.weight if stage.first else stage.lm_head.weight if stage.last else None
    if weight is not None and weight.grad is not None:
        dist.all_reduce(weight.grad, group=_TIED_GROUPS[key])
