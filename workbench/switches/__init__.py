"""The switches: one module per technique a RunConfig turns on. Each holds its choices (or
names the registry that does), its checks, what it does to the model, the Accelerator and the
loop, and what it adds to the estimate.

    precision       fp32 / fp16 / bf16: autocast and fp16's GradScaler, through accelerate   (precision)
    accumulation    micro-batches per optimizer step                                          (loop)
    data_loading    the DataLoader's workers, pinning and prefetch                            (loop)
    checkpointing   activation checkpointing: recompute blocks in backward                    (converter)
    attention       the GPT's attention: explicit, or fused (sdpa)                            (converter)
    trainable       freezing and LoRA: fewer parameters train                                 (converter)
    qat             quantization-aware training: Linear layers fake-quantize                  (converter)
    sharding        FSDP2: each process holds 1/N of the model state                          (converter)
    optimizer       AdamW, Adam, SGD, Adafactor, 8-bit AdamW; for-loop, foreach or fused      (converter)
    compiling       torch.compile of the trained module, TF32 around the steps                (loop)

`run()` (engine/train.py) applies them in that order, each line marked `# technique:`: the
Accelerator is made with precision's, accumulation's and data loading's keywords; the model
goes through checkpointing, attention, trainable, qat and sharding; the optimizer is made for
what trains; the loop trains the compiled module under TF32. docs/CONTRACTS.md: adding one.

The package shares core's floor (tests/test_layers.py): RunConfig (core/config.py) reads the
switches' choices and runs their checks before anything is allocated, and a switch reaches only
into core (models, hardware, the registries); measure, planner and engine call the switches.
"""

from workbench.switches import (
    attention,
    checkpointing,
    compiling,
    data_loading,
    optimizer,
    precision,
    qat,
    sharding,
    trainable,
)

CHECKED = (precision, data_loading, checkpointing, attention, trainable, qat, optimizer, sharding, compiling)
"""The switches RunConfig checks, in this order, once every name is known to be one of its choices."""
