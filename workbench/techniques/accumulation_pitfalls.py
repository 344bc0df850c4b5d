"""The ways gradient accumulation stops equalling one big batch, each measured.

Companions to `accumulation.py` (which shows the equality and the padding-token fix):

- `batchnorm_check`: BatchNorm sees the micro-batch, LayerNorm does not;
- `lr_schedule_check`: schedulers count optimizer steps, not micro-batches;
- `partial_window_check`: the last, short window of an epoch under accelerate;
- `stepping_check`: gating `optimizer.step()` by hand inside `accelerator.accumulate`;
- `allreduce_check`: under DDP, `no_sync` skips the all-reduce on non-final micro-batches.

Each runs a few tiny steps and returns an `accumulation.Rows` table.

Example:
    >>> partial_window_check(micro_batches=10, accum_steps=4).value(3, "gradient (accelerate: / k)")
    0.5
"""

from __future__ import annotations

import contextlib

import torch
from accelerate import Accelerator
from torch import nn

from workbench.core.models import loss_fn
from workbench.engine.accelerator import make_accelerator
from workbench.measure.probe import Probe, gradients, max_relative_difference
from workbench.techniques.accumulation import Rows, check_accum_steps

__all__ = ["batchnorm_check", "lr_schedule_check", "partial_window_check", "stepping_check", "allreduce_check"]


def batchnorm_check(probe: Probe, *, accum_steps: int) -> Rows:
    """A Linear-Norm-ReLU-Linear classifier on the probe's images, with BatchNorm or LayerNorm.

    BatchNorm normalises with the statistics of the batch it sees: a micro-batch of b, not
    the window of k·b, so the gradients differ, and its running statistics take k momentum
    updates instead of one. LayerNorm normalises each sample alone: accumulation is exact.
    """
    k, n = accum_steps, len(probe.inputs)
    check_accum_steps(k, n)
    if probe.inputs.dim() != 4:
        raise ValueError("batchnorm_check needs image inputs (B, C, H, W): use model='mlp' or 'cnn'")
    features = probe.inputs[0].numel()
    classes = int(probe.labels.max()) + 1

    def net(norm: type[nn.Module]) -> nn.Sequential:
        torch.manual_seed(probe.config.seed)
        return nn.Sequential(nn.Flatten(), nn.Linear(features, 32), norm(32), nn.ReLU(),
                             nn.Linear(32, classes)).to(probe.inputs.device).train()

    rows = []
    for norm in (nn.BatchNorm1d, nn.LayerNorm):
        whole = net(norm)
        loss_fn(whole(probe.inputs), probe.labels).backward()
        micro = net(norm)
        for x, y in zip(probe.inputs.chunk(k), probe.labels.chunk(k)):
            (loss_fn(micro(x), y) / k).backward()
        stats = "n/a"
        if norm is nn.BatchNorm1d:
            stats = max_relative_difference([micro[2].running_mean], [whole[2].running_mean])
        rows.append((norm.__name__, max_relative_difference(gradients(micro), gradients(whole)), stats))
    return Rows(title=f"{k} micro-batches of {n // k} against one batch of {n}, by normalisation",
                header=("normalisation", "gradient max relative difference", "running mean max relative difference"),
                rows=tuple(rows))


def lr_schedule_check(*, accum_steps: int, optimizer_steps: int = 4, warmup_steps: int = 4,
                      lr: float = 1.0) -> Rows:
    """A linear warm-up over `warmup_steps` optimizer steps, traced micro-batch by micro-batch.

    Columns: the learning rate when `scheduler.step()` is called after every micro-batch
    (the warm-up ends k times too early); when it is called after every optimizer step
    (right); and accelerate's prepared scheduler called after every micro-batch (it steps
    only when the optimizer did, so it is right too).
    """
    check_accum_steps(accum_steps)
    k = accum_steps
    warmup = lambda step: min(1.0, (step + 1) / warmup_steps)  # noqa: E731

    def plain():
        opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=lr)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup)

    per_micro, per_step, accel = [], [], []
    opt_a, sched_a = plain()
    opt_b, sched_b = plain()
    accelerator = make_accelerator(_plain_config(k))
    opt_c, sched_c = plain()
    opt_c, sched_c = accelerator.prepare(opt_c, sched_c)
    for micro_batch in range(k * optimizer_steps):
        per_micro.append(opt_a.param_groups[0]["lr"])
        per_step.append(opt_b.param_groups[0]["lr"])
        accel.append(opt_c.param_groups[0]["lr"])
        opt_a.step()
        sched_a.step()  # the pitfall: once per micro-batch
        if (micro_batch + 1) % k == 0:
            opt_b.step()
            sched_b.step()
        with accelerator.accumulate():
            opt_c.step()
            sched_c.step()  # called every micro-batch; acts only on optimizer steps
    rows = tuple((i, i // k + 1, a, b, c) for i, (a, b, c) in enumerate(zip(per_micro, per_step, accel)))
    return Rows(title=f"learning rate during a {warmup_steps}-optimizer-step warm-up, k={k}",
                header=("micro-batch", "optimizer step", "scheduler.step() per micro-batch",
                        "per optimizer step", "accelerate, per micro-batch"),
                rows=rows)


def _plain_config(accum_steps: int):
    from workbench.core.config import RunConfig

    return RunConfig(model="mlp", grad_accum_steps=accum_steps, device="cpu")


def partial_window_check(*, micro_batches: int, accum_steps: int) -> Rows:
    """Windows of an epoch of `micro_batches` micro-batches under accelerate.

    Every micro-batch's loss is w·1, so its gradient is exactly 1 and a correctly averaged
    window has gradient 1. accelerate steps at the end of the data loader even when the
    last window is short, but its backward still divides by k: that window's gradient is
    (micro-batches in it) / k. Dividing by the window's real size instead gives 1 again.
    """
    check_accum_steps(accum_steps)
    if micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches} must be at least 1")
    k = accum_steps
    # accelerate's own default (sync_with_dataloader=True) is what this shows; run()
    # turns it off so that its windows are always k micro-batches long.
    cpu = make_accelerator(_plain_config(k)).device.type == "cpu"  # also resets accelerate's state
    accelerator = Accelerator(cpu=cpu, gradient_accumulation_steps=k)
    w = nn.Linear(1, 1, bias=False)
    nn.init.ones_(w.weight)
    optimizer = torch.optim.SGD(w.parameters(), lr=0.0)  # lr 0: w stays 1, grads stay exact
    seen: list[float] = []
    optimizer.register_step_pre_hook(lambda *_: seen.append(w.weight.grad.item()))
    loader = torch.utils.data.DataLoader(torch.ones(micro_batches, 1), batch_size=1)
    model, optimizer, loader = accelerator.prepare(w, optimizer, loader)
    in_window = 0
    sizes = []
    for x in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(x).sum())
            in_window += 1
            if accelerator.sync_gradients:
                sizes.append(in_window)
                in_window = 0
            optimizer.step()
            optimizer.zero_grad()
    rows = tuple((i + 1, size, grad, grad * k / size) for i, (size, grad) in enumerate(zip(sizes, seen)))
    return Rows(title=f"an epoch of {micro_batches} micro-batches, k={k}",
                header=("window", "micro-batches", "gradient (accelerate: / k)", "gradient / real size"),
                rows=rows)


