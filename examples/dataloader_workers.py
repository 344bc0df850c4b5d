"""DataLoader workers and pinned memory: batches made in other processes while this one trains.

The baseline plus the lines marked `# + workers`. The order of the batches is the baseline's (the
loader's own generator draws the shuffle and seeds the workers), so the losses are too; what
changes is who waits. It pays when making a batch is real work (decoding images, tokenising);
the in-memory windows here are cheap, so watch the ms a step with --workers 0 and 2.

    python examples/dataloader_workers.py --workers 2
"""

import time

import parts
import torch

args = parts.arguments("Train the baseline GPT with DataLoader workers and pinned memory.",
                       **{"--workers": dict(type=int, default=2, choices=range(0, 65), metavar="N",
                                            help="worker processes (0 to 64)")})
device = parts.device()
train, _ = parts.text_windows(args.text, args.seq_len)
workers = dict(num_workers=args.workers, prefetch_factor=2, persistent_workers=True) if args.workers else {}  # + workers
loader = parts.loader(train, args.batch_size, args.seed, **workers,  # + workers: each worker keeps 2 batches ready
                      pin_memory=device.type == "cuda")  # + workers: page-locked batches copy to a GPU asynchronously
batches = parts.forever(loader)
model = parts.gpt(args).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
print(parts.trainable(model))

losses, waited = [], 0.0
start = time.perf_counter()
for step in range(1, args.steps + 1):
    fetch = time.perf_counter()
    inputs, labels = next(batches)
    waited += time.perf_counter() - fetch  # + workers: the time the loop waited for data
    inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)  # + workers
    loss = parts.loss_fn(model(inputs), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
    print(f"step {step:>3}  loss {losses[-1]:.4f}")
elapsed = time.perf_counter() - start
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step, {waited / elapsed:.0%} "
      f"waiting for data); {parts.peak_memory(device)}")
print("losses:", losses)
