"""The workbench's own error: a config that cannot work, said in one line with the fix."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A RunConfig value that cannot work; the message names the field and the fix."""
