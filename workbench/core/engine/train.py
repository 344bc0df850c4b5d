"""The one training loop. Every technique switch is visible where it acts (`# technique:`).

`run(config)` builds the data, model and optimizer, hands them to accelerate
(which owns devices, mixed precision and gradient accumulation, on one CPU or
many GPUs alike), trains, evaluates and returns a RunResult. It emits plain
records to sinks and never draws. The device syncs only at log steps, where
`loss.item()` syncs anyway. Kernel > Interrupt (Ctrl-C) ends the run with status
'interrupted' and raises `RunInterrupted` (a KeyboardInterrupt, so a notebook's Run All
stops there) carrying the partial result, which `last_result()` also returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from typing import Any

from accelerate.utils import send_to_device

from workbench.base.arguments import flag, label
from workbench.core import custom
from workbench.core.config import RunConfig, run_config
from workbench.core.data.load import raise_held_interrupt
from workbench.core.engine import resume
from workbench.core.engine.accelerator import make_accelerator
from workbench.core.engine.ending import (
    Diverged,
    RunInterrupted,
    diverged_message,
    free,
    keep_partial,
    remember,
    untangle,
)
from workbench.core.engine.phases import LoopPhases
from workbench.core.engine.state import LoopState, LossWindow, evaluate
from workbench.core.measure import oom
from workbench.core.measure.counters import (
    SavedActivationCounter,
    gradient_bytes,
    optimizer_state_bytes,
    parameter_bytes,
)
from workbench.core.measure.flops import FlopCounter
from workbench.core.measure.heap import frozen_heap
from workbench.core.measure.meters import MemoryMeter
from workbench.core.measure.records import Sink, checked_sinks
from workbench.core.measure.result import RunResult
from workbench.core.models import loss_fn
from workbench.core.switches import CONVERTERS, compiling, data_loading, optimizer, precision, sharding, tf32
from workbench.machine import compile_cache, hardware


def _batches(accelerator, loader: Iterable, position: resume.DataPosition) -> Iterator[dict]:
    """Loop over the loader forever: runs are counted in optimizer steps. `position`
    follows the data order, so a saved run resumes at the very next batch."""
    while True:
        try:
            for batch in resume.epoch_loader(accelerator, loader, position):  # a new, seeded shuffle each epoch
                # technique: input pipeline. A Ctrl-C that came while workers forked was held (a
                # fork's hooks would swallow it); it is raised here, once the workers are up.
                raise_held_interrupt()
                position.batches_in_epoch += 1
                yield batch
        except Exception as error:
            # technique: input pipeline. torch re-raises a DataLoader worker's error from a frame
            # that keeps it in a local: a reference cycle that holds the loader's iterator until
            # the garbage collector runs, and a collected iterator takes ~10 s to stop its
            # workers. Clearing the finished frames frees it now: the workers stop at once.
            traceback.clear_frames(error.__traceback__)
            raise
        position.epoch, position.batches_in_epoch = position.epoch + 1, 0


def _checked(config: RunConfig, sinks: Iterable[Sink], name: str | None,
             keep_model: bool = False) -> tuple[RunConfig, list[Sink], str]:
    """The resolved config, the sinks (each able to hear a run) and the run's name, checked
    before anything is loaded."""
    cfg = run_config(config)
    flag("keep_model", keep_model)
    if name is not None:
        label("name", name, example="name='baseline'")  # a table, the text log and a legend can show it
    return cfg, checked_sinks(sinks), name or f"{custom.model_name(cfg.model)} {cfg.precision} b{cfg.batch_size}"


@dataclasses.dataclass(eq=False)
class _Run:
    """One run as `run()` builds it: what the loop trains with, and what it measures into."""

    cfg: RunConfig
    accelerator: Any
    meter: MemoryMeter
    state: LoopState  # the run's recorder: what it measured, the records the sinks hear, the result
    wall_start: float = dataclasses.field(default_factory=time.perf_counter)
    model: Any = None  # the prepared model: evaluation, saving, the result (the loop may train a compiled one)
    optimizer: Any = None
    status, message, eval_loss, accuracy, result = "ok", "", None, None, None  # how it ended: set by _ending

    @classmethod
    def begin(cls, cfg: RunConfig, name: str, sinks: list[Sink]) -> _Run:
        """The Accelerator (precision, accumulation and data loading act through it), the memory
        meter and the peak FLOP/s; no data and no model yet."""
        accelerator = make_accelerator(cfg)
        # MFU against the peak the matmuls can reach: with TF32 allowed, fp32 matmuls run on tensor cores.
        with tf32.matmuls(cfg.tf32):
            peak, source = hardware.peak_flops(accelerator.device.type, cfg.precision)
        meter = MemoryMeter(accelerator.device)
        state = LoopState(name=name, total_steps=cfg.steps, log_every=cfg.log_every, sinks=sinks, meter=meter,
                          device=accelerator.device.type, peak=peak, peak_source=source,
                          rank=accelerator.process_index, num_processes=accelerator.num_processes)
        r = cls(cfg, accelerator, meter, state)
        if r.meter.on_cuda:  # before this run allocates anything: what is there is someone else's
            r.state.held_before_bytes = r.meter.current_bytes()
        return r

    def build_result(self) -> RunResult:
        return self.state.result(config=self.cfg, status=self.status, message=self.message, eval_loss=self.eval_loss,
                                 accuracy=self.accuracy, optimizer=self.optimizer, wall_s=time.perf_counter() - self.wall_start,
                                 model=self.model if self.optimizer is not None else None)  # no breakdown before the optimizer

    @property
    def trained(self) -> bool:
        """Every step has trained: what fails after (evaluation, the last save, a view) keeps the model."""
        return self.optimizer is not None and self.state.step >= self.cfg.steps

    def ended_result(self) -> RunResult:
        """The result as the run ended. One that did not end 'ok' after every step trained (it failed
        or ran out of memory at evaluation, at the last save, in a view) holds the trained model
        (unwrapped, eval mode), whatever keep_model says: nothing trained is lost."""
        result = self.build_result()
        if self.status in ("ok", "diverged") or not self.trained:  # diverged: the weights are not usable
            return result
        return dataclasses.replace(result, model=self.accelerator.unwrap_model(self.model, keep_fp32_wrapper=False).eval())

    def failed(self, error: BaseException, message: str | None = None) -> None:
        """The run failed with `error`: its status, its message (`message`, else the error's
        first line), and its result kept on the error (`keep_partial`)."""
        after = f"after all {self.state.step} steps trained: " if self.trained else ""
        self.status, self.message = "failed", after + (message or f"{type(error).__name__}: {error}".splitlines()[0])
        keep_partial(self.ended_result, error)


def run(config: RunConfig, *, sinks: Iterable[Sink] = (), name: str | None = None,
        keep_model: bool = False, check_fit: Callable[[RunConfig], None] | None = None) -> RunResult:
    """Train one run and measure it. `keep_model=True` hands the trained model back in
    `result.model` (unwrapped, in eval mode), e.g. to quantize it; by default it is
    dropped so a notebook of many runs does not hold every model in memory. Your own
    module (`RunConfig(model=MyNet())`) is deep-copied first and the copy trains: it is
    never changed, and keep_model=True hands back the trained copy.

    Returns the RunResult of a finished run (status 'ok'), of one that ran out of memory
    ('oom': a real allocation failure or the simulated budget) and of one whose loss stopped
    being finite ('diverged', with the step). Raises `RunInterrupted` when interrupted,
    after every sink heard so; raises ConfigError before anything is allocated when the
    config cannot work here (its save folder holds another run, or `check_fit` refuses it: `wb.run`
    passes the planner's `check_fits`, which refuses a config that needs more memory than this
    machine has free); any other error is raised after the sinks heard
    'failed', with the partial result in `last_result()`.

    Example:
        >>> result = run(RunConfig(model="mlp", steps=20, preset="cpu-quick"), name="baseline")
        >>> result.status, len(result.losses) > 0
        ('ok', True)
    """
    cfg, sinks, name = _checked(config, sinks, name, keep_model)  # 1. resolve: every field checked
    if check_fit is not None:  # 2. check the fit: refused with the estimate and the fix, before anything is allocated
        check_fit(cfg)  # (the planner's check, passed in from above: the engine never imports the planner)
    r = _Run.begin(cfg, name, sinks)
    if config.epochs is not None and r.accelerator.num_processes > 1:
        # An epoch is one pass over the data by all processes together (resolved() counted one).
        r.cfg = cfg = dataclasses.replace(cfg, steps=max(1, -(-cfg.steps // r.accelerator.num_processes)))
        r.state.total_steps = cfg.steps
    with _ending(r):  # Ctrl-C, divergence, out of memory: a status; any other error: 'failed', raised
        trained, loader, saved = _build(r)  # 3. build: data, model, switches, optimizer, loader
        _tell_start(r, saved)
        _train_and_evaluate(r, trained, loader)  # 4. train
    return _finish(r, keep_model)  # 5. finish: the result


def _build(r: _Run) -> tuple[Any, Any, Any]:
    """The run's parts, each switch applied in the cell-by-cell order a learner would write them:
    (the module the loop trains, the data loader, the save it resumes from or None)."""
    cfg = r.cfg
    saved = _check_saving(r)
    bundle = custom.load_bundle(cfg)  # a built-in set, or your dataset (batches in the contract)
    r.state.text = bundle.tokens_per_sample is not None  # token ids in: tokens/s is shown
    r.bundle = bundle
    # Every arm of a comparison starts from the same weights (seeded as they are drawn). Your own
    # module: a deep copy trains (yours stays as it is), its forward checked on two samples first.
    r.model = model = custom.load_model(cfg, bundle)
    # The switches that convert the model, in switches.CONVERTERS' order, each a module of
    # workbench/core/switches: activation checkpointing (recompute blocks in backward), fused attention
    # ('sdpa'), memory format, train fewer parameters (freeze=, lora_rank=), QAT (Linear layers
    # fake-quantize), sharding (each process keeps ~1/N of the state): each returns the model it
    # changed, or the same.
    for switch in CONVERTERS:
        model = switch.apply(model, cfg)  # technique: every converter switch, in order
    r.model, r.optimizer = model, optimizer.apply(model, cfg)  # technique: fused / foreach optimizer, over what trains
    loader = data_loading.loader(bundle.train, cfg, bundle.collate_fn)  # technique: input pipeline
    # prepare() moves the model and wraps its forward in autocast for fp16/bf16 (technique: precision).
    r.model, r.optimizer = sharding.prepare(r.accelerator, model, r.optimizer, cfg)
    # Each process gets its share of the batches, left on the host: the loop times the fetch
    # alone, then copies the batch to the device itself (why: _train).
    loader = r.accelerator.prepare_data_loader(loader, device_placement=False)
    if saved:  # technique: save and resume. Model, optimizer, RNGs, data position, curve
        resume.restore(r.accelerator, saved, r.state, loader)
    if cfg.save_state_dir:  # before step 1: space on the disk for every save
        resume.check_disk_space(r.accelerator, cfg, r.state, r.model)
    # technique: torch.compile. The loop trains the compiled module (the first step compiles);
    # evaluation, saving and the result use the plain one, which holds the same parameters.
    return compiling.compile_model(r.model, cfg.compile), loader, saved


def _train_and_evaluate(r: _Run, trained: Any, loader: Any) -> None:
    """The steps, then the held-out evaluation (on the whole model when it was sharded)."""
    cfg = r.cfg
    with tf32.matmuls(cfg.tf32):  # technique: TF32 (CUDA fp32 matmuls on tensor cores), training only
        _train(r, trained, loader)
    r.state.train_peak_bytes = r.meter.peak_bytes()  # the steps' peak, before evaluation's
    if cfg.eval_samples:
        with sharding.whole(r.model, cfg):
            r.eval_loss, r.accuracy = evaluate(r.accelerator, r.model, r.bundle.test, cfg,
                                               collate_fn=r.bundle.collate_fn)


def _check_saving(r: _Run) -> Any:
    """technique: save and resume. The checkpoint and the save folder are checked before anything
    is loaded: a damaged file or another run's folder is named at once. The checkpoint, or None."""
    checkpoint = resume.check(r.accelerator, r.cfg, r.state) if r.cfg.resume_from else None
    if r.cfg.save_state_dir:
        resume.check_folder(r.accelerator, r.cfg, r.state, from_step=checkpoint.step if checkpoint else 0)
    return checkpoint


