"""torch.compile: the baseline's model compiled (inductor) into fused kernels; the first step pays the compile.

The baseline plus the lines marked `# + compile`. The same math; fused kernels round in another
order, so the losses agree with the baseline's to float rounding. On a CPU inductor writes C++ and
needs a compiler (g++ or $CXX); on a GPU it writes Triton.

    python examples/torch_compile.py
"""

import time

import parts
import torch

args = parts.arguments("Train the baseline GPT compiled with torch.compile.")
device = parts.device()
train, _ = parts.text_windows(args.text, args.seq_len)
batches = parts.forever(parts.loader(train, args.batch_size, args.seed))
model = parts.gpt(args).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)  # over the plain module's parameters
compiled = torch.compile(model)  # + compile: nothing happens yet; the first call compiles
print(parts.trainable(model))

losses = []
start = time.perf_counter()
for step in range(1, args.steps + 1):
    inputs, labels = (t.to(device) for t in next(batches))
    loss = parts.loss_fn(compiled(inputs), labels)  # + compile
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
    if step == 1:
        first_step = time.perf_counter() - start  # + compile: the compile's cost, once
    print(f"step {step:>3}  loss {losses[-1]:.4f}")
elapsed = time.perf_counter() - start
rest = f", then {(elapsed - first_step) / (args.steps - 1) * 1e3:.1f} ms a step" if args.steps > 1 else ""
print(f"{args.steps} steps in {elapsed:.2f} s (the first {first_step:.1f} s: the compile{rest}); {parts.peak_memory(device)}")
print("losses:", losses)
