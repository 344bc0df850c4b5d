"""The configuration: `RunConfig`, every knob of a run, resolved from the preset and checked
before anything runs. It sits above the switches: a field's choices are its switch's registry,
and each switch's `check` runs here (`checks.py`).

    run_config.py   RunConfig, its fields and their resolution (the preset fills what is unset)
    checks.py       the checks of the resolved values: names, types, sizes, this machine, each switch's
"""

from workbench.core.config.run_config import ConfigError, RunConfig, field_choices, field_types

__all__ = ["ConfigError", "RunConfig", "field_choices", "field_types"]
