"""The optional DALI dependency: notebook 04 writes the DALI pipeline by hand and skips it
where DALI is missing; the lesson module only says whether it can be imported, importing nothing."""

from __future__ import annotations

import json
import subprocess
import sys

from workbench.lessons import input_pipelines as lesson


def test_dali_available_answers_without_importing_dali() -> None:
    code = ("import sys, json; from workbench.lessons import input_pipelines as l; "
            "a = l.dali_available(); print(json.dumps([a, 'nvidia.dali' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    available, imported = json.loads(out.strip().splitlines()[-1])
    assert isinstance(available, bool) and imported is False


def test_the_install_command_names_the_dali_package() -> None:
    assert lesson.INSTALL_COMMAND == "pip install nvidia-dali-cuda120"
