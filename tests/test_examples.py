"""Every take-home script in examples/ runs without the workbench and computes what the course's runs do.

Each example runs as a learner runs it at work: as __main__ in a Python of its own (or, for those
that leave no process-wide state, one after another in one; see SHARED), `workbench` not importable
(blocked in sys.modules before the script starts, so an import of it fails at once), from a folder
outside the repository. Its losses (printed in full as its last line) are held equal to `wb.run` of
the same configuration, exactly where the arithmetic is the same; a tolerance, with its reason,
where it is not. A technique with no RunConfig switch is held to wb.run without it (tensor and
pipeline parallelism: the same step split up) or to the example's own baseline (int8, compile).

Sizes are tiny (one block of width 32, 3 steps): the arithmetic is the same at any size, and the
whole file must cost about a minute of CPU (measured: 35 CPU-seconds with inductor's cache warm).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import workbench as wb
from workbench.core.views.sinks import RecordingSink

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TINY = ["--steps", "3", "--batch-size", "4", "--seq-len", "16", "--layers", "1", "--heads", "2", "--d-model", "32"]
# The same run as a RunConfig: the GPT on the reviews' bytes, AdamW at 1e-3, seed 0, every step logged.
CONFIG = wb.RunConfig(model="gpt", data="rotten_tomatoes_lm", steps=3, batch_size=4, seq_len=16,
                      dims={"n_layer": 1, "n_head": 2, "d_model": 32}, lr=1e-3, seed=0, log_every=1,
                      eval_samples=0, device="cpu", preset="cpu-quick")
# Runs the script as `python examples/NAME.py` would, with the workbench blocked.
PRELUDE = ("import runpy, sys; sys.modules['workbench'] = None; path = sys.argv[1]; sys.argv = sys.argv[1:]; "
           "sys.path.insert(0, str(__import__('pathlib').Path(path).parent)); runpy.run_path(path, run_name='__main__')")


@dataclasses.dataclass
class Ran:
    output: str
    losses: list[float]


def example_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WORKBENCH_PRESET")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, as the RunConfig
    env["OMP_NUM_THREADS"] = "1"  # as the course's runs here (_one_thread): a second thread only spins at these sizes
    return env


# The examples that leave no process-wide state behind (no Accelerator, no compile, no launcher) run
# one after another in one interpreter: one import of torch, peft and torchao for all of them (about
# a CPU-second an example, measured). Each still runs as __main__ (runpy) with the workbench blocked,
# and seeds what it draws; the others run alone, in a process of their own.
SHARED = [("baseline", ()), ("activation_checkpointing", ()), ("sdpa_attention", ()), ("fused_adamw", ("--impl", "fused")),
          ("dataloader_workers", ("--workers", "2")), ("fp16_grad_scaler", ()), ("bf16_autocast", ()), ("freezing", ()),
          ("lora", ("--rank", "8")), ("adamw_8bit", ()), ("qat", ("--bits", "8")), ("int8_dynamic_quantization", ()),
          ("gradient_accumulation", ("--accumulate", "2")), ("channels_last", ("--images", "64"))]
ONE_AFTER_ANOTHER = """
import contextlib, io, json, runpy, sys, traceback
sys.modules['workbench'] = None
folder, todo, said = sys.argv[1], json.loads(sys.argv[2]), []
sys.path.insert(0, folder)
for name, flags in todo:
    sys.argv, out = [f'{folder}/{name}.py', *flags], io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(sys.argv[0], run_name='__main__')
        said.append([0, out.getvalue()])
    except BaseException:
        said.append([1, out.getvalue() + traceback.format_exc()])
