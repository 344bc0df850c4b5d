"""The notebooks show the code the learner takes home (issue 38): a technique's lines marked in a
notebook (`# + fp16: ...`) are plain PyTorch and the technique's own library, and each call they make
is one its take-home script in examples/ makes too.

Read from the committed notebooks' and scripts' text (no run: tests/test_examples.py runs the
scripts and holds them equal to wb.run). A marked line is compared by the calls it makes, by their
last name (`scaler.unscale_(...)` -> `unscale_`): the notebook's variables are its own (`batch["inputs"]`,
`c.max_grad_norm`), the calls are the technique.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r"#\s*\+\s*([\w\- /.]+?)\s*(?::|\(|$)")
CALL = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*\(")
PLAIN = {"len", "int", "str", "sum", "range", "next", "dict", "list", "min", "max", "print", "in", "is_available",
         "parameters", "device", "to"}  # Python's and torch's own, not a technique's

# Each marked technique and its take-home script. The marks without one are the workbench's own tools
# (the monitor, wb.launch, the planner: the course's subject there is the tool) or a step no script
# needs its own file for (the profiler and TF32 are a line in any of them; pt2e and selective
# checkpointing are Optional sections; the token count is 02's pitfall; multi-node flags are torchrun's).
EXAMPLE = {
    "fp16": "fp16_grad_scaler", "accelerate": "accelerate_mixed_precision", "accumulate": "accelerate_accumulate",
    "checkpointing": "activation_checkpointing", "workers": "dataloader_workers", "dali": "dali",
    "quantize": "int8_dynamic_quantization", "qat": "qat", "notebook_launcher": "ddp_notebook_launcher",
    "DDP": "ddp_notebook_launcher", "compile": "torch_compile", "sdpa": "sdpa_attention", "foreach": "fused_adamw",
    "fused": "fused_adamw", "channels_last": "channels_last", "freeze": "freezing", "lora": "lora",
    "8-bit state": "adamw_8bit", "shard": "fsdp2", "tensor parallel": "tensor_parallel",
    "pipeline parallel": "pipeline_parallel",
}
WORKBENCH_TOOLS = {"monitor", "launch", "estimate", "plan", "step 3 as it runs", "accelerate estimate-memory"}
NO_SCRIPT = {"profiler", "tf32", "pt2e", "selective", "token count", "all_reduce", "multi-node", "elastic"}
# Calls a notebook's marked line makes that its script writes another way, each with why.
WRITTEN_OTHERWISE = {
    ("notebook_launcher", "reporting"): "06 returns each process's result through bounded_launch's queue",
    ("dali", "file_list"): "04's image files object writes the 'path label' list; the script writes files.txt",
    ("foreach", "adamw"): "08 makes each AdamW through a small factory; the script calls torch.optim.AdamW",
    ("fused", "adamw"): "the same",
    ("8-bit state", "weights"): "09 hands each optimizer a fresh copy of the weights",
    ("pipeline parallel", "Schedule"): "10 picks ScheduleGPipe or Schedule1F1B by name; the script runs GPipe",
}


def marked_lines(source: str) -> list[tuple[str, str]]:
    """(mark, code) of each line marked `# + mark`."""
    found = []
    for line in source.splitlines():
        code, _, comment = line.partition("#")
        mark = MARK.search("#" + comment) if comment else None
        if mark:
            found.append((mark.group(1).strip(), code))
    return found


def calls(code: str) -> set[str]:
    return {name.split(".")[-1] for name in CALL.findall(code)} - PLAIN


def notebook_marks() -> dict[str, list[tuple[str, int, str]]]:
    """mark -> (notebook, cell, code) of every marked line in the course's notebooks."""
    marks: dict[str, list[tuple[str, int, str]]] = {}
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "code":
                for mark, code in marked_lines("".join(cell["source"])):
                    marks.setdefault(mark, []).append((path.stem[:2], index, code))
    return marks


MARKS = notebook_marks()


def test_the_reader_finds_marks_and_calls():
    assert marked_lines('x = torch.compile(m)  # + compile: once\ny = 1  # not marked\n') == [("compile", "x = torch.compile(m)  ")]
    assert calls("scaler.scale(loss).backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1)") == {
        "scale", "backward", "clip_grad_norm_"}


def test_every_mark_in_the_notebooks_is_a_technique_with_a_script_a_tool_or_said_why_not():
    unknown = set(MARKS) - set(EXAMPLE) - WORKBENCH_TOOLS - NO_SCRIPT
    assert not unknown, f"marks with no script and no reason here: {sorted(unknown)}"
    assert all((ROOT / "examples" / f"{name}.py").exists() for name in EXAMPLE.values())


def test_no_techniques_marked_line_calls_the_workbench_or_a_lesson():
    offending = [(nb, cell, code.strip()) for mark, lines in MARKS.items() if mark not in WORKBENCH_TOOLS
                 for nb, cell, code in lines if re.search(r"\b(wb|lesson)\.", code)]
    assert not offending, offending


def test_every_call_written_otherwise_is_still_one_a_notebook_marks_and_its_script_lacks():
    for (mark, name), why in WRITTEN_OTHERWISE.items():
        script = (ROOT / "examples" / f"{EXAMPLE[mark]}.py").read_text()
        assert why and name not in calls(script), (mark, name)
        assert any(name in calls(code) for _, _, code in MARKS.get(mark, [])), (mark, name)


@pytest.mark.parametrize("mark", sorted(set(MARKS) & set(EXAMPLE)))
def test_each_call_a_notebook_marks_is_one_its_take_home_script_makes(mark):
    script = (ROOT / "examples" / f"{EXAMPLE[mark]}.py").read_text()
    makes = calls(script)
    missing = {(nb, cell, name) for nb, cell, code in MARKS[mark] for name in calls(code)
               if name not in makes and (mark, name) not in WRITTEN_OTHERWISE}
    assert not missing, f"examples/{EXAMPLE[mark]}.py makes none of these calls the notebooks mark '{mark}': {sorted(missing)}"
