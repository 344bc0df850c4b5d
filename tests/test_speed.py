"""Notebook 08's switches (compile, attention, optimizer_impl, tf32) and its measuring helpers."""

import copy
import dataclasses
import functools
import json
import os
from types import SimpleNamespace

import pytest
import torch

import workbench as wb
from workbench.cli import build_parser, config_from_args
from workbench.core.config import ConfigError, RunConfig, field_choices
from workbench.core.engine.phases import LoopPhases
from workbench.core.engine.train import run as train_run
from workbench.core.measure.counters import SavedActivationCounter, gpt_activation_bytes_formula
from workbench.core.measure.flops import FlopCounter
from workbench.core.measure.result import RunResult
from workbench.core.models import GPT, MLP, CausalSelfAttention, loss_fn
from workbench.core.switches.attention import FusedAttention, set_attention
from workbench.core.switches.compiling import compile_model
from workbench.core.switches.optimizer import IMPLEMENTATIONS, implementation_problem, make_optimizer
from workbench.core.switches.tf32 import matmuls as tf32_matmuls
from workbench.lessons.speed import compile_payback, graph_breaks, optimizer_bench, phase_ms, saved_bytes
from workbench.machine import hardware
from workbench.planner.fit import check_fits

run = functools.partial(train_run, check_fit=check_fits)  # as wb.run does, without its default view

NO_COMPILER = "torch.compile on a CPU needs a C++ compiler (g++ or $CXX) and none is installed"
needs_compiler = pytest.mark.skipif(hardware.cpp_compiler() is None, reason=NO_COMPILER)
TINY_MLP = RunConfig(model="mlp", data="digits", steps=6, log_every=2, batch_size=16, dims={"hidden": [16]},
                     eval_samples=0, device="cpu", preset="cpu-quick")


def _error(**fields) -> str:
    with pytest.raises(ConfigError) as info:
        RunConfig(**fields).resolved()
    return str(info.value)


# -- the switches as RunConfig fields -----------------------------------------------------------

