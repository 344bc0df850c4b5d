"""Fused and foreach AdamW: the same update, run as one kernel (fused) or one op over all tensors (foreach).

The baseline plus the lines marked `# + fused`. torch runs AdamW parameter by parameter on a CPU
(for-loop) and foreach on a GPU unless told; fused is fastest where it exists (CUDA, and CPUs in
recent torch). The weights after each step are the same to float rounding.

    python examples/fused_adamw.py --impl fused
"""

import time

import parts
import torch

IMPLEMENTATIONS = {"for-loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}  # + fused
args = parts.arguments("Train the baseline GPT with a fused (or foreach) AdamW.",
                       **{"--impl": dict(choices=IMPLEMENTATIONS, default="fused", help="how AdamW runs its update")})
device = parts.device()
train, _ = parts.text_windows(args.text, args.seq_len)
batches = parts.forever(parts.loader(train, args.batch_size, args.seed))
model = parts.gpt(args).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0,
                              **IMPLEMENTATIONS[args.impl])  # + fused: fused=True, or foreach=True
print(parts.trainable(model))

losses, stepping = [], 0.0
start = time.perf_counter()
for step in range(1, args.steps + 1):
    inputs, labels = (t.to(device) for t in next(batches))
    loss = parts.loss_fn(model(inputs), labels)
    loss.backward()
    update = time.perf_counter()
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()  # + fused: a GPU runs asynchronously; wait, to time the update alone
    stepping += time.perf_counter() - update  # + fused: the optimizer's share of the step
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
    print(f"step {step:>3}  loss {losses[-1]:.4f}")
elapsed = time.perf_counter() - start
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step, {args.impl} AdamW "
      f"{stepping / args.steps * 1e3:.2f} ms of it); {parts.peak_memory(device)}")
print("losses:", losses)
