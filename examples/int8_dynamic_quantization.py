"""Post-training dynamic int8 quantization (torchao): train the baseline, then make its Linear layers int8.

The baseline plus the lines marked `# + int8`. `quantize_` replaces every Linear weight by int8 with
one scale per output row; activations are quantized on the fly, one scale per token (a row of the
activation). Inference only: the file shrinks (Linear weights 4x) and int8 matmuls run where the hardware has them (VNNI/AMX
CPUs, GPUs). The held-out loss and the time of a forward are printed before and after.

    python examples/int8_dynamic_quantization.py
"""

import copy
import time

import parts
import torch
from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_


@torch.no_grad()
def held_out(model, test, device, samples=256):
    """The loss over the first `samples` held-out windows, and the seconds one forward took."""
    inputs, labels = (t[:samples].to(device) for t in test.tensors)
    start = time.perf_counter()
    logits = model(inputs)
    return parts.loss_fn(logits, labels).item(), time.perf_counter() - start


args = parts.arguments("Train the baseline GPT, then quantize it to int8 (dynamic, torchao).")
device = parts.device()
train, test = parts.text_windows(args.text, args.seq_len)
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
    losses.append(loss.item())
    print(f"step {step:>3}  loss {losses[-1]:.4f}")
elapsed = time.perf_counter() - start

model.eval()
int8_model = copy.deepcopy(model)  # + int8: keep the fp32 model to compare
quantize_(int8_model, Int8DynamicActivationInt8WeightConfig())  # + int8: every Linear, in place
for name, m in (("fp32", model), ("int8", int8_model)):  # + int8
    held_out(m, test, device)  # a first call warms up
    loss, seconds = held_out(m, test, device)
    print(f"{name}: held-out loss {loss:.4f}, a forward of 256 windows {seconds * 1e3:.1f} ms")
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); {parts.peak_memory(device)}")
print("losses:", losses)
