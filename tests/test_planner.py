"""plan(): ranking plans that fit; lessons.planner: the largest micro-batch, predicted and searched."""

from __future__ import annotations

import functools

import pytest
import torch

from workbench import RunConfig
from workbench.core.engine.train import run as train_run
from workbench.core.measure.oom import parse_oom
from workbench.lessons.planner import Verification, max_micro_batch, search_micro_batch
from workbench.planner.estimate import estimate
from workbench.planner.fit import check_fits
from workbench.planner.planning import Target, explain, plan

run = functools.partial(train_run, check_fit=check_fits)  # as wb.run does, without its default view

MiB = 2**20
BUDGET = 16 * MiB
SMALL = RunConfig(model="gpt", batch_size=32, memory_budget_bytes=BUDGET, steps=2, eval_samples=0)


def cpu_target() -> Target:
    # Fixed peaks: rankings must not depend on this machine's measured matmul speed.
    return Target("test CPU", BUDGET, {"fp32": 1e11, "bf16": 2e11}, simulated=True)


@pytest.fixture(scope="module")
def plans():
    return plan(SMALL, target=cpu_target(), effective_batch=32)


def test_fitting_plans_come_first_fastest_first_and_keep_the_effective_batch(plans):
    fits = [p.fits for p in plans.plans]
    assert fits == sorted(fits, reverse=True) and plans.best is not None and not plans.baseline.fits
    times = [p.step_time_s for p in plans.fitting]
    assert times == sorted(times)
    for p in plans.plans:
        assert p.config.batch_size * p.config.grad_accum_steps == 32
        assert p.fits == (p.estimate.counted_bytes <= BUDGET) == (p.memory_bytes <= BUDGET)
    # bf16 has twice the peak here and recompute costs FLOPs: the best is bf16 without checkpointing
    assert (plans.best.config.precision, plans.best.config.activation_checkpointing) == ("bf16", "none")
    assert "Recommended: bf16" in explain(plans)


def test_a_3b_model_with_adamw_fits_no_40_gib_gpu_but_sgd_does():
    report = parse_oom("CUDA out of memory. Tried to allocate 2.34 GiB (GPU 0; 40.00 GiB total capacity; "
                       "32.54 GiB already allocated; 1.25 GiB free; 34.00 GiB reserved)")
    target = Target.gpu("A100 SXM4 40GB", memory_bytes=report.total_bytes)
    big = RunConfig(model="gpt", dims={"n_layer": 32, "n_head": 32, "d_model": 2560}, seq_len=1024, batch_size=32)
    plans = plan(big, target=target, effective_batch=32, optimizers=("adamw", "sgd"), micro_batches=(1, 4, 32),
                 checkpointing=("none", "all"), vocab_size=50257)
    assert not any(p.fits for p in plans.where(optimizer="adamw"))  # 16 bytes a parameter: 39.5 GiB
    assert plans.best.config.optimizer == "sgd" and plans.best.config.precision == "bf16"
    assert "model state alone" in plans.where(optimizer="adamw")[0].why


def test_an_llm_explains_only_what_the_planner_decided(plans):
    prompts = []
    text = explain(plans, llm=lambda prompt: prompts.append(prompt) or "an explanation")
    assert text == "an explanation" and "do not change their numbers" in prompts[0]
    assert plans.best.label in prompts[0]


def test_plan_rejects_choices_the_target_cannot_run():
    with pytest.raises(ValueError, match="do not divide effective_batch=32"):
        plan(SMALL, target=cpu_target(), effective_batch=32, micro_batches=(5,))
    with pytest.raises(ValueError, match="cannot run on"):
        plan(SMALL, target=cpu_target(), precisions=("fp16",))
    with pytest.raises(ValueError, match="needs a model with blocks"):
        plan(RunConfig(model="mlp"), target=cpu_target(), checkpointing=("all",))
    with pytest.raises(ValueError, match="not in hardware.GPU_SPECS"):
        Target.gpu("A1000", memory_bytes=2**30)


def test_the_predicted_largest_micro_batch_sits_exactly_at_the_budget():
    target = cpu_target()
    b = max_micro_batch(SMALL, target=target)
    at = lambda n: estimate(RunConfig(model="gpt", batch_size=n)).counted_bytes  # noqa: E731
    assert at(b) <= BUDGET < at(b + 1)


def test_accelerates_search_with_real_runs_confirms_the_prediction():
    predicted = max_micro_batch(SMALL, target=cpu_target())
    found, tries = search_micro_batch(SMALL, start=predicted + 1, reduce=lambda b: b - 1)
    assert found == predicted and tries == [(predicted + 1, "oom"), (predicted, "ok")]


def test_verification_lays_exact_counts_next_to_the_prediction(plans):
    chosen = plans.where(precision="fp32", activation_checkpointing="all", batch_size=16)[0]
    check = Verification(chosen, run(chosen.config, sinks=[])).check()  # raises unless measured = predicted
    assert check.result.status == "ok"
    assert check.measured_counted_bytes == chosen.estimate.counted_bytes
    assert [row[3] for row in check.rows()[:6]] == ["1.000"] * 6


A100 = dict(memory_bytes=40 * 2**30)