def test_the_speed_switches_default_to_the_baseline_and_name_their_choices():
    cfg = RunConfig(model="gpt").resolved()
    assert (cfg.compile, cfg.attention, cfg.optimizer_impl, cfg.tf32) == ("none", "explicit", "default", False)
    assert field_choices("compile") == ("none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    assert field_choices("attention") == ("explicit", "sdpa")
    assert field_choices("optimizer_impl") == tuple(IMPLEMENTATIONS) == ("default", "for-loop", "foreach", "fused")


def test_config_rejects_unknown_speed_choices_in_one_line():
    for fields, expected in [
        ({"compile": "fast"}, "compile='fast' is not known; use one of: 'none', 'default'"),
        ({"model": "gpt", "attention": "flash"}, "attention='flash' is not known; use one of: 'explicit', 'sdpa'"),
        ({"optimizer_impl": "apex"}, "optimizer_impl='apex' is not known; use one of: 'default', 'for-loop'"),
        ({"tf32": "yes"}, "tf32 must be True or False, got str 'yes'"),
        ({"compile": True}, "compile must be 'none', 'default'"),
    ]:
        message = _error(**fields)
        assert message.startswith(expected) and "\n" not in message


def test_config_rejects_sdpa_attention_for_a_model_without_it():
    assert _error(model="mlp", attention="sdpa") == (
        "attention='sdpa' switches the GPT's attention and model='mlp' is not the GPT; "
        "use model='gpt' or attention='explicit'")


def test_config_rejects_tf32_on_a_cpu_and_on_a_pre_ampere_gpu(monkeypatch):
    assert _error(model="mlp", device="cpu", tf32=True).startswith("tf32=True acts on CUDA matmuls and this run is on the CPU")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(hardware, "gpu_info", lambda: hardware.GPUInfo("Tesla T4", 16 * 2**30, (7, 5)))
    assert _error(model="mlp", device="cuda", tf32=True) == (
        "tf32=True needs an Ampere or newer GPU (compute capability 8.0+): this card (Tesla T4, compute capability 7.5) "
        "has no TF32; use tf32=False")


def test_notebook_08_skips_its_tf32_timing_on_a_pre_ampere_card_with_the_reason(monkeypatch):
    # 08's TF32 cell times matmuls only where lesson.missing_here(device, "tf32") is None; elsewhere the
    # claims row reads "not shown here: <why>". The decision is the capability's, as the config's is.
    from workbench.lessons import speed

    assert speed.missing_here("cpu", "tf32") == "a CPU has no TF32"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(hardware, "gpu_info", lambda: hardware.GPUInfo("Tesla T4", 16 * 2**30, (7, 5)))
    assert speed.missing_here("cuda", "tf32") == "this card (Tesla T4, compute capability 7.5) has no TF32"
    monkeypatch.setattr(hardware, "gpu_info", lambda: hardware.GPUInfo("NVIDIA L4", 24 * 2**30, (8, 9)))
    assert speed.missing_here("cuda", "tf32") is None


def test_config_rejects_compile_on_a_cpu_without_a_cpp_compiler(monkeypatch):
    import torch._inductor.config  # noqa: F401  reads $CXX once, on import: not the fake one below

    monkeypatch.setenv("CXX", "no-such-compiler++")
    assert hardware.cpp_compiler() is None
    assert _error(model="mlp", device="cpu", compile="default") == (
        "compile='default' on a CPU needs a C++ compiler (inductor writes C++ kernels) and none was found: "
        "apt-get install g++ (or set $CXX), or use compile='none'")


def test_an_optimizer_without_a_fused_kernel_is_refused_by_building_it(monkeypatch):
    # An optimizer added later (say one whose constructor has no `fused`) is checked the same way.
    class NoFused(torch.optim.SGD):
        def __init__(self, params, *, lr, momentum, weight_decay, foreach=None):
            super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay, foreach=foreach)

    monkeypatch.setattr(torch.optim, "SGD", NoFused)
    cfg = SimpleNamespace(optimizer="sgd", optimizer_impl="fused", lr=1e-3, weight_decay=0.0)
    assert implementation_problem(cfg).startswith("optimizer_impl='fused' does not work with optimizer='sgd' (")
    assert implementation_problem(dataclasses.replace(RunConfig(), optimizer_impl="foreach").resolved()) is None
    assert _error(optimizer="sgd", optimizer_impl="fused").endswith("use optimizer_impl='foreach', 'for-loop' or 'default'")


def test_the_cli_takes_every_speed_switch_as_a_flag():
    args = build_parser().parse_args(["--model", "gpt", "--compile", "default", "--attention", "sdpa",
                                      "--optimizer-impl", "fused", "--no-tf32"])
    cfg = config_from_args(args)
    assert (cfg.compile, cfg.attention, cfg.optimizer_impl, cfg.tf32) == ("default", "sdpa", "fused", False)
    assert "scaled_dot_product_attention" in build_parser().format_help()


# -- fused attention: the same function, exact bytes and FLOPs --------------------------------------

S, B, H, A, L, V = 16, 3, 32, 4, 2, 256  # a tiny GPT; every count below is exact at any size


def _tiny_gpt(attention: str) -> GPT:
    torch.manual_seed(0)
    return set_attention(GPT(V, S, L, A, H), attention)


def _counted_step(model: GPT) -> tuple[int, int, torch.Tensor]:
    x = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(1))
    with FlopCounter() as flops:
        with SavedActivationCounter(model) as saved:
            logits = model(x)
        loss_fn(logits, x).backward()
    return saved.bytes, flops.total, logits.detach()


