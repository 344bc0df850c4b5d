"""run(): the one loop trains, measures exactly where it can, and fails cleanly."""

import contextlib

import pytest
import torch

import workbench as wb
from workbench import RunConfig, run
from workbench.core.views.sinks import RecordingSink

TINY = dict(model="mlp", data="digits", batch_size=32, steps=12, log_every=4, dims={"hidden": (32,)}, eval_samples=100)


class _RaiseAtStep:
    """A sink that raises `error` when step `at` is logged: a failure mid-run."""

    def __init__(self, error: BaseException, at: int) -> None:
        self.error, self.at = error, at

    def start(self, record): ...

    def log(self, record):
        if record.step >= self.at:
            raise self.error

    def end(self, record): ...


def test_run_trains_and_reports_every_log_step():
    sink = RecordingSink()
    result = run(RunConfig(**TINY), sinks=[sink], name="tiny")
    assert result.status == "ok" and result.steps_done == 12
    assert [r.step for r in sink.steps] == [4, 8, 12] == result.loss_steps
    assert result.losses[-1] < result.losses[0]
    assert len(sink.starts) == 1 and sink.ends[0].status == "ok"
    assert result.samples_per_sec > 0 and result.step_time_s > 0
    assert 0.0 <= result.accuracy <= 1.0


def test_memory_breakdown_is_exact_for_adamw():
    result = run(RunConfig(**TINY), sinks=[], name="tiny")
    n = 64 * 32 + 32 + 32 * 10 + 10  # Linear(64, 32) and Linear(32, 10)
    m = result.memory
    assert m.parameter_bytes == m.gradient_bytes == 4 * n
    # AdamW: exp_avg and exp_avg_sq per parameter, plus a scalar fp32 step per tensor.
    assert m.optimizer_state_bytes == 2 * 4 * n + 4 * 4
    # Saved for backward, one micro-batch of 32: the first matmul saves its input
    # (the flattened images, 32x64); ReLU saves its output (32x32), which the second
    # matmul saves again as its input (same storage: counted once); cross-entropy
    # saves its log-softmax (32x10), the int64 labels (32) and a scalar fp32 weight total.
    assert m.activation_bytes == 4 * (32 * 64 + 32 * 32 + 32 * 10) + 8 * 32 + 4

def test_flops_per_step_count_forward_and_backward():
    result = run(RunConfig(**TINY), sinks=[], name="tiny")
    matmul_params = 64 * 32 + 32 * 10
    # 2 FLOPs per multiply-add forward, twice that backward, less the input gradient
    # of the first layer (the data needs none).
    assert result.flops_per_step == 32 * (6 * matmul_params - 2 * 64 * 32)


def test_gradient_accumulation_counts_optimizer_steps_not_micro_batches():
    sink = RecordingSink()
    result = run(RunConfig(**{**TINY, "grad_accum_steps": 3, "steps": 4, "log_every": 1}), sinks=[sink], name="acc")
    assert result.steps_done == 4 and [r.step for r in sink.steps] == [1, 2, 3, 4]
    plain = run(RunConfig(**{**TINY, "steps": 1}), sinks=[], name="plain")
    assert result.flops_per_step == 3 * plain.flops_per_step


def test_same_seed_gives_the_same_loss_curve():
    a = run(RunConfig(**TINY), sinks=[], name="a")
    b = run(RunConfig(**TINY), sinks=[], name="b")
    assert a.losses == b.losses


def test_a_failing_run_reports_and_leaves_the_process_usable():
    sink = RecordingSink()
    with pytest.raises(RuntimeError, match="boom"):
        run(RunConfig(**TINY), sinks=[sink, _RaiseAtStep(RuntimeError("boom"), at=4)], name="bad")
    assert sink.ends[-1].status == "failed" and sink.ends[-1].message == "RuntimeError: boom"
    assert run(RunConfig(**TINY), sinks=[], name="after").status == "ok"


def test_an_interrupt_stops_the_caller_and_keeps_the_partial_curve_reachable():
    sink = RecordingSink()
    # A KeyboardInterrupt, so a notebook's queued cells (Run All) stop here too.
    with pytest.raises(KeyboardInterrupt) as stopped:
        run(RunConfig(**TINY), sinks=[sink, _RaiseAtStep(KeyboardInterrupt(), at=8)], name="stopped")
    assert isinstance(stopped.value, wb.RunInterrupted) and "workbench.last_result()" in str(stopped.value)
    result = stopped.value.result
    assert result is wb.last_result()
    assert result.status == "interrupted" and result.steps_done == 8
    assert result.loss_steps == [4, 8] and result.accuracy is None
    assert sink.ends[-1].status == "interrupted" and sink.ends[-1].message == "stopped by the user at step 8"
    assert run(RunConfig(**TINY), sinks=[], name="after").status == "ok"  # the process stays usable
    assert wb.last_result().name == "after"


