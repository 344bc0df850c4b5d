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
import gc
import time
import traceback
from collections.abc import Iterable, Iterator
from contextlib import nullcontext

import torch

from workbench.core import hardware
from workbench.core.config import RunConfig
from workbench.core.models import MODEL_SPECS, loss_fn
from workbench.core.optim import make_optimizer
from workbench.core.trainable import apply_trainable
from workbench.engine import resume
from workbench.engine.accelerator import loss_scale, make_accelerator
from workbench.engine.speedups import LoopPhases, compile_model, tf32_matmuls
from workbench.engine.sharding import gathered, shard_model
from workbench.engine.state import LoopState, build_result, evaluate
from workbench.measure import oom
from workbench.measure.counters import (
    FlopCounter,
    SavedActivationCounter,
    gradient_bytes,
    optimizer_state_bytes,
    parameter_bytes,
)
from workbench.measure.meters import IntervalMeter, MemoryMeter, Throughput, mfu
from workbench.measure.records import RunEnd, RunStart, Sink, StepRecord
from workbench.measure.result import RunResult


def _batches(accelerator, loader: Iterable, position: resume.DataPosition) -> Iterator[dict]:
    """Loop over the loader forever: runs are counted in optimizer steps. `position`
    follows the data order, so a saved run resumes at the very next batch."""
    while True:
        try:
            for batch in resume.epoch_loader(accelerator, loader, position):  # a new, seeded shuffle each epoch
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


_last_results: list[RunResult] = []


def last_result() -> RunResult | None:
    """The RunResult of the most recent run in this process, however it ended (None before any)."""
    return _last_results[-1] if _last_results else None


def remember(result: RunResult) -> None:
    """Make `result` what `last_result()` returns (run() and the monitor call it)."""
    _last_results[:] = [result]


