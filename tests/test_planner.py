"""plan(): ranking plans that fit; plancheck: the largest micro-batch, predicted and searched."""

from __future__ import annotations

import pytest
import torch

from workbench import RunConfig
from workbench.measure.estimate import estimate
from workbench.measure.oom import parse_oom
from workbench.techniques.plancheck import max_micro_batch, search_micro_batch, verify
from workbench.techniques.planning import Target, explain, plan

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
    target = Target.gpu("A100", memory_bytes=report.total_bytes)
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
    with pytest.raises(ValueError, match="not in hardware.GPU_PEAK_TFLOPS"):
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


def test_verify_lays_exact_counts_next_to_the_prediction(plans):
    chosen = plans.where(precision="fp32", activation_checkpointing="all", batch_size=16)[0]
    check = verify(chosen, sinks=[])
    assert check.result.status == "ok"
    assert check.measured_counted_bytes == chosen.estimate.counted_bytes
    assert [row[3] for row in check.rows()[:6]] == ["1.000"] * 6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: max_memory_allocated")
def test_the_predicted_peak_is_within_10_percent_of_cudas_max_memory_allocated():
    from workbench import run

    for changes in ({}, {"activation_checkpointing": "all"}, {"grad_accum_steps": 2}):
        cfg = RunConfig(model="gpt", device="cuda", preset="gpu", steps=3, eval_samples=0, batch_size=8, **changes)
        result = run(cfg, sinks=[])
        assert abs(estimate(cfg).peak_bytes / result.memory.peak_bytes - 1) < 0.10, changes