print(json.dumps(said))
"""


@functools.cache
def shared_outputs() -> dict[tuple[str, tuple[str, ...]], tuple[int, str]]:
    todo = [[name, [*TINY, *flags]] for name, flags in SHARED]
    done = subprocess.run([sys.executable, "-c", ONE_AFTER_ANOTHER, str(EXAMPLES), json.dumps(todo)],
                          capture_output=True, text=True, cwd="/", env=example_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {key: tuple(said) for key, said in zip(SHARED, json.loads(done.stdout.strip().splitlines()[-1]))}


def run_example(name: str, *flags: str) -> Ran:
    """examples/NAME.py with TINY sizes (and `flags`), the workbench blocked; its output and its losses."""
    if (name, flags) in SHARED:
        returncode, output = shared_outputs()[name, flags]
    else:
        done = subprocess.run([sys.executable, "-c", PRELUDE, str(EXAMPLES / f"{name}.py"), *TINY, *flags],
                              capture_output=True, text=True, cwd="/", env=example_env(), timeout=300)
        returncode, output = done.returncode, done.stdout + done.stderr[-3000:] * bool(done.returncode)
    assert returncode == 0, f"{name}.py failed:\n{output[-4000:]}"
    last = output.strip().splitlines()[-1]
    assert last.startswith("losses: "), f"{name}.py's last line is not its losses: {last!r}"
    return Ran(output, ast.literal_eval(last.removeprefix("losses: ")))


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The course's runs on one thread, as the examples' processes: at these sizes a second thread
    only spins (the baseline example: 1.7 CPU-seconds on one, 2.8 on two, measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def course_run(**changes) -> wb.RunResult:
    return wb.run(dataclasses.replace(CONFIG, **changes), sinks=[RecordingSink()])


def counts(ran: Ran) -> tuple[int, int]:
    """(parameters, trainable parameters) as the example printed them."""
    line = next(line for line in ran.output.splitlines() if line.startswith("parameters: "))
    total, trainable = re.match(r"parameters: ([\d,]+), trainable: ([\d,]+)", line).groups()
    return int(total.replace(",", "")), int(trainable.replace(",", ""))


def course_counts(result: wb.RunResult) -> tuple[int, int]:
    return result.memory.parameter_bytes // 4, result.memory.gradient_bytes // 4  # fp32: 4 bytes each


@pytest.fixture(scope="module")
def baseline() -> Ran:
    return run_example("baseline")


@pytest.fixture(scope="module")
def course_baseline() -> wb.RunResult:
    return course_run()


def test_the_baseline_trains_the_course_gpt_to_the_same_losses_exactly(baseline, course_baseline):
    assert baseline.losses == course_baseline.losses
    # One block of width 32 over 256 bytes, 16 positions: embeddings 256*32 + 16*32, two LayerNorms
    # 2*64, q/k/v 32*96 + 96, output 32*32 + 32, MLP 32*128 + 128 + 128*32 + 32, final LayerNorm 64.
    assert counts(baseline) == course_counts(course_baseline) == (21_472, 21_472)


# Examples whose technique is a RunConfig switch: the same losses as wb.run with it, exactly (the
# same operations in the same order on a CPU).
SWITCHES = {
    "activation_checkpointing": ((), dict(activation_checkpointing="all")),
    "sdpa_attention": ((), dict(attention="sdpa")),
    "fused_adamw": (("--impl", "fused"), dict(optimizer_impl="fused")),
    "dataloader_workers": (("--workers", "2"), dict(num_workers=2, prefetch_factor=2, persistent_workers=True)),
    "fp16_grad_scaler": ((), dict(precision="fp16")),  # autocast + GradScaler by hand = accelerate's, fp16 on a CPU too
    "bf16_autocast": ((), dict(precision="bf16")),
    "accelerate_mixed_precision": ((), dict(precision="bf16")),
    "freezing": ((), dict(freeze="embeddings")),
    "lora": (("--rank", "8"), dict(lora_rank=8)),
    "adamw_8bit": ((), dict(optimizer="adamw8bit")),
    "qat": (("--bits", "8"), dict(qat="int8")),
}


@pytest.mark.parametrize("name, precision", [("fp16_grad_scaler", "fp16"), ("accelerate_mixed_precision", "bf16")])
def test_a_clipped_mixed_precision_example_trains_to_wb_runs_clipped_losses(name, precision):
    # The notebook's loop (01) clips: the scaler unscales first, accelerate's clip_grad_norm_ does it itself.
    # A norm of 0.1 clips every step here (the gradients' norm is above 1 at these sizes).
    example = run_example(name, "--max-grad-norm", "0.1")
    assert example.losses == course_run(precision=precision, max_grad_norm=0.1).losses
    assert example.losses != run_example(name).losses  # the clipping changed the run


@pytest.mark.parametrize("name", SWITCHES)
def test_each_switch_example_trains_to_the_losses_and_counts_of_wb_run_with_that_switch(name):
    flags, switch = SWITCHES[name]
    example, course = run_example(name, *flags), course_run(**switch)
    assert example.losses == course.losses, name
    assert counts(example) == course_counts(course), name
    if name == "adamw_8bit":  # the state's bytes as wb.run counts them: uint8 codes, fp32 scales and tables
        printed = re.search(r"optimizer state: ([\d,]+) bytes", example.output)[1]
        assert int(printed.replace(",", "")) == course.memory.optimizer_state_bytes


# Accumulation: 2 micro-batches of 2 a step. The weights follow wb.run's exactly; the step's loss is
# the mean of the micro-batches' losses, which the course sums in fp32 and the examples in Python
# floats: equal to fp32 rounding (relative 1e-6).
@pytest.mark.parametrize("name", ["gradient_accumulation", "accelerate_accumulate"])
def test_accumulation_examples_train_like_wb_run_with_grad_accum_steps(name):
    example = run_example(name, "--accumulate", "2")
    course = course_run(batch_size=2, grad_accum_steps=2)
    assert example.losses == pytest.approx(course.losses, rel=1e-6, abs=0)


# Two processes of batch 4 against one process of batch 8: the same 8 samples a step (the launcher
# hands out every other batch of the same shuffle), the mean of two half-batch losses and the average
# of two half-batch gradients against one mean: equal to fp32 rounding, 1e-5 over 3 steps.
@pytest.mark.parametrize("name", ["ddp_notebook_launcher", "fsdp2"])
def test_two_process_examples_train_like_wb_run_with_the_whole_batch_in_one_process(name):
    example = run_example(name, "--processes", "2")
    course = course_run(batch_size=8)
    assert example.losses == pytest.approx(course.losses, abs=1e-5)
    assert counts(example) == course_counts(course)
    if name == "fsdp2":
        assert "of which rank 0 holds 10,736" in example.output  # half of 21,472: every tensor split in 2 rows


# Tensor and pipeline parallelism have no RunConfig switch (notebook 10 splits the model by hand):
# each is held to wb.run of the same model on one process. A split matmul sums in another order (a
# row-wise half-sum, then the all-reduce), micro-batches average their means: 1e-5 over 3 steps.
def test_tensor_parallel_trains_like_one_process_and_holds_its_share(course_baseline):
    example = run_example("tensor_parallel", "--processes", "2")
    assert example.losses == pytest.approx(course_baseline.losses, abs=1e-5)
    assert counts(example) == course_counts(course_baseline)
    # Rank 0 holds the embeddings and norms whole (256*32 + 16*32 + 3*64) and half of each block's
    # matrices: q/k/v (32*96 + 96) / 2, the output 32*32 / 2 + its bias 32 (row-wise: whole), the MLP
    # (32*128 + 128) / 2 + 128*32 / 2 + 32.
    assert f"of which rank 0 holds {8192 + 512 + 192 + 1584 + 544 + 2112 + 2080:,}" in example.output


def test_pipeline_parallel_trains_like_one_process_of_the_same_two_block_gpt():
    example = run_example("pipeline_parallel", "--processes", "2", "--microbatches", "2", "--layers", "2")
    course = course_run(dims={"n_layer": 2, "n_head": 2, "d_model": 32})
    assert example.losses == pytest.approx(course.losses, abs=1e-5)


def example_parts():
    """examples/parts.py as a module (the test builds wb.run's own-model configurations from it)."""
    spec = importlib.util.spec_from_file_location("example_parts", EXAMPLES / "parts.py")
    parts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parts)
    return parts


