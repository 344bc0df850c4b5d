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

import dataclasses
import time
import traceback
from collections.abc import Iterable, Iterator
from contextlib import nullcontext

from workbench.core import custom, hardware
from workbench.core.config import RunConfig
from workbench.core.models import loss_fn
from workbench.core.optim import make_optimizer
from workbench.core.trainable import apply_trainable
from workbench.engine import resume
from workbench.engine.accelerator import loss_scale, make_accelerator
from workbench.engine.ending import (
    Diverged,
    RunInterrupted,
    diverged_message,
    free,
    keep_partial,
    remember,
    untangle,
)
from workbench.engine.sharding import gathered, shard_model
from workbench.engine.speedups import LoopPhases, compile_model, tf32_matmuls
from workbench.engine.state import LoopState, LossWindow, evaluate
from workbench.measure import oom
from workbench.measure.counters import (
    SavedActivationCounter,
    gradient_bytes,
    optimizer_state_bytes,
    parameter_bytes,
)
from workbench.measure.flops import FlopCounter
from workbench.measure.meters import MemoryMeter
from workbench.measure.records import Sink
from workbench.measure.result import RunResult


def _batches(accelerator, loader: Iterable, position: resume.DataPosition) -> Iterator[dict]:
    """Loop over the loader forever: runs are counted in optimizer steps. `position`
    follows the data order, so a saved run resumes at the very next batch."""
    from workbench.core.data.load import raise_held_interrupt

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


