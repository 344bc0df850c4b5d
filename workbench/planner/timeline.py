"""One training step's memory, moment by moment: the live bytes after every allocation.

`step_timeline(config)` replays one micro-batch of `run()`'s steady-state step on fake tensors
(`planner.fakestep`, the replay `estimate()` reads: on a CPU it equals the tracked real step
to the byte) with the whole model, no blocks scaled, and returns the live bytes after each
allocation of its forward and backward, the model state (parameters, buffers, optimizer
state) included: the curve a memory profiler draws, without running the step.

Example:
    >>> t = step_timeline(RunConfig(model="mlp", preset="cpu-quick"))
    >>> t.peak_bytes >= t.resident_bytes, t.forward_end < len(t.levels)
    (True, True)
"""

from __future__ import annotations

from typing import NamedTuple

from workbench.core.config import RunConfig
from workbench.machine.hardware import resolve_device
from workbench.planner import fakestep
from workbench.planner.estimate import (
    _freeze,
    _spec_key,
    estimate,
    input_spec,
    model_key,
)

__all__ = ["StepTimeline", "step_timeline"]


class StepTimeline(NamedTuple):
    levels: tuple[int, ...]
    """Live bytes after each allocation of one micro-batch's forward and backward, model state included."""
    forward_end: int
    """Allocations made by the end of the forward (the loss included): where the backward begins."""
    resident_bytes: int
    """Parameters, buffers and optimizer state: there all step long."""

    @property
    def peak_bytes(self) -> int:
        return max(self.levels)

    @property
    def forward_end_bytes(self) -> int:
        """Live when the backward begins: every saved activation is there."""
        return self.levels[self.forward_end - 1] if self.forward_end else self.resident_bytes


def step_timeline(config: RunConfig, *, device: str | None = None) -> StepTimeline:
    """The live bytes of one micro-batch of `config`'s steady-state step (the first of its
    window: no gradients yet), on 'cpu' or 'cuda' (default: the config's device). A GPU's
    cuBLAS workspaces are left out: they are there all run long, like the model state."""
    cfg = config.resolved()
    # estimate() checks the config and the device and sizes the model state (cached: the same
    # replay); only the step is replayed again here, with every block
    resident = estimate(cfg, device=device).resident_bytes
    device = device or resolve_device(cfg.device)
    model = model_key(cfg)
    dims = _freeze({**cfg.dims, "attention": cfg.attention}) if cfg.model == "gpt" else _freeze(cfg.dims)
    sim = fakestep.simulate(model, _spec_key(input_spec(cfg), model), dims, cfg.precision,
                            cfg.activation_checkpointing, batch=cfg.batch_size, micro_batches=1, device=device, group=0)
    return StepTimeline(tuple(resident + level for level in sim.levels), sim.marks["backward.1"].index, resident)
