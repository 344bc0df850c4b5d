"""bf16 autocast: the baseline's matmuls in bfloat16. fp32's exponent range, so no loss scaling.

The baseline plus the lines marked `# + bf16`. Fast where bf16 is native: Ampere and later GPUs,
CPUs with AVX512-BF16 or AMX; elsewhere it is emulated (correct, many times slower).

    python examples/bf16_autocast.py
"""

import time

import parts
import torch

args = parts.arguments("Train the baseline GPT with bf16 autocast.")
device = parts.device()
train, _ = parts.text_windows(args.text, args.seq_len)
batches = parts.forever(parts.loader(train, args.batch_size, args.seed))
model = parts.gpt(args).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
print(parts.trainable(model))

losses = []
start = time.perf_counter()
for step in range(1, args.steps + 1):
    inputs, labels = (t.to(device) for t in next(batches))
    with torch.autocast(device.type, dtype=torch.bfloat16):  # + bf16: matmuls in bf16; weights stay fp32
        logits = model(inputs)
    loss = parts.loss_fn(logits, labels)  # outside autocast: the loss in fp32
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
    print(f"step {step:>3}  loss {losses[-1]:.4f}")
elapsed = time.perf_counter() - start
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); {parts.peak_memory(device)}")
print("losses:", losses)
