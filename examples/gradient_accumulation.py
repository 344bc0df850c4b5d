"""Gradient accumulation by hand: --batch-size samples a step, in --accumulate micro-batches.

The baseline plus the lines marked `# + accumulate`. Each micro-batch's gradients add up in
`.grad`; dividing each loss by the number of micro-batches makes the sum the mean over the whole
batch, so the step is the baseline's (to float rounding) with the activations of one micro-batch.

    python examples/gradient_accumulation.py --batch-size 8 --accumulate 4
"""

import sys
import time

import parts
import torch

args = parts.arguments("Train the baseline GPT, accumulating gradients by hand.",
                       **{"--accumulate": dict(type=int, default=4, help="micro-batches a step")})
if args.accumulate < 1 or args.batch_size % args.accumulate:  # + accumulate
    sys.exit(f"--accumulate {args.accumulate} must be at least 1 and divide --batch-size {args.batch_size}")
micro_batch = args.batch_size // args.accumulate  # + accumulate
device = parts.device()
train, _ = parts.text_windows(args.text, args.seq_len)
batches = parts.forever(parts.loader(train, micro_batch, args.seed))  # + accumulate: micro-batches
model = parts.gpt(args).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
print(parts.trainable(model))

losses = []
start = time.perf_counter()
for step in range(1, args.steps + 1):
    step_loss = 0.0
    for _ in range(args.accumulate):  # + accumulate
        inputs, labels = (t.to(device) for t in next(batches))
        loss = parts.loss_fn(model(inputs), labels)
        (loss / args.accumulate).backward()  # + accumulate: adds to .grad; the sum is the mean
        step_loss += loss.item() / args.accumulate  # + accumulate
    optimizer.step()  # once per step, after the last micro-batch
    optimizer.zero_grad(set_to_none=True)
    losses.append(step_loss)
    print(f"step {step:>3}  loss {losses[-1]:.4f}")
elapsed = time.perf_counter() - start
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); {parts.peak_memory(device)}")
print("losses:", losses)
