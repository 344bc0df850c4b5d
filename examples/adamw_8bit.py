"""8-bit AdamW (torchao): AdamW's two running averages kept in 8 bits, a quarter of the bytes.

The baseline plus the lines marked `# + 8-bit`. Each average is stored as uint8 codes with an fp32
scale per block of 256 values; a tensor under 4,096 values, or not a multiple of 256, keeps fp32
state. The optimizer's state bytes are printed at the end.

    python examples/adamw_8bit.py
"""

import contextlib
import time

import parts
import torch
from torchao.optim import AdamW8bit


def held_bytes(t: torch.Tensor) -> int:  # + 8-bit
    """What a state tensor holds: torchao's 8-bit state says float32 but holds uint8 codes and an
    fp32 scale per block of 256 and a 256-entry fp32 code table."""
    if not hasattr(t, "__tensor_flatten__"):  # a plain tensor
        return t.numel() * t.element_size()
    names, _ = t.__tensor_flatten__()
    return sum(held_bytes(getattr(t, name)) for name in names)


args = parts.arguments("Train the baseline GPT with torchao's 8-bit AdamW.")
device = parts.device()
train, _ = parts.text_windows(args.text, args.seq_len)
batches = parts.forever(parts.loader(train, args.batch_size, args.seed))
model = parts.gpt(args).to(device)
optimizer = AdamW8bit(model.parameters(), lr=args.lr, weight_decay=0.0)  # + 8-bit
# torchao compiles its update per tensor shape: worth it on a GPU; on a CPU the first compile
# takes tens of seconds, so there the update runs eagerly (the same state, the same math).
eager = torch.compiler.set_stance("force_eager") if device.type == "cpu" else contextlib.nullcontext()  # + 8-bit
print(parts.trainable(model))

losses = []
start = time.perf_counter()
for step in range(1, args.steps + 1):
    inputs, labels = (t.to(device) for t in next(batches))
    loss = parts.loss_fn(model(inputs), labels)
    loss.backward()
    with eager:  # + 8-bit
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
    print(f"step {step:>3}  loss {losses[-1]:.4f}")
elapsed = time.perf_counter() - start
state_bytes = sum(held_bytes(t) for s in optimizer.state.values() for t in s.values())  # + 8-bit
parameters = sum(p.numel() for p in model.parameters())
print(f"optimizer state: {state_bytes:,} bytes, {state_bytes / parameters:.2f} a parameter (AdamW's: 8.00)")
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); {parts.peak_memory(device)}")
print("losses:", losses)