def _checked(sinks: Iterable[Sink], name: str | None) -> list[Sink]:
    """The sinks, each able to hear a run (checked before anything is loaded), and the name."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be text, got {type(name).__name__} {name!r}; pass e.g. name='baseline'")
    if isinstance(sinks, (str, bytes)) or not isinstance(sinks, Iterable):
        raise TypeError(f"sinks must be a list of sinks, got {type(sinks).__name__}; pass e.g. sinks=[TextSink()]")
    sinks = list(sinks)
    for i, sink in enumerate(sinks):
        if missing := [m for m in ("start", "log", "end") if not callable(getattr(sink, m, None))]:
            raise TypeError(f"sinks[{i}] ({type(sink).__name__}) has no {', '.join(missing)} method; a sink needs "
                            "start(), log() and end() (see workbench.measure.records.Sink)")
    return sinks


def run(config: RunConfig, *, sinks: Iterable[Sink] = (), name: str | None = None,
        keep_model: bool = False) -> RunResult:
    """Train one run and measure it. `keep_model=True` hands the trained model back in
    `result.model` (unwrapped, in eval mode), e.g. to quantize it; by default it is
    dropped so a notebook of many runs does not hold every model in memory. Your own
    module (`RunConfig(model=MyNet())`) is deep-copied first and the copy trains: it is
    never changed, and keep_model=True hands back the trained copy.

    Returns the RunResult of a finished run (status 'ok'), of one that ran out of memory
    ('oom': a real allocation failure or the simulated budget) and of one whose loss stopped
    being finite ('diverged', with the step). Raises `RunInterrupted` when interrupted,
    after every sink heard so; raises ConfigError before anything is allocated when the
    config cannot work here (e.g. it needs more memory than this machine has free, or its
    save folder holds another run); any other error is raised after the sinks heard
    'failed', with the partial result in `last_result()`.

    Example:
        >>> result = run(RunConfig(model="mlp", steps=20, preset="cpu-quick"), name="baseline")
        >>> result.status, len(result.losses) > 0
        ('ok', True)
    """
    from workbench.core.data import build_dataloader
    from workbench.core.models import (
        build_model,
        set_activation_checkpointing,
        set_attention,
    )
    from workbench.planner.fit import check_fits

    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a RunConfig, got {type(config).__name__}; pass e.g. RunConfig(model='mlp')")
    cfg = config.resolved()
    sinks = _checked(sinks, name)
    name = name or f"{custom.model_name(cfg.model)} {cfg.precision} b{cfg.batch_size}"
    check_fits(cfg)  # resources: refused with the estimate and the fix, before anything is allocated

    wall_start = time.perf_counter()
    accelerator = make_accelerator(cfg)
    if config.epochs is not None and accelerator.num_processes > 1:
        # An epoch is one pass over the data by all processes together (resolved() counted one).
        cfg = dataclasses.replace(cfg, steps=max(1, -(-cfg.steps // accelerator.num_processes)))
    device = accelerator.device
    meter = MemoryMeter(device)
    # MFU against the peak the matmuls can reach: with TF32 allowed, fp32 matmuls run on tensor cores.
    with tf32_matmuls(cfg.tf32):
        peak, peak_source = hardware.peak_flops(device.type, cfg.precision)
    state = LoopState(name=name, total_steps=cfg.steps, log_every=cfg.log_every, sinks=sinks, meter=meter,
                      device=device.type, peak=peak, peak_source=peak_source, rank=accelerator.process_index,
                      num_processes=accelerator.num_processes)  # the run's recorder
    if meter.on_cuda:  # before this run allocates anything: what is there is someone else's
        state.held_before_bytes = meter.current_bytes()
    model = optimizer = None
    status, message, eval_loss, accuracy = "ok", "", None, None

    def result_now() -> RunResult:
        return state.result(config=cfg, status=status, message=message, eval_loss=eval_loss, accuracy=accuracy,
                            model=model if optimizer is not None else None, optimizer=optimizer,
                            wall_s=time.perf_counter() - wall_start)

    try:
        try:
            # technique: save and resume. The checkpoint and the save folder are checked before
            # anything is loaded: a damaged file or another run's folder is named at once.
            checkpoint = resume.check(accelerator, cfg, state) if cfg.resume_from else None
            if cfg.save_state_dir:
                resume.check_folder(accelerator, cfg, state, from_step=checkpoint.step if checkpoint else 0)
            bundle = custom.load_bundle(cfg)  # a built-in set, or your dataset (batches in the contract)
            state.text = bundle.tokens_per_sample is not None  # token ids in: tokens/s is shown
            # Every arm of a comparison starts from the same weights (seeded as they are drawn). Your own
            # module: a deep copy trains (yours stays as it is), its forward checked on two samples first.
            model = (build_model(cfg.model, data=bundle, dims=cfg.dims, seed=cfg.seed) if isinstance(cfg.model, str)
                     else custom.checked_copy(cfg.model, bundle, seed=cfg.seed))
            set_activation_checkpointing(model, cfg.activation_checkpointing)  # technique: checkpointing
            set_attention(model, cfg.attention)  # technique: fused attention ('sdpa': F.scaled_dot_product_attention)
            # technique: train fewer parameters. A frozen parameter (freeze=, freeze_layers=) gets no
            # gradient and no optimizer state; LoRA (lora_rank=) freezes them all and adds small adapters.
            model = apply_trainable(model, cfg)
            if cfg.qat != "none":  # technique: QAT. Linear layers now fake-quantize in forward
                from workbench.engine.qat import prepare_qat

                prepare_qat(model, bits=int(cfg.qat.removeprefix("int")))
            sharded = cfg.sharding != "none"
            if sharded:  # technique: sharding. Each process keeps ~1/N of parameters, gradients, optimizer state
                model = shard_model(model)
            # technique: fused / foreach optimizer (cfg.optimizer_impl). The trainable parameters only (the
            # shards, when sharded).
            optimizer = make_optimizer(model, cfg)
            loader = build_dataloader(
                bundle.train, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed,
                num_workers=cfg.num_workers, pin_memory=cfg.pin_memory,  # technique: input pipeline
                prefetch_factor=cfg.prefetch_factor, persistent_workers=cfg.persistent_workers,
                collate_fn=bundle.collate_fn,
            )
            # prepare() moves the model and wraps its forward in autocast for fp16/bf16; the
            # GradScaler that accelerator.backward uses for fp16 was made with the Accelerator.
            if not sharded:
                model, optimizer = accelerator.prepare(model, optimizer)
            else:  # not the model: accelerate would wrap it in DDP as well (on CPU it ignores its FSDP plugin)
                optimizer = accelerator.prepare(optimizer)
            # Each process gets its share of the batches, left on the host: the loop times the fetch
            # alone, then copies the batch to the device itself (why: _train).
            loader = accelerator.prepare_data_loader(loader, device_placement=False)
            if checkpoint:  # technique: save and resume. Model, optimizer, RNGs, data position, curve
                resume.restore(accelerator, checkpoint, state, loader)
            if cfg.save_state_dir:  # before step 1: room on the disk for every save
                resume.check_room(accelerator, cfg, state, model)
            # technique: torch.compile. The loop trains the compiled module (the first step compiles);
            # evaluation, saving and the result use the plain one, which holds the same parameters, so
            # evaluation's other batch size and no-grad mode compile nothing more.
            trained = compile_model(model, cfg.compile)
            notes = [hardware.emulation_warning(device.type, cfg.precision), *(checkpoint.notes if checkpoint else [])]
            warnings = tuple(w for w in notes if w)  # a resume that cannot be exact says so here
            state.start(precision=cfg.precision, config=cfg.to_dict(), warnings=warnings)
            with tf32_matmuls(cfg.tf32):  # technique: TF32 (CUDA fp32 matmuls on tensor cores), training only
                _train(cfg, accelerator, trained, optimizer, loader, state)
            state.train_peak_bytes = meter.peak_bytes()  # the steps' peak, before evaluation's
            if cfg.eval_samples:
                with gathered(model) if sharded else nullcontext():  # sharded: whole weights, no collective per batch
                    eval_loss, accuracy = evaluate(accelerator, model, bundle.test, cfg, collate_fn=bundle.collate_fn)
        except KeyboardInterrupt:
            status, message = "interrupted", f"stopped by the user at step {state.step}"
        except Diverged as error:
            status, message = "diverged", str(error)
        except (RuntimeError, MemoryError) as error:  # torch.OutOfMemoryError is a RuntimeError
            if not oom.is_out_of_memory(error):
                raise
            status, message = "oom", oom.describe_out_of_memory(error)  # a real allocation failure or the budget
        result = result_now()
    except BaseException as error:  # every sink that started hears how the run ended, whatever happened
        status, message = "failed", f"{type(error).__name__}: {error}".splitlines()[0]
        state.end(status, message)
        keep_partial(result_now, error)
        if model is not None:  # refused before building anything: nothing to free (a collection costs ~1 s)
            free(accelerator)
        raise
    state.end(status, message, summary=result.summary())  # an OOM or Ctrl-C while setting up: no sink started
    remember(result)
    if status != "ok":
        free(accelerator)
        if status == "interrupted":
            raise RunInterrupted(result)
        return result
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    untangle(model, plain, optimizer)
    if keep_model:
        result = dataclasses.replace(result, model=plain.eval())
        remember(result)
    return result


def _train(cfg, accelerator, model, optimizer, loader, state) -> None:
    """Fetch, forward, backward, step; at log steps measure, and tell the sinks (the recorder, `state`)."""
    from accelerate.utils import send_to_device

    text = state.text
    on_accelerator = accelerator.device.type != "cpu"
    model.train()
    state.begin()  # the memory peak and the clock from here on are this run's
    timing = state.timing
    batches = _batches(accelerator, loader, state.data_position)
    window = LossWindow(accelerator.device)  # this interval's losses, kept on the device: no sync per step
    window_start = state.step + 1  # the optimizer step of the window's first micro-batch
    phases = LoopPhases()  # technique: profiler. Named ranges, only while a torch.profiler runs

    while state.step < cfg.steps:
        phases.enter("data")
        fetch_start = time.perf_counter()
        batch = next(batches)
        timing.add(samples=len(batch["labels"]), tokens=batch["inputs"].numel() if text else None,
                   wait_s=time.perf_counter() - fetch_start)
        # The copy to a GPU is not waiting for data: from pageable memory it is queued behind the
        # GPU's work so far and blocks the host until that is done. Timed as the data wait, it
        # read 70% on an H200 for a GPT whose host fetch took a few ms (GPU check, notebook 08).
        phases.enter("forward")
        if on_accelerator:  # on a CPU the batch is where it runs already: no per-step traversal
            batch = send_to_device(batch, accelerator.device)
        probe = state.step == 0  # the first optimizer step is counted exactly, and not timed
        # technique: gradient accumulation. Inside accumulate(), backward() divides the loss by
        # grad_accum_steps and optimizer.step() only acts (and DDP only all-reduces) on the last
        # micro-batch of each window.
        phases.enter("forward")
        with accelerator.accumulate(model):
            with FlopCounter() if probe else nullcontext() as flops:
                with SavedActivationCounter(model) if probe else nullcontext() as saved:
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
        if probe:
            state.probed(flops=flops.total, activation_bytes=saved.bytes)
        if not accelerator.sync_gradients:
            continue
        log_step = state.end_step(sync=loss.item)  # the probe: kept, not timed (loss.item() syncs)
        if probe and cfg.memory_budget_bytes is not None:
            # A simulated device memory (a CPU has none to run out of): the exact counts of this
            # step against the budget; over it, the torch.OutOfMemoryError a GPU raises.
            oom.check_budget(cfg.memory_budget_bytes, activation_bytes=state.activation_bytes or 0,
                             model_state_bytes=parameter_bytes(model) + gradient_bytes(model, expected=True)
                             + optimizer_state_bytes(optimizer))
        if not log_step:
            continue
        # Log step: the only device sync in the loop (close() reads the window's figures once).
        # Data parallel: every process's figures, so the loss is the whole global batch's.
        window_loss, finite, first_bad = window.close(accelerator.gather if accelerator.num_processes > 1 else None)
        if first_bad is not None and (cfg.precision != "fp16" or not finite):
            # A non-finite loss has poisoned the weights (fp32, bf16: the step applied it). In fp16
            # the GradScaler skips such steps, so only a window with no finite loss at all stops it.
            raise Diverged(diverged_message(cfg, window_start + first_bad // cfg.grad_accum_steps, state.step))
        window_start = state.step + 1
        phases.enter("log")
        # fp16: the loss is the mean of the finite losses (skipped steps left out); the scale, the GradScaler's now
        state.log(window_loss, lr=optimizer.param_groups[0]["lr"], loss_scale=loss_scale(accelerator))
        if cfg.save_state_dir and (state.step % (cfg.save_every or cfg.steps) == 0 or state.step == cfg.steps):
            resume.save(accelerator, cfg, state)  # technique: save and resume (at log steps: windows line up)
        state.restart_clock()  # the sinks' time and a save's are not a step's
    phases.close()

