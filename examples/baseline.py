"""The baseline: a small GPT learns to predict the next byte of movie reviews, in fp32, with AdamW.

Every other example in this folder is this file plus one technique, the lines it adds or changes
marked `# + <technique>`: diff one against this file to see the technique alone.

    python examples/baseline.py                     # the course's cpu-quick sizes: seconds on a CPU
    python examples/baseline.py --steps 100 --layers 4 --d-model 256
"""

import time

import parts  # the data, the model and the flags every example shares (examples/parts.py)
import torch

args = parts.arguments("Train the baseline GPT (fp32, AdamW).")
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
    loss = parts.loss_fn(model(inputs), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())  # .item() waits for the device: a reading's cost, once a step
    print(f"step {step:>3}  loss {losses[-1]:.4f}")
elapsed = time.perf_counter() - start
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); {parts.peak_memory(device)}")
print("losses:", losses)
