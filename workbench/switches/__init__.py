"""The switches: one module per technique a RunConfig turns on, each with its choices (or the
registry that names them), its checks, what it does to the model, the Accelerator and the loop,
and what it adds to the estimate. In the order `run()` applies them (`# technique:` lines):

    precision       fp32 / fp16 / bf16: autocast and fp16's GradScaler, via the Accelerator  (precision)
    accumulation    micro-batches per optimizer step, via the Accelerator                     (loop)
    data_loading    the DataLoader's workers, pinning and prefetch                            (loop)
    checkpointing   recompute blocks in backward: none, all, every_other                     (converter)
    attention       the GPT's attention: explicit, or fused (sdpa)                            (converter)
    memory_format   the CNN's 4-D tensors: contiguous (N,C,H,W), or channels_last (N,H,W,C)   (converter)
    trainable       freezing and LoRA: fewer parameters train                                 (converter)
    qat             quantization-aware training: Linear layers fake-quantize                  (converter)
    sharding        FSDP2: each process holds 1/N of the model state                          (converter)
    optimizer       which optimizer, over what trains; for-loop, foreach or fused             (converter)
    compiling       torch.compile of the trained module; TF32 around the steps                (loop)

They sit on core's floor and under the configuration (tests/test_layers.py): a switch builds on
core only; RunConfig (core/config/) reads their choices and runs their checks before anything is
allocated; measure, planner and engine call them. Adding one: docs/CONTRACTS.md.
"""

from workbench.switches import (attention, checkpointing, compiling, data_loading, memory_format, optimizer, precision, qat,
                                sharding, trainable)

CHECKED = (precision, data_loading, checkpointing, attention, memory_format, trainable, qat, optimizer, sharding, compiling)
"""The switches RunConfig checks, in this order, once every name is known to be one of its choices."""

CONVERTERS = (checkpointing, attention, memory_format, trainable, qat, sharding)
"""The switches that convert the model, in the order run() applies them: each `apply(model, cfg)`
returns the model it changed (or the same one when its field is off). Adding a converter is a line
here, not one in the loop (docs/CONTRACTS.md, "Adding a switch")."""
