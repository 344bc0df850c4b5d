"""fp16 autocast + GradScaler: the baseline's matmuls in fp16, the loss scaled so small gradients survive.

The baseline plus the lines marked `# + fp16`. On a GPU with fp16 tensor cores (Volta and later) the
step gets faster and smaller; on most CPUs fp16 is emulated (correct, many times slower).

    python examples/fp16_grad_scaler.py
"""

import time

import parts
import torch

args = parts.arguments("Train the baseline GPT with fp16 autocast and a GradScaler.",
                      **{"--max-grad-norm": dict(type=parts.norm, default=None, metavar="NORM",
                                             help="clip the gradients' norm to NORM (default: no clipping)")})
device = parts.device()
train, _ = parts.text_windows(args.text, args.seq_len)
batches = parts.forever(parts.loader(train, args.batch_size, args.seed))
model = parts.gpt(args).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
scaler = torch.amp.GradScaler(device.type)  # + fp16: starts at a scale of 65536, halves it on an overflow
print(parts.trainable(model))

losses = []
start = time.perf_counter()
for step in range(1, args.steps + 1):
    inputs, labels = (t.to(device) for t in next(batches))
    with torch.autocast(device.type, dtype=torch.float16):  # + fp16: matmuls in fp16; softmax, norms fp32 on CUDA only
        logits = model(inputs)
    loss = parts.loss_fn(logits, labels)  # outside autocast: the loss in fp32
    scaler.scale(loss).backward()  # + fp16: loss x scale, so small gradients do not flush to zero
    if args.max_grad_norm:  # clipping reads the gradients' true size:
        scaler.unscale_(optimizer)  # + fp16: true gradients before clipping (step() then does not unscale again)
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
    scaler.step(optimizer)  # + fp16: unscales; skips the step if a gradient is inf/NaN
    scaler.update()  # + fp16: halve the scale after a skip, grow it after 2000 clean steps
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
    print(f"step {step:>3}  loss {losses[-1]:.4f}  scale {scaler.get_scale():g}")  # + fp16
elapsed = time.perf_counter() - start
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); {parts.peak_memory(device)}")
print("losses:", losses)
