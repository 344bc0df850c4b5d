"""Tensor parallelism (Megatron-style, torch.distributed.tensor): every block's matrices split across processes.

The baseline plus the lines marked `# + tp`. Each process holds 1/N of every block's weights and
heads: q, k, v and the MLP's first Linear split by output columns, the attention's output and the
MLP's second Linear by input rows; one all-reduce after each half-block makes the output whole
again. Every process sees the same batch (it splits the model, not the data); the embeddings, norms
and head stay whole in each. The same step as one process's, to float summation order.

    python examples/tensor_parallel.py --processes 2
"""

import os
import sys
import time

import parts
import torch
from accelerate import Accelerator, notebook_launcher
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


@torch.no_grad()
def heads_side_by_side(c_attn, processes):  # + tp
    """Reorder c_attn's output rows from [q | k | v] to [q_0 k_0 v_0 | q_1 k_1 v_1 | ...], so that a
    split by columns gives each process the q, k and v of its own heads."""
    width = c_attn.out_features // 3
    order = torch.arange(3 * width).view(3, processes, width // processes).transpose(0, 1).reshape(-1)
    c_attn.weight.copy_(c_attn.weight[order])
    c_attn.bias.copy_(c_attn.bias[order])


def train(args):
    accelerator = Accelerator(cpu=torch.cuda.device_count() < args.processes)  # the process group (gloo on CPUs)
    device, processes = accelerator.device, accelerator.num_processes
    train_set, _ = parts.text_windows(args.text, args.seq_len)
    batches = parts.forever(parts.loader(train_set, args.batch_size, args.seed))  # the same batches in every process
    model = parts.gpt(args).to(device)  # the same weights in every process (the same seed)
    mesh = init_device_mesh(device.type, (processes,))  # + tp
    for block in model.blocks:
        heads_side_by_side(block.attn.c_attn, processes)  # + tp
        parallelize_module(block, mesh, {"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),  # + tp
                                         "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()})  # + tp
        block.attn.n_head //= processes  # + tp: the heads this process holds
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)  # after the split: the shards
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())  # + tp
    if accelerator.is_main_process:
        print(parts.trainable(model), f"of which rank 0 holds {held:,}", flush=True)

    losses = []
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        inputs, labels = (t.to(device) for t in next(batches))
        loss = parts.loss_fn(model(inputs), labels)  # the same loss in every process
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if accelerator.is_main_process:
            print(f"step {step:>3}  loss {losses[-1]:.4f}", flush=True)
    elapsed = time.perf_counter() - start
    if accelerator.is_main_process:
        print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); "
              f"rank 0's {parts.peak_memory(device)}", flush=True)
        print("losses:", losses, flush=True)


args = parts.arguments("Train the baseline GPT tensor-parallel on several processes.",
                       **{"--processes": dict(type=int, default=2, choices=range(2, 65), metavar="N",
                                              help="processes (2 to 64; a GPU each where there are GPUs)")})
if args.heads % args.processes:  # + tp: each process holds whole heads
    sys.exit(f"--heads {args.heads} must be a multiple of --processes {args.processes}: each process holds whole heads")
# Each process its share of the cores (unset, accelerate sets physical cores / processes, at least 1,
# in each CPU process, and warns).
os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.processes)))
notebook_launcher(train, args=(args,), num_processes=args.processes, use_port=parts.free_port())
