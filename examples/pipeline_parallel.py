"""Pipeline parallelism (torch.distributed.pipelining, GPipe): the GPT split by depth, one stage a process.

The baseline plus the lines marked `# + pp`. Stage 0 holds the embeddings and the first blocks, the
last stage the last blocks, the final norm and the head; each batch goes through in --microbatches
pieces, so the stages work at once on different pieces. The head's weight is the token embedding's
(tied): the first and last stages each keep a copy and sum their gradients before each step. The
same step as one process's, to float summation order.

    python examples/pipeline_parallel.py --processes 2 --microbatches 4
"""

import os
import sys
import time

import parts
import torch
import torch.distributed as dist
from accelerate import Accelerator, notebook_launcher
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


class Stage(nn.Module):  # + pp
    """The part of the GPT one stage runs: the first takes token ids, the last returns logits."""

    def __init__(self, model, layers, first, last):
        super().__init__()
        self.first, self.last = first, last
        self.wte, self.wpe = (model.wte, model.wpe) if first else (None, None)
        self.blocks = nn.ModuleList(model.blocks[i] for i in layers)
        self.ln_f, self.lm_head = (model.ln_f, model.lm_head) if last else (None, None)
        if last and not first:  # the tied weight: a copy of its own (the gradients are summed below)
            self.lm_head.weight = nn.Parameter(model.wte.weight.detach().clone())

    def forward(self, x):
        if self.first:
            x = self.wte(x) + self.wpe.weight[: x.size(1)]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x


def train(args):
    accelerator = Accelerator(cpu=torch.cuda.device_count() < args.processes)  # the process group (gloo on CPUs)
    device, rank, stages = accelerator.device, accelerator.process_index, accelerator.num_processes
    train_set, _ = parts.text_windows(args.text, args.seq_len)
    batches = parts.forever(parts.loader(train_set, args.batch_size, args.seed))  # the same batches in every process
    model = parts.gpt(args)  # the same weights in every process; each keeps its stage
    sizes = [args.layers // stages + (i < args.layers % stages) for i in range(stages)]  # + pp: blocks a stage
    first_block = sum(sizes[:rank])
    part = Stage(model, range(first_block, first_block + sizes[rank]), first=rank == 0, last=rank == stages - 1).to(device)  # + pp
    stage = PipelineStage(part, rank, stages, device)  # + pp
    schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches, loss_fn=parts.loss_fn)  # + pp
    tied = dist.new_group([0, stages - 1])  # + pp: the two stages that hold the embedding's weight
    optimizer = torch.optim.AdamW(part.parameters(), lr=args.lr, weight_decay=0.0)  # this stage's parameters
    if rank == stages - 1:
        print(parts.trainable(part), f"in the last of {stages} stages", flush=True)

    losses = []
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        inputs, labels = (t.to(device) for t in next(batches))
        pieces = []  # the last stage's loss of each micro-batch
        if rank == 0:
            schedule.step(inputs)  # + pp: forward and backward of every micro-batch, through every stage
        elif rank == stages - 1:
            schedule.step(target=labels, losses=pieces)  # + pp
        else:
            schedule.step()  # + pp
        if rank in (0, stages - 1):  # + pp: the tied weight's two copies take the summed gradient
            dist.all_reduce((part.wte if rank == 0 else part.lm_head).weight.grad, group=tied)  # + pp
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == stages - 1:
            losses.append(torch.stack(pieces).mean().item())  # + pp: the batch's loss, from its micro-batches
            print(f"step {step:>3}  loss {losses[-1]:.4f}", flush=True)
    elapsed = time.perf_counter() - start
    if rank == stages - 1:
        print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); "
              f"the last stage's {parts.peak_memory(device)}", flush=True)
        print("losses:", losses, flush=True)


args = parts.arguments("Train the baseline GPT pipeline-parallel (GPipe) on several processes.",
                       **{"--processes": dict(type=int, default=2, choices=range(2, 65), metavar="N",
                                              help="stages, a process each (2 to 64, at most --layers)"),
                          "--microbatches": dict(type=int, default=4, choices=range(1, 1025), metavar="M",
                                                 help="pieces each batch goes through in (1 to 1024)")})
if args.processes > args.layers:  # + pp
    sys.exit(f"--processes {args.processes} must be at most --layers {args.layers}: each stage runs a block or more")
if args.batch_size % args.microbatches:  # + pp
    sys.exit(f"--microbatches {args.microbatches} must divide --batch-size {args.batch_size}")
# Each process its share of the cores (unset, accelerate sets physical cores / processes, at least 1,
# in each CPU process, and warns).
os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.processes)))
notebook_launcher(train, args=(args,), num_processes=args.processes, use_port=parts.free_port())
