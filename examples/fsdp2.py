"""Fully sharded data parallel (FSDP2, `fully_shard`): each of 2 processes holds half the model state.

The baseline plus the lines marked `# + fsdp`. As with DDP each process trains on its own batches;
but each keeps only 1/N of every parameter, gradient and optimizer state. A block's parameters are
all-gathered just before its forward (and again for backward) and freed after; gradients are
reduce-scattered, so each process updates its own shard. The launcher (accelerate's, forking the
function) forms the process group: gloo on CPUs, NCCL on GPUs.

    python examples/fsdp2.py --processes 2
"""

import os
import time

import parts
import torch
import torch.distributed as dist
from accelerate import Accelerator, notebook_launcher
from torch.distributed.fsdp import fully_shard


def train(args):
    # cpu=True with fewer GPUs than processes: a plain Accelerator() that finds no GPU of its own quietly
    # makes a world of one in each process (independent trainings, nothing shared, no error).
    accelerator = Accelerator(cpu=torch.cuda.device_count() < args.processes)  # the process group, the device, and every other batch for this process
    device = accelerator.device
    train_set, _ = parts.text_windows(args.text, args.seq_len)
    batches = parts.forever(accelerator.prepare(parts.loader(train_set, args.batch_size, args.seed)))
    model = parts.gpt(args).to(device)
    for block in model.blocks:  # + fsdp: one shard group a block: one all-gather each
        fully_shard(block)  # + fsdp
    fully_shard(model)  # + fsdp: the rest (embeddings, final LayerNorm) in one more group
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)  # + fsdp: after sharding: the shards
    held = sum(p.to_local().numel() for p in model.parameters())  # + fsdp: what this process holds
    if accelerator.is_main_process:
        print(parts.trainable(model), f"of which rank 0 holds {held:,}", flush=True)

    losses = []
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        inputs, labels = next(batches)
        loss = parts.loss_fn(model(inputs), labels)
        loss.backward()  # + fsdp: gradients reduce-scattered (averaged) into each process's shard
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        everyone = loss.detach().clone()
        dist.all_reduce(everyone)  # the loss of all processes' batches
        losses.append(everyone.item() / dist.get_world_size())
        if accelerator.is_main_process:
            print(f"step {step:>3}  loss {losses[-1]:.4f}", flush=True)
    elapsed = time.perf_counter() - start
    if accelerator.is_main_process:
        print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); "
              f"rank 0's {parts.peak_memory(device)}", flush=True)
        print("losses:", losses, flush=True)


args = parts.arguments("Train the baseline GPT fully sharded (FSDP2) on several processes.",
                       **{"--processes": dict(type=int, default=2, choices=range(2, 65), metavar="N",
                                              help="processes (2 to 64; a GPU each where there are GPUs)")})
# Each process its share of the cores (unset, accelerate sets physical cores / processes, at least 1,
# in each CPU process, and warns).
os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.processes)))
notebook_launcher(train, args=(args,), num_processes=args.processes, use_port=parts.free_port())  # + fsdp