def test_sdpa_computes_the_explicit_attention_and_keeps_its_weights():
    explicit, fused = _tiny_gpt("explicit"), _tiny_gpt("sdpa")
    x = torch.randint(0, V, (B, S))
    torch.testing.assert_close(fused(x), explicit(x), rtol=1e-5, atol=1e-5)  # fp32 rounding of a reordered sum
    assert all(torch.equal(p, q) for p, q in zip(fused.parameters(), explicit.parameters()))
    assert type(fused.blocks[0].attn) is FusedAttention
    names = [name for name, _ in fused.named_parameters()]
    assert type(set_attention(fused, "explicit").blocks[0].attn) is CausalSelfAttention  # and back,
    assert [name for name, _ in fused.named_parameters()] == names  # its parameters' names unchanged


def test_sdpa_saves_exactly_the_formula_without_the_s_by_s_probabilities():
    explicit_bytes, explicit_flops, _ = _counted_step(_tiny_gpt("explicit"))
    sdpa_bytes, sdpa_flops, _ = _counted_step(_tiny_gpt("sdpa"))
    assert explicit_bytes == gpt_activation_bytes_formula(S, B, H, A, L, vocab_size=V)
    assert sdpa_bytes == gpt_activation_bytes_formula(S, B, H, A, L, vocab_size=V, attention="sdpa")
    # per layer: the fp32 probabilities (a·s²·b) go, the fp32 log-sum-exp of each row (a·s·b) comes
    assert explicit_bytes - sdpa_bytes == L * 4 * (A * S * S * B - A * S * B)
    # FLOPs: the fused backward recomputes the scores Q·K^T (one more s x s matmul per layer)
    assert sdpa_flops - explicit_flops == L * 2 * B * S * S * H


def test_set_attention_refuses_a_model_without_attention_and_unknown_names():
    with pytest.raises(ValueError, match="applies to the GPT, not MLP"):
        set_attention(MLP(4, (4,), 2), "sdpa")
    assert set_attention(MLP(4, (4,), 2), "explicit") is not None  # a loop may always call it
    with pytest.raises(ValueError, match="attention='flash' is not known"):
        set_attention(_tiny_gpt("explicit"), "flash")


def test_run_trains_with_sdpa_and_counts_its_bytes():
    cfg = RunConfig(model="gpt", steps=2, log_every=1, eval_samples=0, dims={"n_layer": 1}, batch_size=2,
                    seq_len=16, device="cpu", preset="cpu-quick")
    base, fused = run(cfg), run(dataclasses.replace(cfg, attention="sdpa"))
    s, b, a = 16, 2, fused.config.dims["n_head"]
    assert base.memory.activation_bytes - fused.memory.activation_bytes == 4 * (a * s * s * b - a * s * b)
    assert fused.losses == pytest.approx(base.losses, rel=1e-5)


def test_the_estimate_predicts_sdpa_bytes_and_flops_as_the_run_counts_them():
    cfg = RunConfig(model="gpt", attention="sdpa", steps=1, eval_samples=0, dims={"n_layer": 3}, batch_size=2,
                    seq_len=16, device="cpu", preset="cpu-quick")
    est, ran = wb.estimate(cfg, device="cpu"), run(cfg)
    assert est.activation_bytes == ran.memory.activation_bytes  # 3 layers: replayed 2, the third scaled in
    assert est.flops_per_step == ran.flops_per_step


# -- fused and foreach optimizers: the same update ---------------------------------------------------

@pytest.mark.parametrize("optimizer", [torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD])
def test_foreach_and_fused_reach_the_for_loop_parameters(optimizer):
    torch.manual_seed(0)
    model = GPT(V, S, 1, 2, 16)
    make = lambda **impl: optimizer(copy.deepcopy(model).parameters(), lr=1e-3, weight_decay=0.01, **impl)
    bench = optimizer_bench({"for-loop": make(foreach=False), "foreach": make(foreach=True), "fused": make(fused=True)},
                            rounds=2, steps=5)
    assert [p.name for p in bench.items] == ["for-loop", "foreach", "fused"]
    # The same math in another order: fp32 rounding only (measured: 0 for foreach, ~1e-7 fused).
    assert bench.point("foreach").max_difference <= 1e-6
    assert bench.point("fused").max_difference <= 1e-6
    assert all(p.step_time_s > 0 for p in bench.items)


