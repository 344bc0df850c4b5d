"""Data parallel (DDP) with accelerate's notebook_launcher: 2 processes, each its own batches, one model.

The baseline plus the lines marked `# + ddp`. Each process trains a copy of the model on every
other batch; backward averages the gradients across processes (an all-reduce), so every copy takes
the same step: --processes x --batch-size samples a step. On CPUs the processes talk over gloo, on
GPUs over NCCL, one GPU each. notebook_launcher also works from a notebook (the function is forked).

    python examples/ddp_notebook_launcher.py --processes 2
"""

import os
import time

import parts
import torch
from accelerate import Accelerator, notebook_launcher


def train(args):  # + ddp: what each process runs
    # cpu=True with fewer GPUs than processes: a plain Accelerator() that finds no GPU of its own quietly
    # makes a world of one in each process (independent trainings, nothing shared, no error).
    accelerator = Accelerator(cpu=torch.cuda.device_count() < args.processes)  # + ddp: joins the process group the launcher formed
    device = accelerator.device
    train_set, _ = parts.text_windows(args.text, args.seq_len)
    loader = parts.loader(train_set, args.batch_size, args.seed)
    model = parts.gpt(args)  # the same seed in every process: the same weights
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # + ddp: DDP, and every other batch
    batches = parts.forever(loader)
    if accelerator.is_main_process:
        print(parts.trainable(model), f"in each of {accelerator.num_processes} processes", flush=True)

    losses = []
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        inputs, labels = next(batches)
        loss = parts.loss_fn(model(inputs), labels)
        accelerator.backward(loss)  # + ddp: the gradients are averaged across processes here
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(accelerator.gather(loss.detach()).mean().item())  # + ddp: the loss of all processes' batches
        if accelerator.is_main_process:
            print(f"step {step:>3}  loss {losses[-1]:.4f}", flush=True)
    elapsed = time.perf_counter() - start
    if accelerator.is_main_process:
        print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); "
              f"rank 0's {parts.peak_memory(device)}", flush=True)
        print("losses:", losses, flush=True)


args = parts.arguments("Train the baseline GPT data-parallel on several processes (accelerate).",
                       **{"--processes": dict(type=int, default=2, choices=range(1, 65), metavar="N",
                                              help="processes (1 to 64; a GPU each where there are GPUs)")})
# Each process its share of the cores (unset, accelerate sets physical cores / processes, at least 1,
# in each CPU process, and warns).
os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.processes)))
notebook_launcher(train, args=(args,), num_processes=args.processes, use_port=parts.free_port())  # + ddp