def _tell_start(r: _Run, checkpoint: Any) -> None:
    """Every sink hears the run start (the warnings: emulated precision, an inexact resume)."""
    cfg, device = r.cfg, r.accelerator.device
    notes = [hardware.emulation_warning(device.type, cfg.precision), *(checkpoint.notes if checkpoint else [])]
    r.state.start(precision=cfg.precision, config=cfg.to_dict(), warnings=tuple(w for w in notes if w))


@contextlib.contextmanager
def _ending(r: _Run) -> Iterator[None]:
    """How the run ended, as its status, and its result (`r.result`). Any other error: every sink
    that started hears 'failed', the partial result is kept (`last_result()`, the error's
    `.result`; after every step trained, with the trained model), and it is raised."""
    try:
        try:
            yield
        except KeyboardInterrupt:
            r.status, r.message = "interrupted", f"stopped by the user at step {r.state.step}"
        except Diverged as error:
            r.status, r.message = "diverged", str(error)
        except (RuntimeError, MemoryError) as error:  # torch.OutOfMemoryError is a RuntimeError
            if not oom.is_out_of_memory(error):
                raise
            r.status, r.message = "oom", oom.describe_out_of_memory(error)  # a real allocation failure or the budget
        r.result = r.ended_result()
    except BaseException as error:  # every sink that started hears how the run ended, whatever happened
        damaged = compile_cache.damaged_cache(error)  # a torch.compile cache file swapped or corrupted
        r.failed(damaged or error, message=str(damaged) if damaged else None)
        r.state.end("failed", r.message)
        if r.model is not None or r.optimizer is not None:  # refused before building anything: nothing to free
            free(r.accelerator)
        if damaged is not None:
            raise damaged from error
        raise