def test_optimizer_bench_refuses_optimizers_over_different_weights():
    make = lambda: torch.optim.AdamW(torch.nn.Linear(4, 4).parameters())
    with pytest.raises(ValueError, match="copy of the same parameters"):
        optimizer_bench({"a": make(), "b": make()}, rounds=1, steps=1)


def test_saved_bytes_counts_q_k_v_the_probabilities_and_the_mask_of_explicit_attention():
    b, a, s, d = 2, 3, 8, 4
    q, k, v = (torch.randn(b, a, s, d, requires_grad=True) for _ in range(3))

    def explicit(q, k, v):
        future = torch.ones(s, s, dtype=torch.bool).triu(1)
        return (q @ k.transpose(-2, -1)).masked_fill(future, float("-inf")).softmax(-1) @ v

    assert saved_bytes(explicit, q, k, v) == 3 * 4 * b * a * s * d + 4 * b * a * s * s + s * s
    sdpa = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert saved_bytes(sdpa, q, k, v) == 4 * 4 * b * a * s * d + 4 * b * a * s  # q, k, v, out; log-sum-exp


def test_phase_ms_reads_the_record_function_ranges_per_step():
    model = torch.nn.Linear(8, 8)
    with torch.profiler.profile() as prof:
        for _ in range(2):
            with torch.profiler.record_function("forward"):
                loss = model(torch.ones(4, 8)).sum()
            with torch.profiler.record_function("backward"):
                loss.backward()
    ms = phase_ms(prof, 2, names=("forward", "backward"))
    assert set(ms) == {"forward", "backward"} and all(v > 0 for v in ms.values())
    with pytest.raises(ValueError, match="record_function\\('optimizer'\\)"):
        phase_ms(prof, 2)


def test_optimizer_impl_reaches_the_optimizer_constructor():
    model = torch.nn.Linear(2, 2)
    for impl, expected in [("for-loop", (False, None)), ("foreach", (True, None)), ("fused", (None, True)),
                           ("default", (None, None))]:
        opt = make_optimizer(model, SimpleNamespace(optimizer="adamw", optimizer_impl=impl, lr=1e-3, weight_decay=0.0))
        assert (opt.defaults["foreach"], opt.defaults["fused"]) == expected


def test_run_with_the_fused_optimizer_follows_the_baseline():
    base = run(TINY_MLP)
    fused = run(dataclasses.replace(TINY_MLP, optimizer_impl="fused"))
    foreach = run(dataclasses.replace(TINY_MLP, optimizer_impl="foreach"))
    assert foreach.losses == pytest.approx(base.losses, rel=1e-6)
    assert fused.losses == pytest.approx(base.losses, rel=1e-6)
    assert fused.memory.optimizer_state_bytes == base.memory.optimizer_state_bytes


# -- TF32 ------------------------------------------------------------------------------------------

def test_tf32_is_allowed_inside_and_restored_after():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with tf32_matmuls(True):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    with pytest.raises(KeyError), tf32_matmuls(True):
        raise KeyError("a failed run")
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 is a CUDA tensor-core format; no GPU here")
def test_tf32_speeds_up_fp32_matmuls_on_an_ampere_gpu():
    from workbench.lessons.speed import matmul_seconds

    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("TF32 needs compute capability 8.0+")
    fp32 = matmul_seconds(4096)
    with tf32_matmuls(True):
        assert fp32 / matmul_seconds(4096) > 2


# -- torch.compile ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def eager_and_compiled():
    """One real inductor compile for the module: a tiny MLP (a compile costs seconds per kernel on
    2 cores; the MLP has few kernels)."""
    if hardware.cpp_compiler() is None:
        pytest.skip(NO_COMPILER)
    return run(TINY_MLP, name="eager"), run(dataclasses.replace(TINY_MLP, compile="default"), name="compiled")


