"""Fused attention: the baseline's attention with F.scaled_dot_product_attention in place of the math.

The baseline plus the lines marked `# + sdpa`. The math version keeps the s x s probabilities of
every head for backward; the fused kernel (flash or memory-efficient on a GPU) keeps none, and
computes the same function (to float rounding).

    python examples/sdpa_attention.py
"""

import time

import parts
import torch
import torch.nn.functional as F


class FusedAttention(parts.Attention):  # + sdpa: the same weights (q, k, v, output), a fused kernel
    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.heads(x)
        # The math it replaces (parts.Attention):
        #   att = (q @ k.transpose(-2, -1)) / sqrt(head width), masked above the diagonal, softmax; y = att @ v
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # + sdpa: no s x s matrix kept
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, -1))


args = parts.arguments("Train the baseline GPT with fused attention (SDPA).")
device = parts.device()
train, _ = parts.text_windows(args.text, args.seq_len)
batches = parts.forever(parts.loader(train, args.batch_size, args.seed))
model = parts.gpt(args, attention=FusedAttention).to(device)  # + sdpa
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
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); {parts.peak_memory(device)}")
print("losses:", losses)
