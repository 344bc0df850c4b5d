"""torchao, imported quietly and only when used, and the quantization configs the workbench names.

torchao is optional (the `quantization` extra). Importing it prints log lines about CUDA-only
extensions on a CPU machine; every import here is silenced, and a missing torchao is one
clear line with the install command. `intx_config(bits)` is the scheme both post-training
quantization (techniques) and quantization-aware training (the engine's `qat` switch) use.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

# --no-deps: torchao needs nothing else, and pip must not re-resolve (upgrade) torch.
TORCHAO_INSTALL_HINT = "pip install --no-deps 'torchao>=0.18,<0.19' (the 'quantization' extra)"
# Loggers that talk while torchao loads: its own ("Failed to load .../_C_cutlass_90a.so", the
# CUDA-only extensions of a CPU machine) and torch's pytree (an Enum registration notice).
_NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


@contextlib.contextmanager
def quiet_torchao_logs() -> Iterator[None]:
    """Silence the log lines torchao prints while it loads, for this block only.

    transformers also imports torchao whenever it is installed (its quantizer registry),
    so core/models.py loads the MiniLM inside this too. Errors still show.
    """
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def torchao_version() -> str | None:
    """The installed torchao version, or None (reads metadata; imports nothing)."""
    try:
        return importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return None


def torchao_available() -> bool:
    return importlib.util.find_spec("torchao") is not None


def import_torchao(module: str = "torchao.quantization") -> Any:
    """Import a torchao module quietly; one clear line if torchao is missing."""
    if not torchao_available():
        raise ImportError(f"torchao is not installed; {TORCHAO_INSTALL_HINT}")
    with quiet_torchao_logs(), warnings.catch_warnings():
        # pt2e imports torch.fx.experimental, which trips torch's own jit deprecation notice
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script_method` is deprecated")
        return importlib.import_module(module)


def linear_layers(model: nn.Module) -> list[str]:
    """Names of the nn.Linear modules in `model` (what these methods quantize)."""
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def require_linear(model: nn.Module) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}; "
                        "pass result.model from wb.run(..., keep_model=True)")
    if not linear_layers(model):
        raise ValueError(f"{type(model).__name__} has no nn.Linear layers, and quantization here targets "
                         "Linear weights; pass a model with Linear layers (e.g. model='mlp' or 'minilm')")


def config_by_name(name: str, **kwargs: Any) -> Any:
    """A torchao quantization config from its class name, e.g. "Int8WeightOnlyConfig".

    Example:
        >>> config_by_name("Int8DynamicActivationInt8WeightConfig")  # doctest: +SKIP
    """
    quantization = import_torchao()
    cls = getattr(quantization, name, None)
    if not (isinstance(cls, type) and name.endswith("Config")):
        known = sorted(n for n in dir(quantization) if n.endswith("Config") and not n.startswith("_"))
        raise ValueError(f"torchao {torchao_version()} has no quantization config {name!r}; "
                         f"use one of: {', '.join(known)}")
    try:
        return cls(**kwargs)
    except (AssertionError, TypeError, ValueError) as error:
        raise ValueError(f"{name}({_kwargs_text(kwargs)}) is not valid in torchao {torchao_version()}: "
                         f"{first_line(error)}") from error


def intx_config(bits: int, *, group_size: int | None = None) -> Any:
    """torchao config: int8 dynamic activations, `bits`-bit weights, one scale per output
    channel (group_size None) or per `group_size` weights of a row."""
    # bool is an int to Python: True would ask torch for dtype "intTrue" (an AttributeError).
    if isinstance(bits, bool) or not (isinstance(bits, int) and 1 <= bits <= 8):
        raise ValueError(f"bits={bits!r} must be a whole number from 1 to 8 (weights of int1..int8)")
    if group_size is not None and (isinstance(group_size, bool) or not (isinstance(group_size, int) and group_size > 0)):
        raise ValueError(f"group_size={group_size!r} must be a positive whole number, or None for per-channel")
    granularity = import_torchao("torchao.quantization.granularity")
    return config_by_name(
        "Int8DynamicActivationIntxWeightConfig", weight_dtype=getattr(torch, f"int{bits}"),
        weight_granularity=granularity.PerAxis(0) if group_size is None else granularity.PerGroup(group_size),
    )


def first_line(error: BaseException, limit: int = 120) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else ""
    line = line if len(line) <= limit else line[:limit - 3] + "..."  # configs print every field
    return f"{type(error).__name__}: {line}" if line else type(error).__name__


def _kwargs_text(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in kwargs.items())