@needs_compiler
def test_a_compiled_run_follows_the_eager_losses_and_counts_the_same(eager_and_compiled):
    eager, compiled = eager_and_compiled
    # Inductor fuses and reorders fp32 ops (bias + ReLU in one loop, other reduction orders):
    # rounding differs by ~1e-7 a step and compounds; over 6 steps 1e-5 relative is generous
    # (measured here: identical on this MLP).
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-5)
    assert compiled.flops_per_step == eager.flops_per_step  # counted through the compiled code
    assert compiled.memory.parameter_bytes == eager.memory.parameter_bytes
    assert compiled.first_step_s > compiled.step_time_s  # the first step paid the compile


# One small graph (a matmul, an elementwise op, a reduction: the kernel kinds a training step
# compiles), compiled in a process of its own: 10-18 s each on the 2-core CI machine, where the
# tiny MLP's whole training run (forward and backward graphs) took ~30 s.
_COMPILED_GRAPH = """
import json, os
import torch
import workbench  # chooses the inductor cache folder for this process's capability
from torch._dynamo.utils import counters
torch.manual_seed(0)
weight = torch.randn(64, 32)
def step(x):
    return (x @ weight).relu().sum(dim=1)
x = torch.randn(16, 64)
compiled = torch.compile(step)(x)
print(json.dumps({"eager": step(x).tolist(), "compiled": compiled.tolist(),
                  "compiled_here": counters["inductor"]["fxgraph_cache_miss"],
                  "cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}))
"""