def _finish(r: _Run, keep_model: bool) -> RunResult:
    """The sinks hear the end; the result is remembered and returned (or raised, interrupted)."""
    result = r.result
    # An out-of-memory or Ctrl-C while setting up ends it before the sinks start: none hears the end.
    try:
        r.state.end(r.status, r.message, summary=result.summary())
    except BaseException as error:  # a view that fails at the end: the run it was showing is kept
        r.failed(error)
        raise
    remember(result)
    if r.status != "ok":
        free(r.accelerator)
        if r.status == "interrupted":
            raise RunInterrupted(result)
        return result
    plain = r.accelerator.unwrap_model(r.model, keep_fp32_wrapper=False)
    untangle(r.model, plain, r.optimizer)
    if keep_model:
        result = dataclasses.replace(result, model=plain.eval())
        remember(result)
    return result


def _train(r: _Run, model: Any, loader: Any) -> None:
    """Fetch, forward, backward, step; at log steps measure, and tell the sinks."""
    accelerator, state = r.accelerator, r.state
    model.train()
    state.begin()  # the memory peak and the clock from here on are this run's
    batches = _batches(accelerator, loader, state.data_position)
    window = LossWindow(accelerator.device)  # this interval's losses, kept on the device: no sync per step
    window_start = state.step + 1  # the optimizer step of the window's first micro-batch
    phases = LoopPhases()  # technique: profiler. Named ranges, only while a torch.profiler runs
    with frozen_heap():  # a kernel's whole heap is not scanned inside a timed step (measure/heap.py)
        _steps(r, model, batches, window, window_start, phases)
    phases.close()


