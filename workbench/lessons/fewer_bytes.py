"""Notebook 09: train fewer bytes. The measurements beside the learner's own lines.

The learner freezes (`requires_grad_(False)`), adds LoRA adapters (peft's `LoraConfig` +
`get_peft_model`), builds an 8-bit AdamW (torchao) and shards with FSDP2's `fully_shard`;
these helpers count what those lines hold:

- `one_step_bytes(model, optimizer, batch)`: one training step, then the bytes of the weights,
  their gradients and the optimizer's state (a sharded model: this process's shards);
- `state_bytes(optimizers)`: each optimizer's state after one step from the same gradients;
- `quiet_torchao()`: torchao's import without its log lines about CUDA-only kernels.

Example:
    >>> model = torch.nn.Linear(4, 2)
    >>> one_step_bytes(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
    ...                {"inputs": torch.ones(3, 4), "labels": torch.zeros(3, dtype=torch.long)}).model_state_bytes
    120
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from workbench.base.report import Report, format_bytes
from workbench.core.measure.counters import gradient_bytes, optimizer_state_bytes, parameter_bytes
from workbench.core.models import loss_fn
from workbench.machine.torchao_support import quiet_torchao_logs

__all__ = ["ModelState", "one_step_bytes", "state_bytes", "quiet_torchao"]


@dataclass(frozen=True, slots=True)
class ModelState(Report):
    """What training keeps besides activations, in bytes, as measured after one step."""

    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int

    @property
    def model_state_bytes(self) -> int:
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_state_bytes

    header = ("weights", "gradients", "optimizer state", "model state")

    def rows(self) -> list[list[str]]:
        return [[format_bytes(b) for b in (self.parameter_bytes, self.gradient_bytes, self.optimizer_state_bytes,
                                           self.model_state_bytes)]]


def one_step_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict) -> ModelState:
    """Train one step on `batch`, then count the weights, gradients and optimizer state held
    (optimizers make their state at the first step; the gradients are read before zeroing them).

    Example:
        >>> one_step_bytes(model, optimizer, next(batches))  # doctest: +SKIP
    """
    loss_fn(model(batch["inputs"]), batch["labels"]).backward()
    optimizer.step()
    state = ModelState(parameter_bytes(model), gradient_bytes(model), optimizer_state_bytes(optimizer))
    optimizer.zero_grad(set_to_none=True)
    return state


def state_bytes(optimizers: dict[str, torch.optim.Optimizer], *, seed: int = 0) -> dict[str, int]:
    """Each optimizer's state bytes after one step from the same seeded gradients.

    torchao's 8-bit AdamW `torch.compile`s its update once per parameter shape; on a 2-core CPU the
    first compile took 45 s, longer than the notebook. The state it makes is the same eager, so on a
    CPU the step runs eagerly (`force_eager`); on a GPU it compiles as torchao intends.

    Example:
        >>> state_bytes({"sgd": torch.optim.SGD(torch.nn.Linear(4, 4).parameters(), lr=0.1, momentum=0.9)})
        {'sgd': 80}
    """
    generator = torch.Generator().manual_seed(seed)
    counted = {}
    for name, optimizer in optimizers.items():
        params = [p for group in optimizer.param_groups for p in group["params"]]
        generator.manual_seed(seed)
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator).to(p.device)
        on_cpu = params[0].device.type == "cpu"
        with torch.compiler.set_stance("force_eager") if on_cpu else contextlib.nullcontext():
            optimizer.step()
        counted[name] = optimizer_state_bytes(optimizer)
    return counted


@contextlib.contextmanager
def quiet_torchao() -> Iterator[None]:
    """Import torchao inside this block without its load-time log lines and deprecation notices
    (about CUDA-only kernels and torch's own API changes: nothing a learner can act on). Errors show."""
    with quiet_torchao_logs(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield
