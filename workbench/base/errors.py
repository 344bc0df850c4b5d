"""The workbench's own errors: a config or an argument that cannot work, said in one line with the fix."""

from __future__ import annotations

__all__ = ["ArgumentError", "ConfigError"]


class ConfigError(ValueError):
    """A RunConfig value that cannot work; the message names the field and the fix."""


class ArgumentError(ConfigError, TypeError):
    """A public function's argument that cannot work (base/arguments.py); the message names it
    and the fix. A ConfigError (a ValueError), and a TypeError: code that catches any of them,
    as callers did before, still does."""