def _steps(r: _Run, model: Any, batches: Any, window: LossWindow, window_start: int, phases: LoopPhases) -> None:
    """The loop itself, to the last step (or the error that stops it)."""
    cfg, accelerator, state, optimizer = r.cfg, r.accelerator, r.state, r.optimizer
    on_accelerator, timing = accelerator.device.type != "cpu", state.timing
    while state.step < cfg.steps:
        phases.enter("data")
        fetch_start = time.perf_counter()
        batch = next(batches)
        timing.add(samples=len(batch["labels"]), tokens=batch["inputs"].numel() if state.text else None,
                   wait_s=time.perf_counter() - fetch_start)
        # The copy to a GPU is not waiting for data: from pageable memory it is queued behind the
        # GPU's work so far and blocks the host until that is done. Timed as the data wait, it
        # read 70% on an H200 for a GPT whose host fetch took a few ms (GPU check, notebook 08).
        phases.enter("forward")
        if on_accelerator:  # on a CPU the batch is where it runs already: no per-step traversal
            batch = send_to_device(batch, accelerator.device)
        counted = state.step == 0  # the first optimizer step is counted exactly, and not timed
        # technique: gradient accumulation. Inside accumulate(), backward() divides the loss by
        # grad_accum_steps and optimizer.step() only acts (and DDP only all-reduces) on the last
        # micro-batch of each window.
        with accelerator.accumulate(model):
            with FlopCounter() if counted else nullcontext() as flops:
                with SavedActivationCounter(model) if counted else nullcontext() as saved:
                    logits = model(batch["inputs"])  # technique: precision (autocast inside)
                    loss = loss_fn(logits, batch["labels"])
                phases.enter("backward")
                accelerator.backward(loss)  # fp16: scales the loss first (GradScaler)
            phases.enter("optimizer")
            if accelerator.sync_gradients and cfg.max_grad_norm:
                accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)  # fp16: unscales first
            optimizer.step()
            if accelerator.sync_gradients:
                # fp16: the GradScaler skips an update whose gradients hold inf/NaN (and halves its
                # scale); it has synced to find out already, so reading this is free.
                state.skipped_steps += optimizer.step_was_skipped
                # = optimizer.zero_grad(set_to_none=True) at the end of a window; accelerate's
                # version inspects a signature on every call (110 us a step, measured).
                model.zero_grad(set_to_none=True)
        phases.enter("other")
        window.add(loss)
        if counted:
            state.counted(flops=flops.total, activation_bytes=saved.bytes)
        if not accelerator.sync_gradients:
            continue
        log_step = state.end_step(sync=loss.item)  # the counted: kept, not timed (loss.item() syncs)
        if counted:
            _check_budget(r, model)
        if not log_step:
            continue
        window_start = _log_step(r, window, window_start, phases=phases)
        state.restart_clock()  # the sinks' time and a save's are not a step's


