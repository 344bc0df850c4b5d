"""LoRA with peft: the baseline's weights frozen, small adapters trained on the attention's Linear layers.

The baseline plus the lines marked `# + lora`. Each adapted layer computes W x + (alpha / r) B A x
with A (r x in) and B (out x r, zeros at first): the model starts as the baseline, and only A and B
get gradients and optimizer state.

    python examples/lora.py --rank 8
"""

import time

import parts
import torch
from peft import LoraConfig, get_peft_model

args = parts.arguments("Fine-tune the baseline GPT with LoRA adapters (peft).",
                       **{"--rank": dict(type=int, default=8, choices=range(1, 257), metavar="R",
                                         help="the adapters' rank (1 to 256)")})
device = parts.device()
train, _ = parts.text_windows(args.text, args.seq_len)
batches = parts.forever(parts.loader(train, args.batch_size, args.seed))
model = parts.gpt(args)
lora = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, bias="none",  # + lora
                  target_modules=["c_attn", "attn.c_proj"])  # + lora: q, k, v and the attention's output
model = get_peft_model(model, lora).to(device)  # + lora: freezes every weight, adds A and B
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],  # + lora: the adapters only
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
