"""Activation checkpointing: keep each block's input only, recompute the block in backward.

The baseline plus the lines marked `# + checkpointing`. The saved activations shrink to one
tensor a block; backward pays one more forward of each block. The gradients are the same.

    python examples/activation_checkpointing.py
"""

import time

import parts
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Checkpointed(nn.Module):  # + checkpointing
    """Runs `block` keeping only its input; backward runs the block's forward again."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False)  # + checkpointing (the non-reentrant kind torch advises)


args = parts.arguments("Train the baseline GPT, every block checkpointed.")
device = parts.device()
train, _ = parts.text_windows(args.text, args.seq_len)
batches = parts.forever(parts.loader(train, args.batch_size, args.seed))
model = parts.gpt(args).to(device)
model.blocks = nn.ModuleList(Checkpointed(block) for block in model.blocks)  # + checkpointing: every block
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
print(parts.trainable(model))

losses = []
start = time.perf_counter()
for step in range(1, args.steps + 1):
    inputs, labels = (t.to(device) for t in next(batches))
    loss = parts.loss_fn(model(inputs), labels)
    loss.backward()  # each block's forward runs again here, one block at a time
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
    print(f"step {step:>3}  loss {losses[-1]:.4f}")
elapsed = time.perf_counter() - start
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); {parts.peak_memory(device)}")
print("losses:", losses)
