"""The one training loop. Every technique switch is visible where it acts.

`run(config)` builds the data, model and optimizer, hands them to accelerate
(which owns devices, mixed precision and gradient accumulation, on one CPU or
many GPUs alike), trains, evaluates and returns a RunResult. It emits plain
records to sinks and never draws. The device syncs only at log steps, where
`loss.item()` syncs anyway.
"""

from __future__ import annotations

import dataclasses
import gc
import time
import traceback
from collections.abc import Iterable, Iterator
from contextlib import nullcontext

import torch
from torch.utils.flop_counter import FlopCounterMode

from workbench.core import hardware
from workbench.core.config import RunConfig
from workbench.core.models import loss_fn
from workbench.core.optim import make_optimizer
from workbench.engine import resume
from workbench.engine.accelerator import loss_scale, make_accelerator
from workbench.engine.state import LoopState, build_result, evaluate
from workbench.measure import oom
from workbench.measure.counters import SavedActivationCounter, gradient_bytes, optimizer_state_bytes, parameter_bytes
from workbench.measure.meters import MemoryMeter, Throughput, mfu
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


def run(config: RunConfig, *, sinks: Iterable[Sink] = (), name: str | None = None,
        keep_model: bool = False) -> RunResult:
    """Train one run and measure it. `keep_model=True` hands the trained model back in
    `result.model` (unwrapped, in eval mode), e.g. to quantize it; by default it is
    dropped so a notebook of many runs does not hold every model in memory.

    Example:
        >>> result = run(RunConfig(model="mlp", steps=20, preset="cpu-quick"), name="baseline")
        >>> result.status, len(result.losses) > 0
        ('ok', True)
    """
    from workbench.core.data import build_dataloader, load_data
    from workbench.core.models import build_model, set_activation_checkpointing

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
    if cfg.qat != "none":  # technique: QAT. Linear layers now fake-quantize in forward
        from workbench.engine.qat import prepare_qat

        prepare_qat(model, bits=int(cfg.qat.removeprefix("int")))
    optimizer = make_optimizer(model, cfg)
    loader = build_dataloader(
        bundle.train, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed,
        num_workers=cfg.num_workers, pin_memory=cfg.pin_memory,  # technique: input pipeline
        prefetch_factor=cfg.prefetch_factor, persistent_workers=cfg.persistent_workers,
    )
    # prepare() moves the model and wraps its forward in autocast for fp16/bf16; the
    # GradScaler that accelerator.backward uses for fp16 was made with the Accelerator.
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    state = LoopState()
    if cfg.resume_from:  # technique: save and resume. Model, optimizer, RNGs, data position, curve so far
        resume.restore(accelerator, cfg, state, loader)

    meter = MemoryMeter(device)
    warnings = tuple(w for w in [hardware.emulation_warning(device.type, cfg.precision)] if w)
    peak, peak_source = hardware.peak_flops(device.type, cfg.precision)
    start = RunStart(
        run_name=name, total_steps=cfg.steps, device=f"{device.type}", precision=cfg.precision,
        config=cfg.to_dict(), warnings=warnings, memory_total_bytes=meter.total_bytes(),
        rank=accelerator.process_index,
    )
    for sink in sinks:
        sink.start(start)

    status, message = "ok", ""
    try:
        try:
            _train(cfg, name, accelerator, model, optimizer, loader, meter, peak, sinks, state)
        except KeyboardInterrupt:
            status, message = "interrupted", f"stopped by the user at step {state.step}"
        except torch.OutOfMemoryError as error:
            status, message = "oom", str(error).splitlines()[0]
        eval_loss = accuracy = None
        if status == "ok" and cfg.eval_samples:
            eval_loss, accuracy = evaluate(accelerator, model, bundle.test, cfg)
        result = build_result(cfg, name, status, message, state, model, optimizer, meter, peak,
                              peak_source, eval_loss, accuracy, device, warnings, wall_start,
                              accelerator.num_processes)
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
    if status != "ok":
        _free(accelerator)
    elif keep_model:
        result = dataclasses.replace(result, model=accelerator.unwrap_model(model, keep_fp32_wrapper=False).eval())
    return result


