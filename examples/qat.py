"""Quantization-aware training (torchao): the baseline trains with its Linear layers fake-quantized.

The baseline plus the lines marked `# + qat`. In forward each Linear's weight is rounded to
--bits-bit integers (one scale per output row) and its input to int8, then back to float: training
sees the rounding it will meet after conversion, and learns around it. After training, `convert`
swaps in the real quantized layers; the held-out loss is printed before and after.

    python examples/qat.py --bits 4
"""

import time

import parts
import torch
from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
from torchao.quantization.granularity import PerAxis
from torchao.quantization.qat import QATConfig


@torch.no_grad()
def held_out_loss(model, test, device, samples=256):
    inputs, labels = (t[:samples].to(device) for t in test.tensors)
    return parts.loss_fn(model(inputs), labels).item()


args = parts.arguments("Train the baseline GPT quantization-aware (torchao), then convert it.",
                       **{"--bits": dict(type=int, default=8, choices=(2, 3, 4, 8), help="the weights' bits")})
device = parts.device()
train, test = parts.text_windows(args.text, args.seq_len)
batches = parts.forever(parts.loader(train, args.batch_size, args.seed))
model = parts.gpt(args).to(device)
scheme = Int8DynamicActivationIntxWeightConfig(weight_dtype=getattr(torch, f"int{args.bits}"),  # + qat
                                               weight_granularity=PerAxis(0))  # + qat: a scale per output row
quantize_(model, QATConfig(scheme, step="prepare"))  # + qat: Linear layers fake-quantize from here on
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
    losses.append(loss.item())
    print(f"step {step:>3}  loss {losses[-1]:.4f}")
elapsed = time.perf_counter() - start
model.eval()
print(f"held-out loss, fake-quantized: {held_out_loss(model, test, device):.4f}")
quantize_(model, QATConfig(scheme, step="convert"))  # + qat: real int{bits} weights now
print(f"held-out loss, converted:      {held_out_loss(model, test, device):.4f}")
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); {parts.peak_memory(device)}")
print("losses:", losses)
