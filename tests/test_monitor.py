"""wb.monitor: a hand-written loop measured as run() measures its own."""

import pytest
import torch

import workbench as wb
from workbench.core.data import build_dataloader, load_data
from workbench.core.models import build_model, loss_fn
from workbench.core.switches.optimizer import make_optimizer
from workbench.core.views.sinks import RecordingSink


def _hand_loop(cfg, mon, *, fail_at=None, error=None):
    data = load_data(cfg.data, seq_len=cfg.seq_len or 128, seed=cfg.seed)
    model = build_model(cfg.model, data=data, dims=cfg.dims, seed=cfg.seed)
    optimizer = make_optimizer(model, cfg)
    loader = build_dataloader(data.train, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed)
    with mon(model, optimizer) as m:
        for step, batch in zip(range(1, cfg.steps + 1), loader):
            with m.step(samples=len(batch["labels"])):
                if step == fail_at:
                    raise error
                loss = loss_fn(model(batch["inputs"]), batch["labels"])
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                m.loss(loss)
    return m


CFG = wb.RunConfig(model="mlp", steps=12, log_every=4, eval_samples=0, preset="cpu-quick").resolved()


def test_a_hand_written_loop_measures_what_run_measures_on_the_same_model_and_data():
    reference = wb.run(CFG, sinks=[], name="run()")
    mon = _hand_loop(CFG, lambda model, opt: wb.monitor(model, opt, steps=CFG.steps, log_every=4, name="by hand", sinks=[]))
    result = mon.result
    assert result.status == "ok" and result.steps_done == 12
    assert result.losses == reference.losses and result.loss_steps == [4, 8, 12]  # the same seeded step, bit for bit
    assert result.flops_per_step == reference.flops_per_step
    assert result.memory.activation_bytes == reference.memory.activation_bytes
    assert result.memory.model_state_bytes == reference.memory.model_state_bytes
    assert result.config.batch_size == CFG.batch_size  # read off the first step
    assert result.samples_per_sec > 0 and 0 <= result.data_wait_fraction < 1
    table = str(wb.compare([reference, result]))
    assert "by hand" in table and "run()" in table


def test_the_monitor_tells_its_sinks_and_counts_the_first_step_out_of_the_timings():
    sink = RecordingSink()
    mon = _hand_loop(CFG, lambda model, opt: wb.monitor(model, opt, steps=CFG.steps, log_every=4, name="seen",
                                                        sinks=[sink]))
    assert [s.run_name for s in sink.starts] == ["seen"] and sink.ends[-1].status == "ok"
    assert [r.step for r in sink.steps] == [4, 8, 12]
    last = sink.steps[-1]
    assert last.mean_step_time_s == pytest.approx(mon.result.step_time_s)
    assert last.mean_samples_per_sec == pytest.approx(mon.result.samples_per_sec)
    assert len(mon.result.interval_step_times_s) == 3  # steps 2-4, 5-8, 9-12: step 1 was counted, not timed


def test_an_interrupt_in_a_hand_loop_stops_it_with_the_partial_result():
    sink = RecordingSink()
    with pytest.raises(wb.RunInterrupted) as stopped:
        _hand_loop(CFG, lambda model, opt: wb.monitor(model, opt, steps=CFG.steps, log_every=4, sinks=[sink]),
                   fail_at=9, error=KeyboardInterrupt())
    result = stopped.value.result
    assert result is wb.last_result() and result.status == "interrupted" and result.steps_done == 8
    assert result.loss_steps == [4, 8] and sink.ends[-1].status == "interrupted"


def test_an_out_of_memory_in_a_hand_loop_ends_it_with_an_oom_result():
    mon = _hand_loop(CFG, lambda model, opt: wb.monitor(model, opt, steps=CFG.steps, sinks=[]),
                     fail_at=3, error=torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert mon.result.status == "oom" and mon.result.steps_done == 2
    assert mon.result.message.startswith("CUDA out of memory")


def test_any_other_error_propagates_and_is_reported_failed():
    sink = RecordingSink()
    with pytest.raises(ValueError, match="bad batch"):
        _hand_loop(CFG, lambda model, opt: wb.monitor(model, opt, steps=CFG.steps, sinks=[sink]),
                   fail_at=2, error=ValueError("bad batch"))
    assert sink.ends[-1].status == "failed" and sink.ends[-1].message == "ValueError: bad batch"
    assert wb.last_result().status == "failed"


def test_a_checkpointed_gpt_counts_only_what_the_forward_saves():
    # A counter open through backward must not add the recompute's tensors: the monitor wraps
    # the whole step, run() only the forward; both must read the same exact bytes.
    cfg = wb.RunConfig(model="gpt", steps=2, log_every=1, eval_samples=0, batch_size=2, seq_len=32,
                       activation_checkpointing="all", preset="cpu-quick").resolved()
    reference = wb.run(cfg, sinks=[], name="run()")
    data = load_data(cfg.data, seq_len=cfg.seq_len, seed=cfg.seed)
    model = wb.set_activation_checkpointing(build_model("gpt", data=data, dims=cfg.dims, seed=cfg.seed), "all")
    optimizer = make_optimizer(model, cfg)
    batch = next(iter(build_dataloader(data.train, batch_size=2, shuffle=True, seed=cfg.seed)))
    with wb.monitor(model, optimizer, steps=1, sinks=[], text=True) as mon:
        with mon.step(samples=2, tokens=batch["inputs"].numel()):
            loss = loss_fn(model(batch["inputs"]), batch["labels"])
            loss.backward()
            optimizer.step()
            mon.loss(loss)
    assert mon.result.memory.activation_bytes == reference.memory.activation_bytes
    assert mon.result.flops_per_step == reference.flops_per_step


@pytest.mark.parametrize("kwargs, message", [
    (dict(steps=0), r"steps=0 must be a whole number >= 1"),
    (dict(steps=3, log_every=0), r"log_every=0 must be a whole number >= 1"),
    (dict(steps=3, precision="fp8"), r"precision='fp8' labels the run"),
])
def test_bad_monitor_arguments_get_a_one_line_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        wb.monitor(torch.nn.Linear(2, 2), sinks=[], **kwargs)


def test_misuse_inside_the_loop_gets_a_clear_error():
    model = torch.nn.Linear(2, 2)
    mon = wb.monitor(model, steps=2, sinks=[])
    with pytest.raises(RuntimeError, match=r"inside `with wb.monitor"):
        with mon.step(samples=4):
            pass
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module"):
        wb.monitor("mlp", steps=2, sinks=[])
    with mon as m:
        with pytest.raises(TypeError, match=r"pass mon.loss\(loss\), not loss.item\(\)"):
            m.loss(1.5)
        with pytest.raises(ValueError, match=r"samples=0 must be"):
            with m.step(samples=0):
                pass
