"""Loading a data set by name, and the seeded DataLoader every run uses.

Example:
    >>> data = load_data("mnist", max_train=512)
    >>> loader = build_dataloader(data.train, batch_size=64, shuffle=True, seed=0)
    >>> next(iter(loader))["inputs"].shape
    torch.Size([64, 1, 28, 28])
"""

from __future__ import annotations

import functools
import multiprocessing.context
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from workbench.base.arguments import SEED_LIMIT, ArgumentError, shown, whole_number
from workbench.core.data.catalog import DATASETS, DataBundle, _lm_sizes, check_name
from workbench.core.data.files import load_image_files
from workbench.core.data.tables import load_table


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, seq_len: int, max_train: int | None, max_test: int | None, seed: int) -> DataBundle:
    if name == "mnist_files":  # image files decoded per sample: the input-pipeline data set
        return load_image_files(max_train=max_train, max_test=max_test, seed=seed)
    return load_table(name, seq_len, max_train, max_test, seed)


def load_data(name: str, *, seq_len: int = 128, max_train: int | None = None,
              max_test: int | None = None, seed: int = 0) -> DataBundle:
    """Load a data set by name (see DATASETS) or "hub:<id>" (needs internet).

    seq_len applies to text sets only. max_train keeps the first N training
    examples after shuffling with `seed`; max_test does the same with a fixed
    seed, as is the train/test split, so every run is scored on the same
    examples (N above the size keeps everything). Results are cached in-process, so
    notebooks that run many trainings on the same data load it once.

    Example:
        >>> data = load_data("rotten_tomatoes", seq_len=64, max_train=1000)
        >>> data.train[0]["inputs"].shape, data.num_classes, data.pad_token_id
        (torch.Size([64]), 2, 0)
    """
    check_name(name)
    for field, value in (("max_train", max_train), ("max_test", max_test)):
        if value is not None:
            whole_number(field, value, example=f"{field}=1000 (a number of examples), or None for all")
    whole_number("seed", seed, least=0, most=SEED_LIMIT - 1, example="seed=0")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2 or (name == "rotten_tomatoes_lm" and _lm_sizes(seq_len)[0] < 1):
        raise ArgumentError(f"seq_len={shown(seq_len)} must be at least 2 and leave training windows")
    is_image = DATASETS[name].task == "image_classification" if name in DATASETS else False
    # Images ignore seq_len: normalise it so the cache is shared across values.
    return _load_cached(name, 0 if is_image else seq_len, max_train, max_test, seed)


def build_dataloader(dataset: TorchDataset, *, batch_size: int, shuffle: bool, seed: int,
                     num_workers: int = 0, pin_memory: bool = False, prefetch_factor: int | None = None,
                     persistent_workers: bool = False, drop_last: bool = True,
                     collate_fn: Callable[[list], Any] | None = None) -> DataLoader:
    """A DataLoader whose shuffling order depends only on `seed` (`collate_fn`: None for torch's default).

    Example:
        >>> loader = build_dataloader(load_data("digits").train, batch_size=32, shuffle=True, seed=0)
        >>> {k: v.shape for k, v in next(iter(loader)).items()}
        {'inputs': torch.Size([32, 1, 8, 8]), 'labels': torch.Size([32])}
    """
    kwargs: dict[str, Any] = {} if collate_fn is None else {"collate_fn": collate_fn}
    if num_workers > 0:  # DataLoader rejects these without worker processes
        kwargs.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                      multiprocessing_context=_worker_context())
    # A private generator: reproducible order that other code's use of the
    # global RNG cannot disturb; it also seeds the workers' base seed.
    generator = torch.Generator().manual_seed(seed)
    # Pinning only helps host->accelerator copies; without CUDA it just warns.
    return _Loader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator,
                      num_workers=num_workers, pin_memory=pin_memory and torch.cuda.is_available(),
                      drop_last=drop_last, **kwargs)



# Ctrl-C while DataLoader workers start. A fork runs Python's at-fork hooks (logging's
# _releaseLock among them) in the parent, and an exception raised inside a hook is printed
# as "Exception ignored" and dropped: a Ctrl-C that lands there was lost and the run went
# on to 'ok' (measured: 4 of 10 interrupts sent 1-20 ms after a 2-worker run started).
# Workers therefore start through a context whose Process.start() holds SIGINT (records it)
# and the loop raises it at the next batch (`raise_held_interrupt`), outside any hook and
# once the iterator is whole, so its workers are shut down, not leaked.
_held: list[Callable[..., Any]] = []


@contextmanager
def _holding_interrupts() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield  # only the main thread handles signals; SIG_IGN / SIG_DFL are left as they are
        return
    signal.signal(signal.SIGINT, lambda signum, frame: _held.append(previous))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def raise_held_interrupt() -> None:
    """Deliver a Ctrl-C that arrived while a worker forked (KeyboardInterrupt, as the
    handler in force then would have raised it)."""
    if _held:
        handler = _held[0]
        _held.clear()
        handler(signal.SIGINT, None)


class _ForkHoldingInterrupts(multiprocessing.context.ForkProcess):
    def start(self) -> None:
        with _holding_interrupts():
            super().start()


class _ForkContext(multiprocessing.context.ForkContext):
    Process = _ForkHoldingInterrupts


def _worker_context() -> multiprocessing.context.BaseContext | None:
    """The fork context that holds Ctrl-C during a fork; None (torch's default) where the
    start method is not fork (spawned workers run no at-fork hooks here)."""
    # Unset, the default is the first of get_all_start_methods() (fork on Linux up to 3.13).
    method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    return _ForkContext() if method == "fork" else None


class _Loader(DataLoader):
    """A DataLoader that raises a Ctrl-C held while its workers started, once they have."""

    def __iter__(self) -> Any:
        iterator = super().__iter__()
        raise_held_interrupt()
        return iterator
