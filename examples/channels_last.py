"""channels_last: a small CNN's weights and activations laid out N,H,W,C, the layout convolutions run in.

Unlike the other examples this one trains on images (only 4-D tensors have a memory format): a small
CNN on MNIST digits, the lines marked `# + channels_last` being the whole technique. oneDNN (CPUs) and
cuDNN (GPUs, tensor cores) convolve natively in N,H,W,C; the default N,C,H,W costs them a reorder around
each convolution. The same values in another order: losses equal to float rounding.

    python examples/channels_last.py
    python examples/channels_last.py --contiguous     # the same run in torch's default layout, to compare
"""

import time

import parts
import torch
import torch.nn.functional as F

args = parts.arguments("Train a small CNN on MNIST digits in the channels_last memory format.",
                       **{"--images": dict(type=int, default=4000, choices=range(64, 5001), metavar="N",
                                           help="digits to train on (64 to 5000)"),
                          "--contiguous": dict(action="store_true", help="torch's default layout instead")})
device = parts.device()
images, labels = parts.digits(args.images, seed=args.seed)
inputs = (images.unsqueeze(1).float() / 255 - 0.1307) / 0.3081  # (N, 1, 28, 28), normalised as MNIST's mean and std
train = torch.utils.data.TensorDataset(inputs, labels)
batches = parts.forever(parts.loader(train, args.batch_size, args.seed))
torch.manual_seed(args.seed)
model = parts.SmallCNN().to(device)
layout = torch.contiguous_format if args.contiguous else torch.channels_last  # + channels_last
model = model.to(memory_format=layout)  # + channels_last: the 4-D weights, in place
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
print(parts.trainable(model))

losses = []
start = time.perf_counter()
for step in range(1, args.steps + 1):
    x, y = next(batches)
    x = x.to(device, memory_format=layout)  # + channels_last: the images too (a conv's output follows its weight)
    loss = F.cross_entropy(model(x), y.to(device))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
    print(f"step {step:>3}  loss {losses[-1]:.4f}")
elapsed = time.perf_counter() - start
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); {parts.peak_memory(device)}")
print("losses:", losses)
