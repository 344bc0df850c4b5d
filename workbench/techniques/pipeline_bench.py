"""Measuring input pipelines: loader-only epochs, and the DataLoader sweep through run().

`time_epochs` iterates loaders (DataLoader, DALI, anything yielding batch dicts) without a
model: time to the first batch (worker start-up, pipeline build) and per epoch.
`loader_sweep` runs one RunConfig per DataLoader setting (workers, prefetch, batch size,
pinning on a GPU); `SweepView` splits each step into data wait and compute and draws
samples/s against the compute-bound ceiling (the same step on pre-loaded tensors).

Example:
    >>> plan = sweep_plan(cores=2, cuda=False)
    >>> [name for name, _ in plan][:3]
    ['0 workers', '1 worker', '2 workers']
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from workbench.core.report import Report, figure_html
from workbench.techniques.input_pipelines import release_on_error

# Samples the loader-only timings read, per preset: enough for steady epochs, CI-sized.
BENCH_SAMPLES = {"cpu-quick": 512, "cpu": 4000, "gpu": 4000}


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _spin(iterations: int) -> None:
    total = 0
    for i in range(iterations):  # pure Python: one core, no BLAS threads
        total += i


def parallel_speedup(processes: int = 2, *, iterations: int = 3_000_000) -> float:
    """How much faster `processes` CPU-bound processes finish side by side than one after
    another, measured now: about `processes` on idle cores, about 1 when other work holds
    them. Whether DataLoader workers can help depends on this, not on the core count alone.

    Example:
        >>> 0.5 < parallel_speedup(2) < 2.5
        True
    """
    import multiprocessing

    context = multiprocessing.get_context("fork")

    def timed(count: int) -> float:
        start = time.perf_counter()
        workers = [context.Process(target=_spin, args=(iterations,)) for _ in range(count)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return time.perf_counter() - start

    one = timed(1)
    return processes * one / timed(processes)


@dataclass(frozen=True)
class EpochTiming:
    loader: str
    epoch: int
    first_batch_s: float
    """From asking for the iterator to holding the first batch: worker start-up and prefetch."""
    seconds: float
    samples: int

    @property
    def samples_per_sec(self) -> float:
        return self.samples / self.seconds


class LoaderTimings(Report, list):
    """EpochTimings of several loaders; a table in Jupyter."""

    header = ("loader", "epoch", "first batch (ms)", "epoch (s)", "samples/s")

    def of(self, loader: str) -> list[EpochTiming]:
        return [t for t in self if t.loader == loader]

    def samples_per_sec(self, loader: str, *, epochs: slice = slice(1, None)) -> float:
        """Samples/s over the given epochs (default: all but the first, start-up excluded)."""
        chosen = self.of(loader)[epochs] or self.of(loader)
        return sum(t.samples for t in chosen) / sum(t.seconds for t in chosen)

    def rows(self) -> list[tuple[Any, ...]]:
        return [(t.loader, t.epoch, f"{t.first_batch_s * 1e3:.0f}", f"{t.seconds:.3f}", f"{t.samples_per_sec:,.0f}")
                for t in self]



def time_epochs(loaders: Mapping[str, Iterable], *, epochs: int) -> LoaderTimings:
    """Iterate each loader for `epochs` full epochs (no model): time to the first batch and
    per epoch. Each epoch asks for a new iterator, as a training loop does.

    Example:
        >>> from workbench.techniques.input_pipelines import ImageFileDataset, mnist_image_files
        >>> loader = torch.utils.data.DataLoader(ImageFileDataset(mnist_image_files().take(64)), batch_size=32)
        >>> [t.samples for t in time_epochs({"plain": loader}, epochs=2)]
        [64, 64]
    """
    timings = LoaderTimings()
    for name, loader in loaders.items():
        for epoch in range(epochs):
            start = time.perf_counter()
            first, samples = None, 0
            for batch in release_on_error(loader):
                first = first or time.perf_counter() - start
                samples += len(batch["labels"])
            timings.append(EpochTiming(name, epoch, first or 0.0, time.perf_counter() - start, samples))
    return timings


# -- the DataLoader sweep, through run() --

def sweep_plan(*, cores: int | None = None, cuda: bool | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(run name, RunConfig fields changed from the baseline) for this machine's sweep."""
    cores = usable_cores() if cores is None else cores
    cuda = torch.cuda.is_available() if cuda is None else cuda
    many = max(2, min(8, cores - 1 if cores > 2 else cores))  # leave a core to the training loop
    plan = [("0 workers", {}), ("1 worker", {"num_workers": 1}), ("2 workers", {"num_workers": 2}),
            ("2 workers, prefetch 4", {"num_workers": 2, "prefetch_factor": 4})]
    if many > 2:
        plan.append((f"{many} workers", {"num_workers": many}))
    plan.append((f"{many} workers, batch x2", {"num_workers": many, "batch_size": "x2"}))
    if cuda:  # pinning only matters for host-to-GPU copies
        plan.append((f"{many} workers, pinned", {"num_workers": many, "pin_memory": True}))
    return plan