def test_channels_last_trains_like_wb_run_of_the_same_cnn_with_memory_format_channels_last():
    # wb.run's CNN is sized to its MNIST split, made with `datasets`; the example reads the digits
    # with numpy. So the course runs the example's own CNN and digits (RunConfig(model=module,
    # data=dataset)), which is how a learner's own model would run there: the same seed, order, init.
    example = run_example("channels_last", "--images", "64")
    parts = example_parts()
    images, labels = parts.digits(64, seed=0)
    inputs = (images.unsqueeze(1).float() / 255 - 0.1307) / 0.3081
    torch.manual_seed(0)
    config = dataclasses.replace(CONFIG, model=parts.SmallCNN(), data=torch.utils.data.TensorDataset(inputs, labels),
                                 memory_format="channels_last", seq_len=None, dims=None)
    course = wb.run(config, sinks=[RecordingSink()])
    assert example.losses == course.losses
    assert counts(example) == course_counts(course) == (8 * 9 + 8 + 16 * 8 * 9 + 16 + 16 * 7 * 7 * 10 + 10,) * 2


def test_the_compiled_example_trains_like_the_baseline_to_float_rounding(baseline):
    # No wb.run here: a second compile of the same model would cost another ~15 CPU-seconds cold. The
    # example inherits workbench's inductor cache (TORCHINDUCTOR_CACHE_DIR, one folder per CPU
    # instruction set): ~17 CPU-seconds cold, ~4 warm (measured).
    # Inductor's fused kernels sum in another order: 1e-5 over 3 steps (measured: 1e-6).
    compiled = run_example("torch_compile")
    assert compiled.losses == pytest.approx(baseline.losses, abs=1e-5)
    assert "the compile" in compiled.output


