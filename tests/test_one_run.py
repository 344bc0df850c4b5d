"""Every committed notebook's outputs come from one Run All, top to bottom.

A notebook merged cell by cell from two branches keeps each cell's outputs from whichever side won:
04 once showed a 0-worker baseline of 14.6 ms a step in one cell and 111.1 ms for the same object
four cells later, and its exercise's checker expected 3.77x beside a table that said 4.22x (a fresh
read found it; the cells' execution counts repeated, 8, 8, 10, 10, and their timestamps were a day
apart). Here the execution counts of the executed code cells must rise cell after cell, and where the
executor recorded when each cell ran (nbconvert does), those times must rise too, within one sitting.
Re-execute the whole notebook (docs/NOTEBOOKS.md) to fix a failure; never a cell of it.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").rglob("*.ipynb"))
ONE_SITTING = dt.timedelta(hours=2)  # the longest notebook runs minutes; two runs of a merge were a day apart


def executed(cells: list[dict]) -> list[tuple[int, int, str | None]]:
    """(cell index, execution count, when it started) of each code cell that ran."""
    return [(i, c["execution_count"], (c.get("metadata", {}).get("execution") or {}).get("iopub.execute_input"))
            for i, c in enumerate(cells) if c["cell_type"] == "code" and c.get("execution_count") is not None]


def from_two_runs(cells: list[dict]) -> str | None:
    """Why these cells' outputs are not one Run All's (None: they are)."""
    ran = executed(cells)
    for (i, count, _), (j, later, _) in zip(ran, ran[1:]):
        if later <= count:
            return f"cell {j} ran as [{later}] after cell {i}'s [{count}]"
    times = [(i, dt.datetime.fromisoformat(when.replace("Z", "+00:00"))) for i, _, when in ran if when]
    for (i, at), (j, then) in zip(times, times[1:]):
        if then < at:
            return f"cell {j} ran at {then:%Y-%m-%d %H:%M}, before cell {i} ({at:%Y-%m-%d %H:%M})"
    if times and times[-1][1] - times[0][1] > ONE_SITTING:
        return f"cells {times[0][0]} to {times[-1][0]} ran {times[-1][1] - times[0][1]} apart"
    return None


def test_the_check_finds_cells_merged_from_two_runs():
    def cell(count, when=None):
        return {"cell_type": "code", "execution_count": count,
                "metadata": {"execution": {"iopub.execute_input": when}} if when else {}}

    assert from_two_runs([cell(1), {"cell_type": "markdown"}, cell(2), cell(3)]) is None
    assert from_two_runs([cell(1), cell(2), cell(2)]) == "cell 2 ran as [2] after cell 1's [2]"
    assert "before cell" in from_two_runs([cell(1, "2026-12-02T16:47:17Z"), cell(2, "2026-12-01T21:37:33Z")])
    assert "apart" in from_two_runs([cell(1, "2026-12-01T21:37:33Z"), cell(2, "2026-12-02T16:47:17Z")])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebooks_outputs_come_from_one_run_all(path):
    assert from_two_runs(json.loads(path.read_text())["cells"]) is None, path.name