def loader_sweep(base: Any, plan: Sequence[tuple[str, dict[str, Any]]], *, done: Sequence[Any] = (),
                 sinks: Any = None) -> list[Any]:
    """run() the baseline config once per plan entry ("x2" doubles the batch size), in plan
    order; entries named like a result in `done` reuse that result instead of running again."""
    from workbench.engine.train import run
    from workbench.views.dashboard import default_sinks

    have = {r.name: r for r in done}
    batch = base.resolved().batch_size
    results = []
    for name, fields in plan:
        fields = {k: batch * 2 if v == "x2" else v for k, v in fields.items()}
        results.append(have[name] if name in have else run(dataclasses.replace(base, **fields), name=name,
                                                                      sinks=default_sinks() if sinks is None else sinks))
    return results


def step_split(result: Any) -> tuple[float, float]:
    """(seconds waiting for data, seconds computing) per optimizer step of a run."""
    wait = (result.data_wait_fraction or 0.0) * result.step_time_s
    return wait, result.step_time_s - wait


class SweepView(Report):
    """The sweep as a table and a figure: per-sample time split into data wait and compute,
    and samples/s against the compute-bound ceiling (the same step on pre-loaded tensors)."""

    header = ("run", "workers", "prefetch", "batch", "data wait (ms/step)", "compute (ms/step)",
              "waiting", "samples/s", "x first")

    def __init__(self, results: Sequence[Any], ceiling: Any) -> None:
        self.results, self.ceiling = list(results), ceiling

    def rows(self) -> list[list[str]]:
        base = self.results[0].samples_per_sec
        rows = []
        for r in [*self.results, self.ceiling]:
            c, (wait, compute) = r.config, step_split(r)
            rows.append([r.name, c.num_workers, c.prefetch_factor or (2 if c.num_workers else "-"), c.batch_size,
                         f"{wait * 1e3:.1f}", f"{compute * 1e3:.1f}", f"{r.data_wait_fraction or 0:.0%}",
                         f"{r.samples_per_sec:,.0f}", f"{r.samples_per_sec / base:.2f}"])
        return rows

    def figure(self) -> Any:
        from matplotlib.figure import Figure

        runs = [*self.results, self.ceiling]
        names = [r.name for r in runs]
        fig = Figure(figsize=(11, 0.45 * len(runs) + 1.4), layout="constrained")
        left, right = fig.subplots(1, 2, sharey=True)
        split = np.array([step_split(r) for r in runs]) / np.array([[r.config.batch_size] for r in runs]) * 1e6
        y = np.arange(len(runs))
        left.barh(y, split[:, 1], color="C0", label="computing")
        left.barh(y, split[:, 0], left=split[:, 1], color="C1", label="waiting for data")
        left.set(yticks=y, yticklabels=names, xlabel="µs per sample", title="where a step's time goes")
        left.invert_yaxis()
        left.legend(loc="lower right", fontsize=8)
        rates = [r.samples_per_sec for r in runs]
        right.barh(y, rates, color=["C2"] * len(self.results) + ["C7"])
        right.axvline(self.ceiling.samples_per_sec, color="k", ls="--",
                      label="compute-bound ceiling\n(pre-loaded tensors)")
        right.set(xlabel="samples / s", title="throughput", xlim=(0, 1.35 * max(rates)))
        right.legend(loc="upper right", fontsize=8)
        return fig

    def extra_html(self) -> str:
        return figure_html(self.figure(), tight=False)