def test_int8_quantization_leaves_training_alone_and_the_held_out_loss_close(baseline):
    # Post-training: no RunConfig switch. Its training is the baseline's, exactly; int8 weights
    # (a scale per row) move the held-out loss by rounding only (measured: 1e-4).
    example = run_example("int8_dynamic_quantization")
    assert example.losses == baseline.losses
    fp32, int8 = (float(x) for x in re.findall(r": held-out loss ([\d.]+)", example.output))
    assert abs(int8 - fp32) < 0.01


def test_dali_trains_where_it_is_installed_and_says_so_where_not():
    done = subprocess.run([sys.executable, "-c", PRELUDE, str(EXAMPLES / "dali.py"), "--steps", "3",
                           "--batch-size", "16", "--images", "64"], capture_output=True, text=True, cwd="/", env=example_env(),
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    if importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("nvidia.dali") is None:
        assert done.stdout.splitlines() == [
            "NVIDIA DALI is not installed here, so there is nothing to train (pip install nvidia-dali-cuda120)"]
    else:
        losses = ast.literal_eval(done.stdout.strip().splitlines()[-1].removeprefix("losses: "))
        assert len(losses) == 3 and all(math.isfinite(x) for x in losses)


def test_an_example_cannot_import_the_workbench(tmp_path):
    script = tmp_path / "uses_workbench.py"
    script.write_text("import workbench\n")
    done = subprocess.run([sys.executable, "-c", PRELUDE, str(script)], capture_output=True, text=True, cwd="/")
    assert done.returncode == 1 and "ModuleNotFoundError: import of workbench halted" in done.stderr


def test_no_example_imports_the_workbench():
    for path in EXAMPLES.glob("*.py"):
        imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in getattr(node, "names", [])}
        modules = {node.module.split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.ImportFrom) and node.module}
        assert "workbench" not in imported | modules, path.name


def test_every_technique_example_marks_the_lines_it_adds():
    for path in EXAMPLES.glob("*.py"):
        if path.name not in ("baseline.py", "parts.py"):
            assert "# + " in path.read_text(), f"{path.name} marks no line with '# + <technique>'"


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "argument --steps: '0' is not a whole number of at least 1"),
    (["--lr", "2"], "argument --lr: '2' is not a learning rate in (0, 1]"),
    (["--d-model", "30"], "argument --d-model: 30 is not a multiple of --heads 4"),
])
def test_a_bad_flag_is_refused_in_one_line_that_names_it(monkeypatch, argv, message):
    parts = example_parts()
    monkeypatch.setattr(sys, "argv", ["baseline.py", *argv])
    with pytest.raises(SystemExit) as info:
        parts.arguments("test")
    assert str(info.value) == f"baseline.py: {message}"


def test_the_peak_memory_line_reads_each_platforms_unit_and_windows_says_it_has_none(monkeypatch):
    # ru_maxrss is KiB on Linux and bytes on macOS; Windows has no `resource` module at all
    import importlib
    import types

    monkeypatch.syspath_prepend(str(EXAMPLES))
    parts = importlib.import_module("parts")
    usage = types.SimpleNamespace(getrusage=lambda who: types.SimpleNamespace(ru_maxrss=3 * 2**20), RUSAGE_SELF=0)
    monkeypatch.setitem(sys.modules, "resource", usage)
    monkeypatch.setattr(sys, "platform", "linux")
    assert parts.peak_memory(torch.device("cpu")) == "peak process memory 3,072 MiB"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert parts.peak_memory(torch.device("cpu")) == "peak process memory 3 MiB"
    monkeypatch.setitem(sys.modules, "resource", None)  # as on Windows: import fails
    assert parts.peak_memory(torch.device("cpu")).startswith("peak process memory not read")
