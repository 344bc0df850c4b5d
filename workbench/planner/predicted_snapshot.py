"""The estimator's step as a memory snapshot: the file PyTorch's memory viewer opens.

`predicted_snapshot(config)` writes the replay `estimate()` reads (`planner.fakestep`, here with
every block: nothing scaled) in the format `torch.cuda.memory._snapshot()` returns
(`measure.snapshot`), so the prediction opens where a measured step does (pytorch.org/memory_viz):

- blocks allocated before the record began: the parameters and buffers, the optimizer state, and
  on a GPU the two cuBLAS workspaces (a real record started mid-run shows the model state so);
- the trace: an alloc and a free for every storage of the step's micro-batches (one, or two with
  accumulation: later ones repeat the second), each named by the op that made it and its phase
  ("backward of micro-batch 1: aten::mm"); then the optimizer step's temporaries at their peak, as
  one block;
- at the end, what is still live (gradients, the last logits and batch) as active blocks.

Its peak is `estimate(config).peak_bytes` to the byte (tests/test_snapshot.py). Sizes are as the
device holds them (a GPU's in 512-byte blocks, the bytes asked for beside them); the addresses are
a first-fit layout made up for the viewer, so its "Allocator State History" is not a real
allocator's: the bytes and their order are the replay's.

Example:
    >>> snap = predicted_snapshot(RunConfig(model="mlp", preset="cpu-quick"))  # doctest: +SKIP
    >>> snap.peak_bytes == estimate(RunConfig(model="mlp", preset="cpu-quick")).peak_bytes  # doctest: +SKIP
    True
"""

from __future__ import annotations

from workbench.core.config import RunConfig
from workbench.core.measure.snapshot import Lifetime, MemorySnapshot, build_snapshot, frame
from workbench.core.switches import attention, gradient_accumulation
from workbench.planner import fakecuda, fakestep
from workbench.planner.estimate import _freeze, _spec_key, estimate, input_spec, model_key, model_state

__all__ = ["predicted_snapshot"]

REPLAY = "workbench/planner/fakestep.py"
"""The frames' outer file: where the predicted storages were made (on fake tensors)."""


def _phase(born: int, marks: dict[str, int], micro_batches: int) -> str:
    """Where in the step a storage made at clock `born` was made."""
    for micro in range(1, micro_batches + 1):
        if born < marks[f"fetch.{micro}"]:
            return "held from the previous step" if micro == 1 else f"backward of micro-batch {micro - 1}"
        if born < marks[f"forward_end.{micro}"]:
            return f"forward of micro-batch {micro}"
        if born < marks[f"backward.{micro}"]:
            return f"loss of micro-batch {micro}"
    return f"backward of micro-batch {micro_batches}"


def predicted_snapshot(config: RunConfig, *, device: str | None = None, vocab_size: int | None = None) -> MemorySnapshot:
    """One steady-state training step of `config`, predicted on fake tensors, as a memory snapshot.

    Args:
        config: the run, as `estimate()` takes it (sharded configs excepted: one process only).
        device: 'cpu' or 'cuda', whose step to predict (default: the config's).
        vocab_size: GPT only, as in `estimate()`.

    Returns: a `MemorySnapshot`; `.write(path)` pickles it for memory_viz, `.peak_bytes` is the
    estimate's peak.
    """
    cfg = config.resolved()
    est = estimate(cfg, device=device, vocab_size=vocab_size)  # checks the config and the device
    if est.processes > 1:
        raise ValueError(f"sharding={cfg.sharding!r}: predicted_snapshot() shows one process's whole step; "
                         "pass a config with sharding='none'")
    device = est.device
    model = model_key(cfg)
    spec_key = _spec_key(input_spec(cfg, vocab_size=vocab_size), model)
    state = model_state(cfg, model, spec_key, device)
    dims = _freeze({**cfg.dims, **attention.replay_dims(cfg)}) if cfg.model == "gpt" else _freeze(cfg.dims)
    micro_batches = gradient_accumulation.replayed_micro_batches(cfg)
    storages, marks = fakestep.step_storages(model, spec_key, dims, cfg.precision, cfg.activation_checkpointing,
                                             batch=cfg.batch_size, micro_batches=micro_batches, device=device)
    before = [("model state", "parameters and buffers", state.held_device_bytes),
              ("model state", "optimizer state", state.resident_bytes - state.held_device_bytes)]
    if est.runtime_bytes:
        before += [("cuBLAS", f"workspace of the {who} thread", est.runtime_bytes // 2) for who in ("forward", "autograd")]
    lifetimes = [Lifetime(-len(before) + i - 1, None, n, n, (frame(f, name),)) for i, (f, name, n) in enumerate(before)]
    for s in storages:
        where = (frame(_phase(s.born, marks, micro_batches), s.op or "(no op)"), frame(REPLAY, "predicted on fake tensors"))
        lifetimes.append(Lifetime(s.born, s.freed, fakecuda.device_bytes(s.nbytes, device), s.nbytes, where))
    end = marks[f"end.{micro_batches}"]
    later = " (micro-batches 1 and 2 shown: the later ones repeat the second)" if cfg.grad_accum_steps > 2 else ""
    step = state.optimizer_step_bytes  # its peak, after the last micro-batch's backward, gradients present
    lifetimes.append(Lifetime(end + 1, end + 2, step, step,
                              (frame("optimizer step", f"{cfg.optimizer}: its temporaries at their peak (one block)"),)))
    # the record begins where the step's first micro-batch does: what the loop held over from the
    # previous step (its logits, loss and batch) was allocated before it, as the model state was
    snap = MemorySnapshot(build_snapshot(lifetimes, start=marks["fetch.1"], stop=end + 2),
                          f"predicted: the step replayed on fake tensors as {device} runs it, {cfg.precision}, "
                          f"micro-batch {cfg.batch_size} x {cfg.grad_accum_steps}{later}, checkpointing "
                          f"{cfg.activation_checkpointing}")
    return snap
