"""Gradient accumulation with accelerate: `accelerator.accumulate(model)` does the bookkeeping.

The baseline plus the lines marked `# + accumulate`. Inside `accumulate()`, `accelerator.backward`
divides the loss by gradient_accumulation_steps, and the prepared optimizer's step() and
zero_grad() act only on the last micro-batch of each window (under DDP the gradients are only
all-reduced then, too).

    python examples/accelerate_accumulate.py --batch-size 8 --accumulate 4
"""

import sys
import time

import parts
import torch
from accelerate import Accelerator

args = parts.arguments("Train the baseline GPT, accumulating gradients with accelerate.",
                       **{"--accumulate": dict(type=int, default=4, help="micro-batches a step")})
if args.accumulate < 1 or args.batch_size % args.accumulate:
    sys.exit(f"--accumulate {args.accumulate} must be at least 1 and divide --batch-size {args.batch_size}")
accelerator = Accelerator(gradient_accumulation_steps=args.accumulate)  # + accumulate
device = accelerator.device
train, _ = parts.text_windows(args.text, args.seq_len)
batches = parts.forever(parts.loader(train, args.batch_size // args.accumulate, args.seed))  # + accumulate: micro-batches
model = parts.gpt(args)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
model, optimizer = accelerator.prepare(model, optimizer)  # + accumulate
print(parts.trainable(model))

losses = []
start = time.perf_counter()
for step in range(1, args.steps + 1):
    step_loss = 0.0
    for _ in range(args.accumulate):
        inputs, labels = (t.to(device) for t in next(batches))
        with accelerator.accumulate(model):  # + accumulate
            loss = parts.loss_fn(model(inputs), labels)
            accelerator.backward(loss)  # + accumulate: divides by the micro-batches a step
            optimizer.step()  # + accumulate: does nothing but on a step's last micro-batch
            optimizer.zero_grad(set_to_none=True)
        step_loss += loss.item() / args.accumulate
    losses.append(step_loss)
    print(f"step {step:>3}  loss {losses[-1]:.4f}")
elapsed = time.perf_counter() - start
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); {parts.peak_memory(device)}")
print("losses:", losses)
