"""How long a planned step takes: the speed models the planner ranks plans with.

Each model predicts the seconds of one optimizer step from an `Estimate` and says what kind
of figure that is (`label`), because the two are not the same kind:

- `Roofline` (a GPU on paper): a **lower bound** from the data sheet. Every op of the step,
  replayed on fake tensors with the device's own kernels' choices, takes at least the longer
  of its FLOPs at the peak of its dtype and its bytes at the memory bandwidth. This is what
  makes a small micro-batch cost more per sample: every micro-batch reads all the weights
  again (a matmul over few rows is bound by memory, not FLOPs), and the elementwise ops,
  which do no matmul FLOPs, still move their bytes. fp32 matmuls run on TF32 tensor cores
  only where torch allows it (`torch.set_float32_matmul_precision("high")`; off by default,
  and the loop turns it on only with `RunConfig(tf32=True)`): on an A100 that is 156 against
  19.5 TFLOP/s.
- `MeasuredHere` (this machine): **measured**. One micro-batch's forward and backward is
  timed here at each micro-batch size, precision and checkpointing setting (the faster of
  two after a warm-up), times the accumulation steps, plus the optimizer step timed here.
  Per-op overheads, cache effects and an emulated dtype's slowness are all in it.

Example:
    >>> speed = Roofline({"fp32": 19.5e12, "bf16": 312e12}, 1.555e12, note="A100")   # doctest: +SKIP
    >>> speed.step_time(estimate(RunConfig(model="gpt"), device="cuda"))              # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Protocol

import torch

from workbench.base.precisions import AUTOCAST_DTYPES
from workbench.core import custom
from workbench.core.models import build_model, loss_fn
from workbench.core.switches.activation_checkpointing import set_activation_checkpointing
from workbench.core.switches.optimizer import make_optimizer
from workbench.planner.estimate import Estimate, input_spec, model_key

__all__ = ["MeasuredHere", "Roofline", "SpeedModel"]


class SpeedModel(Protocol):
    label: str
    """What the figure is: 'roofline bound', 'measured here', ..."""

    def step_time(self, est: Estimate) -> float: ...


class Roofline:
    """A lower bound on a step's time from peak FLOP/s per dtype and memory bandwidth."""

    label = "roofline bound"

    def __init__(self, peaks: dict[str, float], bandwidth: float | None, *, note: str = "") -> None:
        if "fp32" not in peaks:
            raise ValueError(f"peaks {sorted(peaks)} need an 'fp32' entry (what fp32 matmuls run at)")
        self.peaks, self.bandwidth, self.note = dict(peaks), bandwidth, note
        if bandwidth is None:
            self.label = "FLOPs at peak (bound)"

    def step_time(self, est: Estimate) -> float:
        return est.roofline_seconds(self.peaks, self.bandwidth)

    def describe(self, precision: str) -> str:
        peak = self.peaks.get(precision, self.peaks["fp32"]) / 1e12
        memory = f", {self.bandwidth / 1e9:,.0f} GB/s" if self.bandwidth else ""
        return f"{precision} matmuls at {peak:.3g} TFLOP/s{memory}"


class MeasuredHere:
    """Step times measured on this CPU: micro-batch forward + backward, and the optimizer step."""

    label = "measured here"

    def __init__(self, *, repeats: int = 2) -> None:
        self.repeats = repeats
        self._micro: dict[tuple, float] = {}
        self._optimizer: dict[tuple, float] = {}
        self._models: dict[tuple, Any] = {}

    def describe(self, precision: str) -> str:
        return f"{precision} timed on this machine"

    def step_time(self, est: Estimate) -> float:
        cfg = est.config
        key = _shape_key(cfg, est.vocab_size)
        micro = (*key, cfg.precision, cfg.activation_checkpointing, cfg.batch_size)
        if micro not in self._micro:
            self._micro[micro] = self._time(cfg, est.vocab_size, optimizer_step=False)
        opt = (*key, cfg.optimizer, cfg.weight_decay)
        if opt not in self._optimizer:
            self._optimizer[opt] = self._time(cfg, est.vocab_size, optimizer_step=True)
        return cfg.grad_accum_steps * self._micro[micro] + self._optimizer[opt]

    def _time(self, cfg: Any, vocab_size: int | None, *, optimizer_step: bool) -> float:
        spec = input_spec(cfg, vocab_size=vocab_size)
        with torch.random.fork_rng():  # timing must not move the global RNG the runs draw from
            key = _shape_key(cfg, vocab_size)
            if key not in self._models:  # one model per shape; plans differ in how it is run
                self._models[key] = (build_model(cfg.model, data=spec, dims=cfg.dims, seed=0)
                                     if isinstance(cfg.model, str) else custom.model_copy(cfg.model, seed=0))
            model = self._models[key]
            set_activation_checkpointing(model, cfg.activation_checkpointing)
            model.train()
            b, shape = cfg.batch_size, tuple(spec.input_shape)
            if spec.task == "custom":  # your module: timed on b real samples of its data
                inputs, labels = _real_batch(cfg, b)
            elif spec.task == "language_modeling":
                inputs = torch.randint(0, spec.vocab_size, (b, *shape))
                labels = torch.randint(0, spec.vocab_size, (b, *shape))
            else:
                inputs, labels = torch.randn(b, *shape), torch.randint(0, spec.num_classes, (b,))
            dtype = AUTOCAST_DTYPES.get(cfg.precision)
            if optimizer_step:
                optimizer = make_optimizer(model, cfg)
                for p in model.parameters():
                    p.grad = torch.zeros_like(p)

                def once() -> None:
                    optimizer.step()  # (its updates change the weights, not the time of a pass)
            else:
                def once() -> None:
                    with torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext():
                        logits = model(inputs)
                    loss_fn(logits.float(), labels).backward()
                    model.zero_grad(set_to_none=True)

            once()  # warm-up: kernels chosen, the optimizer's state made
            best = float("inf")
            for _ in range(self.repeats):
                start = time.perf_counter()
                once()
                best = min(best, time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
            return best


def _shape_key(cfg: Any, vocab_size: int | None) -> tuple:
    """What fixes the model and its inputs' shapes (a dataset passed in: by identity)."""
    data = cfg.data if isinstance(cfg.data, str) else id(cfg.data)
    return model_key(cfg), data, cfg.seq_len, repr(cfg.dims), vocab_size


def _real_batch(cfg: Any, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` training samples of the config's data (from the first, round again if it is
    smaller), in the {"inputs", "labels"} contract."""
    data = custom.load_bundle(cfg)
    collate = data.collate_fn or custom.ContractBatches()
    got = collate([data.train[i % len(data.train)] for i in range(batch)])
    return got["inputs"], got["labels"]
