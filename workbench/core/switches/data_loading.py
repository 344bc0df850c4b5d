"""The input pipeline (`num_workers`, `pin_memory`, `prefetch_factor`, `persistent_workers`), a
loop switch: the seeded DataLoader and what the Accelerator is given. The loop times the fetch;
the estimate holds the loader's next batch on a CPU (planner.fakestep)."""

from __future__ import annotations

from typing import Any

from workbench.base.errors import ConfigError
from workbench.core import limits
from workbench.core.data import build_dataloader


def check(r: dict[str, Any]) -> None:
    """Knobs that need workers have them; the workers fit this machine."""
    if r["num_workers"] == 0 and (r["prefetch_factor"] is not None or r["persistent_workers"]):
        knob = "prefetch_factor" if r["prefetch_factor"] is not None else "persistent_workers"
        raise ConfigError(f"{knob} needs worker processes; set num_workers >= 1 or leave {knob} unset")
    if r["prefetch_factor"] is not None and r["prefetch_factor"] < 1:
        raise ConfigError(f"prefetch_factor={r['prefetch_factor']} must be at least 1")
    if problem := limits.workers_problem(r["num_workers"]):
        raise ConfigError(problem)


def loader(dataset: Any, cfg: Any, collate_fn: Any = None) -> Any:
    """The training DataLoader: seeded, shuffled, with the config's workers, pinning and prefetch."""
    return build_dataloader(dataset, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed,
                            num_workers=cfg.num_workers, pin_memory=cfg.pin_memory,
                            prefetch_factor=cfg.prefetch_factor, persistent_workers=cfg.persistent_workers,
                            collate_fn=collate_fn)


def accelerator_kwargs(cfg: Any) -> dict[str, Any]:
    """With pinned batches the host-to-GPU copy can be asynchronous (non_blocking): it overlaps
    the previous step's GPU work."""
    # lazy: a RunConfig stays free of accelerate (tests/test_import.py); only a run needs it
    from accelerate.utils import DataLoaderConfiguration

    return {"dataloader_config": DataLoaderConfiguration(non_blocking=cfg.pin_memory)}