def _check_budget(r: _Run, model: Any) -> None:
    """After the first optimizer step: the simulated memory budget."""
    if r.cfg.memory_budget_bytes is not None:
        # A simulated device memory (a CPU has none to run out of): the exact counts of this
        # step against the budget; over it, the torch.OutOfMemoryError a GPU raises.
        oom.check_budget(r.cfg.memory_budget_bytes, activation_bytes=r.state.activation_bytes or 0,
                         model_state_bytes=parameter_bytes(model) + gradient_bytes(model, expected=True)
                         + optimizer_state_bytes(r.optimizer))


def _log_step(r: _Run, window: LossWindow, window_start: int, *, phases: LoopPhases) -> int:
    """A log step: the only device sync in the loop (close() reads the window's figures once).
    Data parallel: every process's figures, so the loss is the whole global batch's. Returns
    the step the next window starts at."""
    cfg, state, accelerator = r.cfg, r.state, r.accelerator
    window_loss, finite, first_bad = window.close(accelerator.gather if accelerator.num_processes > 1 else None)
    if first_bad is not None and precision.stops_on(cfg.precision, finite):
        raise Diverged(diverged_message(cfg, window_start + first_bad // cfg.grad_accum_steps, state.step))
    phases.enter("log")
    # fp16: the loss is the mean of the finite losses (skipped steps left out); the scale, the GradScaler's now
    state.log(window_loss, lr=r.optimizer.param_groups[0]["lr"], loss_scale=precision.loss_scale(accelerator))
    if cfg.save_state_dir and (state.step % (cfg.save_every or cfg.steps) == 0 or state.step == cfg.steps):
        # technique: save and resume (at log steps: windows line up); a disk without space for the
        # weights and the optimizer's state is refused before a byte is written
        resume.save(accelerator, cfg, state, size=parameter_bytes(r.model) + optimizer_state_bytes(r.optimizer))
    return state.step + 1