def test_an_out_of_memory_error_becomes_an_oom_result():
    result = run(RunConfig(**TINY), sinks=[_RaiseAtStep(torch.OutOfMemoryError("CUDA out of memory. Tried"), at=4)], name="oom")
    assert result.status == "oom" and result.message.startswith("CUDA out of memory")


def test_gpt_runs_with_checkpointing_and_saves_fewer_activation_bytes():
    base = dict(model="gpt", steps=2, log_every=1, eval_samples=16, batch_size=2, seq_len=32)
    plain = run(RunConfig(**base), sinks=[], name="plain")
    ckpt = run(RunConfig(**base, activation_checkpointing="all"), sinks=[], name="ckpt")
    assert ckpt.memory.activation_bytes < 0.4 * plain.memory.activation_bytes
    assert ckpt.flops_per_step > plain.flops_per_step  # the recompute
    assert plain.tokens_per_sec > 0


def test_bf16_autocast_runs_on_cpu_and_warns_when_emulated():
    from workbench.machine import hardware

    result = run(RunConfig(**{**TINY, "precision": "bf16", "steps": 2, "log_every": 1}), sinks=[], name="bf16")
    assert result.status == "ok"
    if hardware.precision_support("cpu", "bf16") == "emulated":
        assert any("emulated" in w for w in result.warnings)


# The 12-layer GPT with every block checkpointed (its first step peaked +85% when
# run() counted FLOPs under FlopCounterMode, whose module tracker keeps recomputed activations).
DEEP = dict(model="gpt", dims={"n_layer": 12, "n_head": 4, "d_model": 48}, seq_len=40, batch_size=6,
            activation_checkpointing="all")


def test_the_first_step_counted_for_flops_peaks_no_higher_than_the_steps_after_it():
    from workbench.lessons.planner import measure_step_peak

    first, second, third = measure_step_peak(RunConfig(**DEEP), steps=3).tensor_bytes
    # Step 1 counts FLOPs and saved bytes and only makes the optimizer state at its end; later
    # steps hold that state all along: so they, not the counted step, peak higher.
    assert first < second == third


def test_flop_counter_leaves_a_checkpointed_steps_peak_as_it_is_and_counts_like_flopcountermode():
    from torch.utils.flop_counter import FlopCounterMode

    from workbench.core.measure.flops import FlopCounter
    from workbench.core.models import GPT, loss_fn
    from workbench.core.switches.activation_checkpointing import set_activation_checkpointing
    from workbench.planner.live import LiveTensors

    torch.manual_seed(0)
    model = set_activation_checkpointing(GPT(256, 40, n_layer=12, n_head=4, d_model=48), "all")
    x = torch.randint(0, 256, (6, 40))

    def step(counter=None) -> tuple[int, int]:
        live = LiveTensors()
        with live, counter or contextlib.nullcontext():
            loss_fn(model(x), x).backward()
        model.zero_grad(set_to_none=True)
        return live.peak_bytes, 0 if counter is None else getattr(counter, "total", None) or counter.get_total_flops()

    plain, _ = step()
    counted, flops = step(FlopCounter())
    tracked, reference = step(FlopCounterMode(display=False))
    assert counted == plain and flops == reference  # same FLOPs, and the peak untouched
    assert tracked > 2 * plain  # FlopCounterMode's module tracker holds the recompute (9.0 MB vs 3.9)
    result = run(RunConfig(**DEEP, steps=1, eval_samples=0), sinks=[])
    assert result.flops_per_step == reference  # run()'s counted first step: what FlopCounterMode counts


class _PeakAtLastStep:
    """A sink that reads the live-tensor peak when the last step is logged: training's alone."""

    def __init__(self, live, steps: int) -> None:
        self.live, self.steps, self.training_peak = live, steps, None

    def start(self, record): ...

    def log(self, record):
        if record.step == self.steps:
            self.training_peak = self.live.peak_bytes

    def end(self, record): ...


