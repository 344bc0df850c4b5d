"""accelerate's mixed_precision: the same bf16 autocast, set up by an Accelerator instead of by hand.

The baseline plus the lines marked `# + accelerate`. `prepare()` wraps the model's forward in
autocast; with mixed_precision="fp16" on a GPU it also makes the GradScaler and
`accelerator.backward` scales the loss (on a CPU accelerate 1.x leaves fp16 off: it trains in fp32).

    python examples/accelerate_mixed_precision.py
"""

import time

import parts
import torch
from accelerate import Accelerator

args = parts.arguments("Train the baseline GPT in bf16 through accelerate.",
                      **{"--max-grad-norm": dict(type=parts.norm, default=None, metavar="NORM",
                                             help="clip the gradients' norm to NORM (default: no clipping)")})
accelerator = Accelerator(mixed_precision="bf16")  # + accelerate: picks the device (a GPU when there is one)
device = accelerator.device  # + accelerate
train, _ = parts.text_windows(args.text, args.seq_len)
batches = parts.forever(parts.loader(train, args.batch_size, args.seed))
model = parts.gpt(args)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
model, optimizer = accelerator.prepare(model, optimizer)  # + accelerate: moves the model, wraps forward in autocast
print(parts.trainable(model))

losses = []
start = time.perf_counter()
for step in range(1, args.steps + 1):
    inputs, labels = (t.to(device) for t in next(batches))
    loss = parts.loss_fn(model(inputs), labels)  # the forward runs in bf16, its logits come back fp32
    accelerator.backward(loss)  # + accelerate: (fp16: scales the loss first)
    if args.max_grad_norm:
        accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)  # + accelerate: (fp16: unscales first)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
    print(f"step {step:>3}  loss {losses[-1]:.4f}")
elapsed = time.perf_counter() - start
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); {parts.peak_memory(device)}")
print("losses:", losses)