def run(config: RunConfig, *, sinks: Iterable[Sink] = (), name: str | None = None,
        keep_model: bool = False) -> RunResult:
    """Train one run and measure it. `keep_model=True` hands the trained model back in
    `result.model` (unwrapped, in eval mode), e.g. to quantize it; by default it is
    dropped so a notebook of many runs does not hold every model in memory.

    Returns the RunResult of a finished run (status 'ok') or of one that ran out of
    memory ('oom'); raises `RunInterrupted` when interrupted, after every sink heard so.

    Example:
        >>> result = run(RunConfig(model="mlp", steps=20, preset="cpu-quick"), name="baseline")
        >>> result.status, len(result.losses) > 0
        ('ok', True)
    """
    from workbench.core.data import build_dataloader, load_data
    from workbench.core.models import build_model, set_activation_checkpointing, set_attention

    cfg = config.resolved()
    name = name or f"{cfg.model} {cfg.precision} b{cfg.batch_size}"
    sinks = list(sinks)

    wall_start = time.perf_counter()
    accelerator = make_accelerator(cfg)
    if config.epochs is not None and accelerator.num_processes > 1:
        # An epoch is one pass over the data by all processes together (resolved() counted one).
        cfg = dataclasses.replace(cfg, steps=max(1, -(-cfg.steps // accelerator.num_processes)))
    device = accelerator.device

    bundle = load_data(cfg.data, seq_len=cfg.seq_len or 128, max_test=cfg.eval_samples or None, seed=cfg.seed)
    # Every arm of a comparison starts from the same weights (seeded as they are drawn).
    model = build_model(cfg.model, data=bundle, dims=cfg.dims, seed=cfg.seed)
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
    )
    # prepare() moves the model and wraps its forward in autocast for fp16/bf16; the
    # GradScaler that accelerator.backward uses for fp16 was made with the Accelerator.
    if not sharded:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    else:  # not the model: accelerate would wrap it in DDP as well (on CPU it ignores its FSDP plugin)
        optimizer, loader = accelerator.prepare(optimizer, loader)
    state = LoopState()
    if cfg.resume_from:  # technique: save and resume. Model, optimizer, RNGs, data position, curve so far
        resume.restore(accelerator, cfg, state, loader)
    # technique: torch.compile. The loop trains the compiled module (the first step compiles);
    # evaluation, saving and the result use the plain one, which holds the same parameters, so
    # evaluation's other batch size and no-grad mode compile nothing more.
    trained = compile_model(model, cfg.compile)

    meter = MemoryMeter(device)
    warnings = tuple(w for w in [hardware.emulation_warning(device.type, cfg.precision)] if w)
    # MFU against the peak the matmuls can reach: with TF32 allowed, fp32 matmuls run on tensor cores.
    with tf32_matmuls(cfg.tf32):
        peak, peak_source = hardware.peak_flops(device.type, cfg.precision)
    start = RunStart(
        run_name=name, total_steps=cfg.steps, device=f"{device.type}", precision=cfg.precision,
        config=cfg.to_dict(), warnings=warnings, memory_total_bytes=meter.total_bytes(),
        rank=accelerator.process_index, peak_flops=peak, peak_flops_source=peak_source,
    )
    for sink in sinks:
        sink.start(start)

    status, message, eval_loss, accuracy = "ok", "", None, None
    try:
        try:
            with tf32_matmuls(cfg.tf32):  # technique: TF32 (CUDA fp32 matmuls on tensor cores), training only
                _train(cfg, name, accelerator, trained, optimizer, loader, meter, peak, sinks, state)
            if cfg.eval_samples:
                with gathered(model) if sharded else nullcontext():  # sharded: whole weights, no collective per batch
                    eval_loss, accuracy = evaluate(accelerator, model, bundle.test, cfg)
        except KeyboardInterrupt:
            status, message = "interrupted", f"stopped by the user at step {state.step}"
        except torch.OutOfMemoryError as error:
            status, message = "oom", str(error).splitlines()[0]
        result = build_result(
            cfg=cfg, name=name, status=status, message=message, state=state, model=model, optimizer=optimizer,
            meter=meter, peak=peak, peak_source=peak_source, eval_loss=eval_loss, accuracy=accuracy,
            device=device, warnings=warnings, wall_s=time.perf_counter() - wall_start,
            num_processes=accelerator.num_processes)
    except BaseException as error:  # every sink hears how the run ended, whatever happened
        failure = f"{type(error).__name__}: {error}".splitlines()[0]
        for sink in sinks:
            sink.end(RunEnd(run_name=name, status="failed", steps_done=state.step, message=failure,
                            rank=accelerator.process_index))
        _free(accelerator)
        raise
    for sink in sinks:
        sink.end(RunEnd(run_name=name, status=status, steps_done=state.step, message=message,
                        summary=result.summary(), rank=accelerator.process_index))
    remember(result)
    if status != "ok":
        _free(accelerator)
        if status == "interrupted":
            raise RunInterrupted(result)
    elif keep_model:
        result = dataclasses.replace(result, model=accelerator.unwrap_model(model, keep_fp32_wrapper=False).eval())
        remember(result)
    return result


def _train(cfg, name, accelerator, model, optimizer, loader, meter, peak, sinks, state) -> None:
    """Fetch, forward, backward, step; at log steps measure, and tell the sinks."""
    text = MODEL_SPECS[cfg.model].is_text
    model.train()
    meter.reset_peak()  # the peak from here on is this run's
    state.start_memory = meter.current_bytes()
    state.timing = timing = IntervalMeter(start=time.perf_counter(), first_step=state.step + 1,
                                          processes=accelerator.num_processes)
    batches = _batches(accelerator, loader, state.data_position)
    running_loss = torch.zeros((), device=accelerator.device)  # summed on the device: no sync per step
    micro_batches = probe_flops = 0
    phases = LoopPhases()  # technique: profiler. Named ranges, only while a torch.profiler runs

    while state.step < cfg.steps:
        phases.enter("data")
        fetch_start = time.perf_counter()
        batch = next(batches)
        timing.add(samples=len(batch["labels"]), tokens=batch["inputs"].numel() if text else None,
                   wait_s=time.perf_counter() - fetch_start)
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
        running_loss += loss.detach()
        micro_batches += 1
        if probe:
            probe_flops += flops.total
            if state.activation_bytes is None:  # one micro-batch's worth (a resumed run keeps its own)
                state.activation_bytes = saved.bytes
        if not accelerator.sync_gradients:
            continue
        state.step += 1
        if probe:
            state.flops_per_step = probe_flops
            state.first_step_s = timing.elapsed(now=time.perf_counter())  # with compile: the compile too
            if cfg.memory_budget_bytes is not None:
                # A simulated device memory (a CPU has none to run out of): the exact counts of this
                # step against the budget; over it, the torch.OutOfMemoryError a GPU raises.
                oom.check_budget(cfg.memory_budget_bytes, activation_bytes=state.activation_bytes or 0,
                                 model_state_bytes=parameter_bytes(model) + gradient_bytes(model, expected=True)
                                 + optimizer_state_bytes(optimizer))
        if state.step % cfg.log_every and state.step != cfg.steps:
            if probe:  # restart the clock after the probe: it ran the counters and one-off warm-up
                running_loss.item()  # a sync, so the probe's GPU work is not timed later
                timing.restart(now=time.perf_counter(), next_step=2)
            continue
        # Log step: the only device sync in the loop (.item() waits for the GPU).
        window_loss = running_loss / micro_batches
        if accelerator.num_processes > 1:  # data parallel: the loss of the whole global batch
            window_loss = accelerator.reduce(window_loss, reduction="mean")
        state.losses.append(window_loss.item())
        state.loss_steps.append(state.step)
        running_loss.zero_()
        micro_batches = 0
        interval = timing.close(now=time.perf_counter(), step=state.step, flops_per_step=state.flops_per_step,
                                timed=not probe, text=text)  # the probe step is shown, not timed
        phases.enter("log")
        if (scale := loss_scale(accelerator)) is not None:  # fp16: the GradScaler's scale now
            state.loss_scales.append(scale)
        record = _step_record(cfg, name, state, interval, meter, peak, optimizer, accelerator, scale, text)
        for sink in sinks:
            sink.log(record)
        if cfg.save_state_dir and (state.step % (cfg.save_every or cfg.steps) == 0 or state.step == cfg.steps):
            resume.save(accelerator, cfg, state)  # technique: save and resume (at log steps: windows line up)
        timing.restart(now=time.perf_counter(), next_step=state.step + 1)  # the sinks' time is not a step's
    phases.close()


def _step_record(cfg, name, state, interval: Throughput, meter, peak, optimizer, accelerator, scale, text) -> StepRecord:
    """What a log step tells the sinks: the last interval, the run's means so far, memory."""
    timing = state.timing
    group_peak = peak and peak * accelerator.num_processes  # MFU of the whole group: all processes' FLOPs
    mean = timing.run_rates(flops_per_step=state.flops_per_step, text=text)
    return StepRecord(
        run_name=name, step=state.step, total_steps=cfg.steps, loss=state.losses[-1],
        elapsed_s=timing.timed_seconds, step_time_s=interval.step_time_s,
        samples_per_sec=interval.samples_per_sec, tokens_per_sec=interval.tokens_per_sec,
        tflops_per_sec=interval.tflops_per_sec, mfu=mfu(interval.tflops_per_sec, group_peak),
        mean_step_time_s=mean and mean.step_time_s, mean_samples_per_sec=mean and mean.samples_per_sec,
        mean_tokens_per_sec=mean and mean.tokens_per_sec, mean_mfu=mean and mfu(mean.tflops_per_sec, group_peak),
        memory_bytes=meter.current_bytes(), memory_peak_bytes=meter.peak_bytes(),
        memory_reserved_bytes=meter.reserved_bytes(), memory_kind=meter.kind,
        activation_bytes=state.activation_bytes, data_wait_s=timing.last_wait_s_per_step,
        lr=optimizer.param_groups[0]["lr"], rank=accelerator.process_index,
        extra={} if scale is None else {"loss_scale": scale, "skipped_steps": state.skipped_steps},
    )


def _free(accelerator) -> None:
    """Give memory back after a failed run so the kernel stays usable."""
    accelerator.free_memory()
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
