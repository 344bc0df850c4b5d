"""The switches: one module per technique a RunConfig turns on, each with its choices (or the
registry that names them), its checks, what it does to the model, the Accelerator and the loop,
and what it adds to the estimate. In the order `run()` applies them (`# technique:` lines):

    precision                 fp32 / fp16 / bf16: autocast and fp16's GradScaler, via the Accelerator
    gradient_accumulation     micro-batches per optimizer step, via the Accelerator           (loop)
    data_loading              the DataLoader's workers, pinning and prefetch                  (loop)
    activation_checkpointing  recompute blocks in backward: none, all, every_other           (converter)
    attention                 the GPT's attention: explicit, or fused (sdpa)                  (converter)
    memory_format             the CNN's 4-D tensors: contiguous (N,C,H,W), or channels_last  (converter)
    trainable                 freezing and LoRA: fewer parameters train                       (converter)
    qat                       quantization-aware training: Linear layers fake-quantize        (converter)
    sharding                  FSDP2: each process holds 1/N of the model state               (converter)
    optimizer                 which optimizer, over what trains; for-loop, foreach or fused   (converter)
    compiling                 torch.compile of the module the loop trains                     (loop)
    tf32                      TF32 for CUDA fp32 matmuls, around the steps only               (loop)

They sit on core's floor and under the configuration (tests/test_layers.py): a switch builds on
that floor (and base, machine) only; RunConfig (core/config/) reads their choices and runs their checks before anything is
allocated; measure and the engine call them, the planner replays them. Adding one: docs/CONTRACTS.md.
"""

from workbench.core.switches import (
                                     activation_checkpointing,
                                     attention,
                                     compiling,
                                     data_loading,
                                     memory_format,
                                     optimizer,
                                     precision,
                                     qat,
                                     sharding,
                                     tf32,
                                     trainable,
)

CHECKED = (precision, data_loading, activation_checkpointing, attention, memory_format, trainable, qat, optimizer, sharding,
           compiling, tf32)
"""The switches RunConfig checks, in this order, once every name is known to be one of its choices."""

CONVERTERS = (activation_checkpointing, attention, memory_format, trainable, qat, sharding)
"""The switches that convert the model, in the order run() applies them: each `apply(model, cfg)`
returns the model it changed (or the same one when its field is off). Adding a converter is a line
here, not one in the loop (docs/CONTRACTS.md, "Adding a switch")."""
