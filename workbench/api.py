"""The public entry points that join the layers: a run or a launch, shown live by default.

The engine trains and emits records; the views draw them. Neither imports the other, so
the choice of view for a call that names none (the live dashboard in a notebook, a text
log everywhere else) is made here, at the top, where both may be used.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from workbench.base.arguments import checked_torch_device
from workbench.core import custom
from workbench.core.config import RunConfig, run_config
from workbench.core.engine import monitor as _monitor
from workbench.core.engine import train as _train
from workbench.core.measure.records import Sink
from workbench.core.measure.result import RunResult
from workbench.core.switches import data_loading, optimizer
from workbench.core.views.dashboard import default_sinks
from workbench.launching import launch as _launch
from workbench.machine.hardware import resolve_device
from workbench.planner.fit import check_fits

if TYPE_CHECKING:
    import torch


def run(config: RunConfig, *, sinks: Iterable[Sink] | None = None, name: str | None = None,
        keep_model: bool = False) -> RunResult:
    """Train one run and measure it (`workbench.core.engine.train.run`), shown live.

    sinks: where the records go; None: the live dashboard in a notebook, a text log elsewhere.

    Example:
        >>> result = run(RunConfig(model="mlp", steps=20, preset="cpu-quick"), name="baseline")  # doctest: +SKIP
    """
    return _train.run(config, sinks=default_sinks() if sinks is None else sinks, name=name, keep_model=keep_model,
                      check_fit=check_fits)  # the planner's fit check, passed down: the engine never imports it


def launch(config: RunConfig, *, num_processes: int = 2, name: str | None = None,
           sinks: Iterable[Sink] | None = None, **kwargs: Any) -> RunResult:
    """`config` data-parallel on `num_processes` processes (`workbench.launching.launch.launch`),
    rank 0's records shown live; None sinks: the dashboard in a notebook, text elsewhere."""
    return _launch.launch(config, num_processes=num_processes, name=name,
                          sinks=default_sinks() if sinks is None else sinks, **kwargs)


def monitor(model: Any, optimizer: Any = None, *, steps: int, name: str = "hand-written loop",
            sinks: Iterable[Sink] | None = None, **kwargs: Any) -> _monitor.Monitor:
    """Measure a hand-written loop (`workbench.core.engine.monitor.monitor`), shown live; None sinks:
    the dashboard in a notebook, text elsewhere."""
    return _monitor.monitor(model, optimizer, steps=steps, name=name,
                            sinks=default_sinks() if sinks is None else sinks, **kwargs)


run.__doc__ = f"{run.__doc__}\n\n{_train.run.__doc__}"
launch.__doc__ = f"{launch.__doc__}\n\n{_launch.launch.__doc__}"
monitor.__doc__ = f"{monitor.__doc__}\n\n{_monitor.monitor.__doc__}"


class TrainingParts(NamedTuple):
    config: RunConfig
    model: Any
    optimizer: Any
    batches: Iterator[dict]


def training_parts(config: RunConfig, *, device: str | torch.device | None = None) -> TrainingParts:
    """What `run(config)` trains with, for a loop written by hand: the resolved config, the
    model (the same seeded weights, on `device`), its optimizer, and an endless iterator of
    batches (a new seeded shuffle each pass, as `run()`'s), each already on `device`.

    So a hand loop and `run()` with the same switch can be compared step for step
    (`wb.agree`). `device` defaults to the config's.

    Example:
        >>> c, model, optimizer, batches = training_parts(RunConfig(model="mlp"))  # doctest: +SKIP
    """
    c = run_config(config)
    device = resolve_device(c.device) if device is None else checked_torch_device(device)
    bundle = custom.load_bundle(c)  # what run() trains on, built the way run() builds it
    model = custom.load_model(c, bundle).to(device)
    loader = data_loading.loader(bundle.train, c, bundle.collate_fn)
    optim = optimizer.apply(model, c)

    def batches() -> Iterator[dict]:
        while True:  # itertools.cycle would replay the first pass's order; run() reshuffles each pass
            for batch in loader:
                yield {k: v.to(device) for k, v in batch.items()}

    return TrainingParts(c, model, optim, batches())