def test_on_a_gpu_a_small_micro_batch_is_slower_because_every_micro_batch_rereads_the_weights():
    plans = plan(RunConfig(model="gpt", batch_size=32), target=Target.gpu("A100 SXM4 40GB", **A100),
                 effective_batch=32, precisions=("bf16",), checkpointing=("none",))
    time_at = {p.config.batch_size: p.step_time_s for p in plans.plans}
    assert sorted(time_at, key=time_at.get) == [32, 16, 8, 4, 2, 1]  # the larger, the faster
    assert time_at[1] > 2 * time_at[32]  # roofline: 32 reads of every weight against one
    assert plans.best.config.batch_size == 32 and "roofline bound" in str(plans)


def test_tf32_decides_what_fp32_runs_at_and_bf16_gains_no_more_than_the_peaks_allow():
    cfg = RunConfig(model="gpt", batch_size=8)
    for tf32, fp32_peak in ((False, 19.5), (True, 156)):
        target = Target.gpu("NVIDIA A100-SXM4-40GB", tf32=tf32, **A100)
        assert target.speed.peaks["fp32"] == fp32_peak * 1e12 and ("on TF32" in target.name) == tf32
        plans = plan(cfg, target=target, effective_batch=8, checkpointing=("none",), micro_batches=(8,))
        fp32, bf16 = plans.where(precision="fp32")[0], plans.where(precision="bf16")[0]
        gain = fp32.step_time_s / bf16.step_time_s
        # Matmuls gain at most the ratio of peaks (312 / 19.5 = 16, or 312 / 156 = 2 on TF32);
        # memory-bound ops at most 2 (half the bytes).
        assert 1 < gain <= max(312 / fp32_peak, 2), (tf32, gain)
    assert Target.gpu("A100 SXM4 40GB", tf32=True, **A100).speed.peaks["fp32"] > Target.gpu(
        "A100 SXM4 40GB", tf32=False, **A100).speed.peaks["fp32"]


def test_this_machine_times_each_micro_batch_once_and_adds_the_optimizer_step(monkeypatch):
    from workbench.planner.roofline import MeasuredHere

    timed = []

    def fake_time(self, cfg, vocab_size, *, optimizer_step):
        timed.append((cfg.batch_size, optimizer_step))
        return 0.5 if optimizer_step else 0.01 * (4 + cfg.batch_size)  # a fixed cost plus a per-sample one

    monkeypatch.setattr(MeasuredHere, "_time", fake_time)
    target = Target("this CPU", BUDGET, {"fp32": 1e11}, simulated=True, speed=MeasuredHere())
    plans = plan(SMALL, target=target, effective_batch=32, precisions=("fp32",), checkpointing=("none",),
                 micro_batches=(1, 2, 4, 32))
    fitting = {p.config.batch_size: p.step_time_s for p in plans.fitting}
    assert fitting and all(t == pytest.approx(32 // b * 0.01 * (4 + b) + 0.5) for b, t in fitting.items())
    assert len(timed) == len(set(timed))  # each micro-batch size and the optimizer step timed once
    assert "measured here" in str(plans) and "measured here" in explain(plans)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: max_memory_allocated")
def test_the_predicted_peak_is_within_10_percent_of_cudas_max_memory_allocated():
    from workbench.lessons.planner import check_peak

    for changes in ({}, {"activation_checkpointing": "all"}, {"grad_accum_steps": 2}):
        cfg = RunConfig(model="gpt", device="cuda", preset="gpu", steps=3, eval_samples=0, batch_size=8, **changes)
        check = check_peak(cfg)
        assert abs(check.ratio - 1) < 0.10, (changes, check)


def test_notebook_07_sizes_gpt_neo_2_7b_by_its_real_shape_and_the_seeds_1_2b_model_fits_40_gib():
    import json
    from pathlib import Path

    cells = json.loads((Path(__file__).parents[1] / "notebooks" / "07_planner.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    # GPT-Neo 2.7B: 32 layers, width 2560, 20 heads, a 2,048-token context (32 heads is Pythia-2.8B)
    big = next(t for t in text if "big = wb.RunConfig(" in t)
    assert "dims=dict(n_layer=32, n_head=20, d_model=2560), seq_len=2048" in big
    assert any("GPT-Neo 2.7B's" in t and "20 heads" in t and "2,048-token context" in t for t in text)
    # the seed's before/after table is about a 1.2B model (GPT-Neo 1.3B's shape): its AdamW state fits
    cfg = RunConfig(model="gpt", dims={"n_layer": 24, "n_head": 16, "d_model": 2048}, seq_len=512, batch_size=1)
    est = estimate(cfg, vocab_size=50257, device="cuda")
    assert 1.2e9 < est.parameter_count < 1.35e9
    assert est.model_state_bytes < Target.gpu("A100 SXM4 40GB", **A100).usable_bytes  # its AdamW state fits


def test_a_speed_forecast_is_judged_by_its_direction_first_then_its_size():
    from workbench.lessons.planner import forecast_verdict

    assert forecast_verdict(1.16, 0.88).startswith("does not hold here")  # 24% apart, but the other way
    assert forecast_verdict(1.20, 1.15).startswith("holds: ")
    assert forecast_verdict(3.85, 1.22).startswith("holds in part")


def test_a_plan_by_hand_must_match_wb_plan_label_for_label(plans, capsys):
    from workbench.lessons.planner import check_fits

    by_hand = {p.label: p.fits for p in plans.plans}
    check_fits(by_hand, plans)
    assert "by hand and wb.plan agree" in capsys.readouterr().out
    first = next(iter(by_hand))
    with pytest.raises(AssertionError, match="differ"):
        check_fits({**by_hand, first: not by_hand[first]}, plans)