def stepping_check(*, micro_batches: int, accum_steps: int) -> Rows:
    """How often the optimizer really steps under `accelerator.accumulate`, by how it is called.

    accelerate's prepared optimizer ignores `step()` and `zero_grad()` except on the last
    micro-batch of a window, so the loop calls them every micro-batch. Gating them again
    by hand with `if i % k == 0` (i from 0) asks for a step exactly when accelerate will not
    take one: the two conditions never meet and the model never updates.
    """
    check_accum_steps(accum_steps)
    k = accum_steps
    rows = []
    for label, gate in (("step() every micro-batch", lambda i: True),
                        (f"step() only if i % {k} == 0, inside accumulate()", lambda i: i % k == 0)):
        accelerator = make_accelerator(_plain_config(k))
        w = nn.Linear(1, 1, bias=False)
        optimizer = torch.optim.SGD(w.parameters(), lr=0.1)
        taken: list[int] = []
        optimizer.register_step_pre_hook(lambda *_, taken=taken: taken.append(1))
        model, optimizer = accelerator.prepare(w, optimizer)
        for i in range(micro_batches):
            with accelerator.accumulate(model):
                accelerator.backward(model(torch.ones(1, 1)).sum())
                if gate(i):
                    optimizer.step()
                    optimizer.zero_grad()
        rows.append((label, micro_batches // k, len(taken)))
    return Rows(title=f"{micro_batches} micro-batches, k={k}: optimizer steps expected and taken",
                header=("loop", "steps expected", "steps taken"), rows=tuple(rows))


def allreduce_check(*, accum_steps: int, seed: int = 0) -> Rows:
    """Count DDP's gradient all-reduces over one accumulation window, with and without no_sync.

    Runs DistributedDataParallel in a one-process gloo group made here (so it works on any
    CPU), with a communication hook that counts each bucket's all-reduce before doing it.
    Without `no_sync` every micro-batch's backward all-reduces all gradients; inside
    `model.no_sync()` they only add up locally, and the last micro-batch all-reduces the
    sum once. `accelerator.accumulate(model)` enters `no_sync` for you on non-final
    micro-batches when it runs distributed. The gradients are the same either way.
    """
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    check_accum_steps(accum_steps)
    if dist.is_initialized():
        raise RuntimeError("allreduce_check makes its own one-process group; call it outside a distributed launch")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        x = torch.randn(8 * accum_steps, 64)
        rows = []
        grads = {}
        for skip in (False, True):
            model = DDP(net)
            sent: list[int] = []

            def counting_hook(state, bucket, sent=sent):
                sent.append(bucket.buffer().numel() * bucket.buffer().element_size())
                return allreduce_hook(state, bucket)

            model.register_comm_hook(None, counting_hook)
            model.zero_grad(set_to_none=True)
            for i, chunk in enumerate(x.chunk(accum_steps)):
                last = i == accum_steps - 1
                with model.no_sync() if skip and not last else contextlib.nullcontext():
                    (model(chunk).square().mean() / accum_steps).backward()
            grads[skip] = gradients(net)
            label = "no_sync() on all but the last micro-batch" if skip else "all-reduce every micro-batch"
            rows.append([label, len(sent), sum(sent)])
            del model
    finally:
        dist.destroy_process_group()
    same = max_relative_difference(grads[True], grads[False]) <= 1e-6
    return Rows(title=f"one window of {accum_steps} micro-batches under DDP",
                header=("accumulation", "all-reduce calls", "bytes all-reduced", "same gradients (<= 1e-6)"),
                rows=tuple((*row, same) for row in rows))
