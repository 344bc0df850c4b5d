"""How a run ends: the exceptions a stop raises, the result kept for `last_result()`, and the
memory given back.

- `RunInterrupted` (Kernel > Interrupt during a run: a KeyboardInterrupt carrying the partial
  result) and `Diverged` (the loss stopped being finite), with `diverged_message`;
- `last_result()` / `remember()`: the most recent run's result, however it ended;
  `keep_partial` keeps a failed run's curve so far;
- `untangle` lets reference counts free a finished run's model and optimizer state; `free`
  gives a failed run's memory back at once (a garbage collection), so the kernel stays usable.

Example:
    >>> remember("a result"); last_result()
    'a result'
"""

from __future__ import annotations

from types import MethodType

from workbench.core.config import ConfigError
from workbench.core.measure.result import RunResult

__all__ = ["Diverged", "RunInterrupted", "diverged_message", "free", "keep_partial", "last_result", "non_finite_loss",
           "remember", "untangle"]


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Kernel > Interrupt (Ctrl-C). Its partial RunResult (status
    'interrupted', the curve so far) is `.result`, and `last_result()` returns it too.
    It is a KeyboardInterrupt so that the cells queued after it (Run All) do not run."""

    def __init__(self, result: RunResult) -> None:
        super().__init__(f"{result.name}: {result.message}; the partial result is "
                         "workbench.last_result() (or this exception's .result)")
        self.result = result

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for it: this line, not a screen of library frames under the
        run's view (the cell still ends in error, so Run All stops here)."""
        return [f"RunInterrupted: {self}"]


class Diverged(Exception):
    """The training loss stopped being a finite number: the weights are no longer usable."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


_last_results: list[RunResult] = []


def last_result() -> RunResult | None:
    """The RunResult of the most recent run in this process, however it ended (None before any)."""
    return _last_results[-1] if _last_results else None


def remember(result: RunResult) -> None:
    """Make `result` what `last_result()` returns (run() and the monitor call it)."""
    _last_results[:] = [result]


def diverged_message(cfg, first_bad: int, stopped: int) -> str:
    """What to say when the loss went non-finite at step `first_bad`: one line, with the fix."""
    if cfg.precision == "fp16":
        fix = "use precision='bf16' (fp32's range) or lower lr"
    else:
        fix = f"lower lr (now {cfg.lr:g})" + ("" if cfg.max_grad_norm else " or pass max_grad_norm=1.0")
    what = non_finite_loss(cfg.precision, first_bad)
    return f"{what}; stopped at step {stopped}, before the weights were saved; {fix}"


def non_finite_loss(precision: str, first_bad: int) -> str:
    """What went non-finite, from which step (run() and the monitor say it alike)."""
    if precision == "fp16":
        return f"every fp16 loss from step {first_bad} was non-finite (the GradScaler cannot fix a forward overflow)"
    return f"the loss became non-finite (nan or inf) at step {first_bad}"


def keep_partial(result_now, error: BaseException) -> None:
    """Nothing lost: a run that failed still leaves its result so far (status 'failed': its curve,
    and the trained model once every step trained) in last_result() and as the error's `.result`.
    The error's message is left as it was raised: its last line is what launchers and readers
    take for the cause; a note under it (shown with the traceback) says where a trained model is."""
    if isinstance(error, ConfigError):  # refused before step 1: no run to keep
        return
    try:
        partial = result_now()
    except Exception:  # the failure may be the very thing a result is built from
        return
    remember(partial)
    try:
        error.result = partial
    except (AttributeError, TypeError):  # an exception type that takes no attributes: last_result() has it
        return
    if partial.model is not None:
        error.add_note(f"{partial.name}: all {partial.steps_done} steps trained before this failed; the trained model "
                       "is this exception's .result.model (and workbench.last_result().model)")


def untangle(model, plain, optimizer) -> None:
    """Break the reference cycles accelerate leaves behind a reduced-precision run, so that
    this run's model, gradients and optimizer state are freed when run() returns, not at
    whatever later moment Python's garbage collector runs (a collection costs ~1 s here).

    The autocast forward accelerate sets on the model, and the plain one unwrapping puts back,
    is a bound method of the model kept in the model's own __dict__; with a GradScaler the
    optimizer wrapper keeps a closure over itself, and the torch optimizer a bound method of
    itself as `step`. On an H200 notebook 01's bf16 run started with the fp16 run's model and
    AdamW state (~1 GiB) still allocated. What is removed is only those instance attributes:
    the class's own forward and step are what remains."""
    for module in {id(m): m for m in (model, plain)}.values():
        bound = module.__dict__.get("forward")
        if isinstance(bound, MethodType) and bound.__self__ is module:
            del module.__dict__["forward"]
        module.__dict__.pop("_original_forward", None)
    inner = getattr(optimizer, "optimizer", None)
    if optimizer is not None:
        optimizer.__dict__.pop("_optimizer_patched_step_method", None)
        optimizer.__dict__.pop("_optimizer_original_step_method", None)
    for opt in (optimizer, inner):
        bound = getattr(opt, "__dict__", {}).get("step")
        if isinstance(bound, MethodType) and bound.__self__ is opt:
            del opt.__dict__["step"]


def free(accelerator) -> None:
    """Give memory back after a failed run so the kernel stays usable. accelerate's
    free_memory() drops its references, collects garbage and empties the device cache (a
    second gc.collect() here cost another ~0.6 s a failed run, measured, for nothing)."""
    accelerator.free_memory()
