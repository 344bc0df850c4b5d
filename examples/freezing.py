"""Freezing: the embeddings (and so the tied lm_head) get no gradient and no optimizer state.

The baseline plus the lines marked `# + freeze`. A frozen parameter still runs in forward; backward
stops computing its gradient, and the optimizer, given only what trains, keeps no state for it.

    python examples/freezing.py
"""

import time

import parts
import torch

args = parts.arguments("Train the baseline GPT with its embeddings frozen.")
device = parts.device()
train, _ = parts.text_windows(args.text, args.seq_len)
batches = parts.forever(parts.loader(train, args.batch_size, args.seed))
model = parts.gpt(args).to(device)
for frozen in (model.wte, model.wpe):  # + freeze: token and position embeddings (lm_head shares wte's weight)
    frozen.requires_grad_(False)  # + freeze
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],  # + freeze: what trains
                              lr=args.lr, weight_decay=0.0)
print(parts.trainable(model))

losses = []
start = time.perf_counter()
for step in range(1, args.steps + 1):
    inputs, labels = (t.to(device) for t in next(batches))
    loss = parts.loss_fn(model(inputs), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
    print(f"step {step:>3}  loss {losses[-1]:.4f}")
elapsed = time.perf_counter() - start
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); {parts.peak_memory(device)}")
print("losses:", losses)