@pytest.mark.parametrize("changes", [
    dict(model="gpt", batch_size=2, preset="cpu-quick"),
    dict(model="gpt", batch_size=2, preset="cpu-quick", precision="bf16", activation_checkpointing="all"),
    dict(model="cnn", batch_size=4, preset="cpu-quick"),
])
def test_evaluation_never_peaks_above_the_training_steps_it_follows(changes):
    # A run sized to fit must not run out of memory in its evaluation. At 64 sequences it did on
    # paper: on an H200 notebook 07's 4 x 4 plan peaked in its fp32 evaluation, 1.25x its steps.
    import gc

    from workbench.planner.live import LiveTensors

    cfg = RunConfig(**changes, steps=2, log_every=1, eval_samples=200)
    run(cfg, sinks=[], name="warm-up")  # data loaded and cached outside the tracking
    live = LiveTensors()
    sink = _PeakAtLastStep(live, steps=2)
    gc.collect()
    gc.disable()  # tensors freed by reference counts alone: the peaks are the same every run
    try:
        with live:
            result = run(cfg, sinks=[sink], name="tracked")
    finally:
        gc.enable()
    assert result.status == "ok" and result.accuracy is not None
    assert sink.training_peak and live.peak_bytes == sink.training_peak


def test_on_a_gpu_the_peak_is_the_runs_own_and_leaves_out_what_was_there_before():
    from workbench.core.measure.recorder import Recorder

    class Meter:  # a GPU meter as run() reads it: allocator peak 5,000; 1,200 allocated before the run
        on_cuda = True
        peak_kind = "CUDA allocator peak"

        def peak_bytes(self):
            return 5_000

    model = torch.nn.Linear(4, 2)
    state = Recorder(name="gpu", total_steps=1, log_every=1, sinks=[], meter=Meter(), device="cuda")
    state.held_before_bytes, state.train_peak_bytes, state.start_memory = 1_200, 4_600, 1_300
    result = state.result(config=RunConfig(model="mlp").resolved(), status="ok", message="", model=model,
                          optimizer=torch.optim.SGD(model.parameters()), wall_s=1.0)
    # the steps' peak (read before evaluation), less what others held: estimate() predicts that
    assert result.memory.peak_bytes == 4_600 - 1_200 and result.memory.held_before_bytes == 1_200
    assert result.memory.peak_increase_bytes == 4_600 - 1_300


@pytest.mark.parametrize("changes", [
    dict(model="mlp", precision="fp16"),
    dict(model="mlp", precision="bf16", keep_model=True),
    dict(model="gpt", precision="fp16", activation_checkpointing="every_other", grad_accum_steps=2),
    dict(model="gpt", precision="bf16", max_grad_norm=1.0),
])
def test_a_finished_run_frees_its_model_and_optimizer_state_without_waiting_for_a_collection(changes):
    # accelerate's autocast forward (a bound method of the model in its own __dict__) and its
    # GradScaler step patches are reference cycles: before run() broke them, a fp16 MLP run left
    # its model and Adam state (3,231,896 bytes) alive until the next collection; on an H200 the
    # next run of notebook 01 started with ~1 GiB of the last one's still allocated.
    import gc

    from workbench.planner.live import LiveTensors

    keep = changes.pop("keep_model", False)
    cfg = RunConfig(**changes, preset="cpu-quick", steps=2, log_every=1, eval_samples=50)
    run(cfg, sinks=[])  # data loaded and cached outside the tracking
    live = LiveTensors()
    gc.collect()
    gc.disable()
    try:
        with live:
            result = run(cfg, sinks=[], keep_model=keep)
            kept = sum(p.numel() * p.element_size() for p in result.model.parameters()) if keep else 0
            assert live.current_bytes == kept  # the kept model's weights, nothing else
            if keep:  # the model handed back runs its own (fp32) forward
                assert "forward" not in vars(result.model)
    finally:
        gc.enable()


def test_a_result_built_after_an_interrupt_between_a_losss_two_appends_holds_whole_points():
    # The kernel's KeyboardInterrupt can land between Recorder.log's two appends (the loss plot's
    # `Curve.add` failed so in CI: b39e02d): the partial result must pair every step with its loss,
    # or wb.compare's plot of it fails with "x and y must have same first dimension".
    from workbench.core.measure.meters import MemoryMeter
    from workbench.core.measure.recorder import IntervalMeter, Recorder

    class InterruptedOnce(list):
        def append(self, value):
            if len(self) == 2:
                raise KeyboardInterrupt
            super().append(value)

    state = Recorder(name="cut", total_steps=5, log_every=1, sinks=[], meter=MemoryMeter("cpu"), device="cpu")
    state.loss_steps, state.timing = InterruptedOnce(), IntervalMeter(start=0.0, first_step=1)
    with pytest.raises(KeyboardInterrupt):
        for step, loss in enumerate((2.0, 1.5, 1.25), start=1):
            state.step = step
            state.log(loss, lr=None)
    assert (len(state.losses), len(state.loss_steps)) == (3, 2)
    result = state.result(config=RunConfig(model="mlp").resolved(), status="interrupted", message="", wall_s=1.0)
    assert (result.loss_steps, result.losses) == ([1, 2], [2.0, 1.5])