def _train(cfg, name, accelerator, model, optimizer, loader, meter, peak, sinks, state) -> None:
    is_text = cfg.model in ("gpt", "minilm")
    model.train()
    meter.reset_peak()  # the peak from here on is this run's
    state.start_memory = meter.current_bytes()
    batches = _batches(accelerator, loader, state.data_position)
    running_loss = torch.zeros((), device=accelerator.device)  # summed on device: no sync per step
    micro_in_window = 0
    samples = tokens = 0
    wait = 0.0
    flops = 0
    interval_start = time.perf_counter()
    interval_first_step = state.step + 1  # 1, or the step after the last of a resumed run

    while state.step < cfg.steps:
        fetch_start = time.perf_counter()
        batch = next(batches)
        wait += time.perf_counter() - fetch_start
        probe = state.step == 0  # the first optimizer step is measured exactly, and not timed
        # technique: gradient accumulation. Inside accumulate(), backward() divides
        # the loss by grad_accum_steps and optimizer.step() only acts (and DDP only
        # all-reduces) on the last micro-batch of each window.
        with accelerator.accumulate(model):
            with FlopCounterMode(display=False) if probe else nullcontext() as flop_counter:
                with SavedActivationCounter(model) if probe else nullcontext() as saved:
                    logits = model(batch["inputs"])  # technique: precision (autocast inside)
                    loss = loss_fn(logits, batch["labels"])
                accelerator.backward(loss)  # scales the loss first under fp16 (GradScaler)
            if probe:
                if state.activation_bytes is None:  # one micro-batch's worth
                    state.activation_bytes = saved.bytes
                flops += flop_counter.get_total_flops()
            if accelerator.sync_gradients and cfg.max_grad_norm:
                accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            # fp16: the GradScaler skips an update whose gradients hold inf/NaN (and
            # halves its scale). It has synced to find out already, so reading is free.
            if accelerator.sync_gradients:
                state.skipped_steps += optimizer.step_was_skipped
                # The same as optimizer.zero_grad(set_to_none=True) at the end of a window;
                # accelerate's version inspects a signature on every call (110 us a step,
                # measured: 1.5% of a small model's step).
                model.zero_grad(set_to_none=True)
        running_loss += loss.detach()
        micro_in_window += 1
        samples += batch["labels"].shape[0]
        if is_text:
            tokens += batch["inputs"].numel()
        if not accelerator.sync_gradients:
            continue
        state.step += 1
        if probe:
            state.flops_per_step = flops
            if cfg.memory_budget_bytes is not None:
                # A simulated device memory (a CPU has none to run out of): the exact counts
                # of this step against the budget; over it, the same torch.OutOfMemoryError
                # a GPU raises, so run() ends it through the same 'oom' path.
                oom.check_budget(cfg.memory_budget_bytes, activation_bytes=state.activation_bytes or 0,
                                 model_state_bytes=parameter_bytes(model) + gradient_bytes(model, expected=True)
                                 + optimizer_state_bytes(optimizer))
        is_log_step = state.step % cfg.log_every == 0 or state.step == cfg.steps
        if probe and not is_log_step:
            # Restart the clock after the probe step: it carries the counters'
            # overhead and one-off warm-up (allocator, kernel selection).
            running_loss.item()  # sync, so the probe's GPU work is not timed later
            interval_start, interval_first_step = time.perf_counter(), 2
            samples = tokens = 0
            wait = 0.0
        if not is_log_step:
            continue
        # Log step: the only device sync in the loop (.item() waits for the GPU).
        window_loss = running_loss / micro_in_window
        if accelerator.num_processes > 1:  # data parallel: the loss of the whole global batch
            window_loss = accelerator.reduce(window_loss, reduction="mean")
        mean_loss = window_loss.item()
        running_loss.zero_()
        micro_in_window = 0
        now = time.perf_counter()
        steps_in_interval = state.step - interval_first_step + 1
        state.loss_steps.append(state.step)
        state.losses.append(mean_loss)
        scale = loss_scale(accelerator)  # fp16 only: the GradScaler's scale now
        if scale is not None:
            state.loss_scales.append(scale)
        rates = Throughput.over(seconds=now - interval_start, steps=steps_in_interval,
                                samples=samples * accelerator.num_processes,
                                tokens=tokens * accelerator.num_processes if is_text else None,
                                flops=(state.flops_per_step or 0) * steps_in_interval * accelerator.num_processes or None)
        if not probe:  # the probe step is shown, but kept out of the run's timings
            state.interval_times.append(rates.step_time_s)
            state.timed_seconds += now - interval_start
            state.timed_steps += steps_in_interval
            state.timed_samples += samples * accelerator.num_processes  # all ranks' samples
            state.timed_tokens += tokens * accelerator.num_processes
            state.data_wait_s += wait
        record = StepRecord(
            run_name=name, step=state.step, total_steps=cfg.steps, loss=mean_loss,
            elapsed_s=state.timed_seconds, step_time_s=rates.step_time_s,
            samples_per_sec=rates.samples_per_sec, tokens_per_sec=rates.tokens_per_sec,
            tflops_per_sec=rates.tflops_per_sec, mfu=mfu(rates.tflops_per_sec, peak),
            memory_bytes=meter.current_bytes(), memory_peak_bytes=meter.peak_bytes(),
            memory_reserved_bytes=meter.reserved_bytes(), memory_kind=meter.kind,
            activation_bytes=state.activation_bytes, data_wait_s=wait / steps_in_interval,
            lr=optimizer.param_groups[0]["lr"], rank=accelerator.process_index,
            extra={} if scale is None else {"loss_scale": scale, "skipped_steps": state.skipped_steps},
        )
        for sink in sinks:
            sink.log(record)
        if cfg.save_state_dir and (state.step % (cfg.save_every or cfg.steps) == 0 or state.step == cfg.steps):
            resume.save(accelerator, cfg, state)  # technique: save and resume (at log steps: windows line up)
        interval_start, interval_first_step = time.perf_counter(), state.step + 1
        samples = tokens = 0
        wait = 0.0


def _free(accelerator) -> None:
    """Give memory back after a failed run so the kernel stays usable."""
    accelerator.free_memory()
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