@needs_compiler
def test_a_capped_cpu_never_runs_kernels_compiled_for_another_instruction_set(tmp_path):
    """Inductor's cache is not keyed on ATEN_CPU_CAPABILITY: an AVX2-capped run that found kernels
    compiled uncapped trained on wrong numbers (CI, whose /tmp kept a warm cache: first loss 2.518
    instead of 2.474). workbench gives each capability its own cache folder: the capped process
    compiles its own kernels even after the uncapped one filled the cache, and both equal eager."""
    import subprocess
    import sys

    base = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "ATEN_CPU_CAPABILITY",
                                                          "ONEDNN_MAX_CPU_ISA", "WORKBENCH_INDUCTOR_CACHE_DIR")}
    base["TMPDIR"] = str(tmp_path)  # inductor's default cache lives under it: empty, then warmed uncapped

    def compiled(**caps):
        done = subprocess.run([sys.executable, "-c", _COMPILED_GRAPH], env={**base, **caps},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    uncapped = compiled()
    capped = compiled(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    for result in (uncapped, capped):
        assert result["compiled"] == pytest.approx(result["eager"], rel=1e-5)
    # A process that found its graph in the cache counts no miss (measured: a third, uncapped process
    # here counted 0 misses and 1 hit); a counter renamed by a later torch reads 0 and fails this too.
    assert (uncapped["compiled_here"], capped["compiled_here"]) == (1, 1)
    assert "_aten-avx2_" in capped["cache"] and "_aten-native_" in uncapped["cache"]


def test_the_inductor_cache_is_one_per_capability_and_cpu_unless_the_user_chose_one():
    from workbench.machine.compile_cache import inductor_cache_dir, separate_capped_cache

    assert "_aten-native_" in inductor_cache_dir({})
    assert inductor_cache_dir({"ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_CACHE_DIR": "/mine"}) is None
    environ = {"ATEN_CPU_CAPABILITY": "AVX512"}
    assert "_aten-avx512_" in separate_capped_cache(environ)
    assert environ["TORCHINDUCTOR_CACHE_DIR"] == inductor_cache_dir({"ATEN_CPU_CAPABILITY": "avx512"})


def test_a_child_started_with_another_cap_leaves_its_parents_cache_folder():
    # The parent imported workbench uncapped (its folder is in the environment); a kernel it starts
    # with ATEN_CPU_CAPABILITY=avx2 must not load the parent's AVX-512 kernels (SystemError in 08).
    from workbench.machine.compile_cache import separate_capped_cache

    parent: dict[str, str] = {}
    native = separate_capped_cache(parent)
    child = {**parent, "ATEN_CPU_CAPABILITY": "avx2"}
    capped = separate_capped_cache(child)
    assert "_aten-native_" in native and "_aten-avx2_" in capped and child["TORCHINDUCTOR_CACHE_DIR"] == capped
    assert separate_capped_cache({**parent, "TORCHINDUCTOR_CACHE_DIR": "/mine"}) is None  # the user's folder stays


@needs_compiler
def test_compile_payback_weighs_the_first_step_against_the_saving(eager_and_compiled):
    eager, compiled = eager_and_compiled
    payback = compile_payback(eager, compiled)
    assert payback.first_step_extra_s == pytest.approx(compiled.first_step_s - eager.first_step_s)
    fake = lambda first, step: dataclasses.replace(eager, first_step_s=first, step_time_s=step)
    assert compile_payback(fake(0.1, 0.020), fake(5.1, 0.015)).steps_to_pay_back == 1000
    assert compile_payback(fake(0.1, 0.020), fake(5.1, 0.025)).steps_to_pay_back is None
    assert compile_payback(fake(0.1, 0.020), fake(0.05, 0.015)).steps_to_pay_back == 0  # nothing compiled
    with pytest.raises(ValueError, match="no first-step or step time"):
        compile_payback(fake(None, 0.02), compiled)


def test_compile_none_leaves_the_model_alone():
    model = torch.nn.Linear(2, 2)
    assert compile_model(model, "none") is model


def test_graph_breaks_are_found_and_explained():
    model = torch.nn.Linear(4, 4)
    x = torch.ones(2, 4)

    def with_a_python_branch_on_a_value(x):
        y = model(x)
        if y.sum().item() > 0:  # a Python decision on a tensor's value: the graph must end here
            y = y * 2
        return y.relu()

    assert graph_breaks(model, x).breaks == 0
    found = graph_breaks(with_a_python_branch_on_a_value, x)
    assert found.graphs == 2 and found.breaks == 1 and "item" in found.reasons[0].lower()


# -- the profiler ------------------------------------------------------------------------------------

def test_loop_phases_open_ranges_only_under_a_profiler():
    phases = LoopPhases()
    phases.enter("data")
    assert phases._open is None  # no profiler: nothing opened, nothing to close
    with torch.profiler.profile() as prof:
        phases.enter("data")
        phases.enter("forward")
        phases.close()
    assert [e.name for e in prof.events() if e.name.startswith("workbench.")] == ["workbench.data", "workbench.forward"]


def test_first_step_seconds_reach_run_and_monitor_results():
    result = run(dataclasses.replace(TINY_MLP, steps=2, log_every=1))
    assert result.first_step_s is not None and result.first_step_s > 0
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with wb.monitor(model, opt, steps=2, sinks=[]) as mon:
        for _ in range(2):
            with mon.step(samples=8):
                loss = model(torch.ones(8, 4)).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                mon.loss(loss)
    assert isinstance(mon.result, RunResult) and mon.result.first_step_s > 0


def test_compile_problem_names_a_missing_cpp_compiler_for_a_cpu_model(monkeypatch, capsys):
    from workbench.lessons.speed import compile_problem

    monkeypatch.setattr(hardware, "cpp_compiler", lambda: None)
    problem = compile_problem(torch.nn.Linear(2, 2))
    assert "no C++ compiler" in problem and problem in capsys.readouterr().out
    monkeypatch.setattr(hardware, "cpp_compiler", lambda: "/usr/bin/g++")
    assert compile_problem(torch.nn.Linear(2, 2)) is None
