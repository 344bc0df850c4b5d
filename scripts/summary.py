"""docs/SUMMARY.md from the executed notebooks: every notebook's "Claims checked" table, on one page.

Each notebook ends its core path with a cell tagged `claims` whose last expression is
`wb.claims(notebook, device, rows)`. This reads that cell's saved output in the committed
notebooks (`notebooks/`, the CPU run their outputs come from) and in the GPU reference
(`docs/gpu-reference/run*/notebooks/`, the latest run that executed a notebook), and writes the
tables, with a count of the verdicts, to docs/SUMMARY.md. Nothing is typed by hand, so the page
cannot quote an older run than the notebooks hold; `tests/test_summary.py` fails when the
committed page differs from what this makes.

    python scripts/summary.py            # rewrite docs/SUMMARY.md
    python scripts/summary.py --check    # exit 1 when docs/SUMMARY.md is stale

The output read is the cell's text/plain: the caption line "Claims checked: NN on DEVICE", a
header row, then one row per claim, each column padded to the header's column (at least two
spaces apart). A notebook without such a cell gets a line saying so.
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib
import re
import sys
from dataclasses import dataclass

from workbench.core.atomic_write import write_whole

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEADER = ("claim", "source", "measured here", "verdict")
VERDICTS = ("holds", "holds in part", "does not hold here", "not shown here")
CAPTION = re.compile(r"^Claims checked: (?P<notebook>\S+) on (?P<device>.+?)\s*$")


@dataclass(frozen=True)
class Table:
    notebook: str
    device: str
    rows: tuple[tuple[str, str, str, str], ...]


def _columns(header: str) -> list[int]:
    """Where each column starts, from the header line (text_table pads every row to it)."""
    starts, at = [], 0
    for name in HEADER:
        at = header.find(name, at)
        if at < 0:
            raise ValueError(f"not a claims header (claim, source, measured here, verdict): {header!r}")
        starts.append(at)
        at += len(name)
    return starts


def parse_text(text: str) -> Table | None:
    """The claims table in a text/plain output, or None when there is none."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        caption = CAPTION.match(line)
        if caption is None or i + 1 >= len(lines):
            continue
        starts = _columns(lines[i + 1])
        rows = []
        for row in lines[i + 2:]:
            if not row.strip():
                break
            bounds = starts[1:] + [None]
            cells = tuple(row[a:b].strip() for a, b in zip(starts, bounds))
            if len(row) <= starts[-1] or re.search(r"\S", row[starts[-1] - 2:starts[-1]]):
                raise ValueError(f"a claims row does not line up with its header: {row!r}")
            rows.append(cells)
        return Table(caption["notebook"], caption["device"], tuple(rows))
    return _parse_repr(text)


def _parse_repr(text: str) -> Table | None:
    """`Claims(notebook=..., device=..., checked=(...))`: the dataclass's own repr, which is what
    Jupyter saves as text/plain while `Claims` keeps dataclass's generated __repr__."""
    text = text.strip()
    if not text.startswith("Claims("):
        return None
    call = ast.parse(text, mode="eval").body
    fields = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    return Table(fields["notebook"], fields["device"], tuple(tuple(map(str, r)) for r in fields["checked"]))


def claims_of(path: pathlib.Path) -> Table | str:
    """The notebook's claims table, or a sentence saying why there is none."""
    cells = [c for c in json.loads(path.read_text())["cells"] if "claims" in c.get("metadata", {}).get("tags", [])]
    if not cells:
        return "no cell tagged `claims`"
    for cell in cells:
        for output in cell.get("outputs", []):
            text = "".join(output.get("data", {}).get("text/plain", "")) or "".join(output.get("text", ""))
            try:
                table = parse_text(text)
            except (ValueError, SyntaxError, KeyError) as e:  # the page still lists every other notebook
                return f"its claims table could not be read ({e})"
            if table is not None:
                return table
    return "its `claims` cell has no saved claims table (not executed, or it failed)"


def gpu_reference(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Per notebook name, its executed copy from the latest GPU run that has it."""
    latest: dict[str, pathlib.Path] = {}
    runs = sorted((root / "docs" / "gpu-reference").glob("run*/notebooks"), key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0))
    for run in runs:
        for path in run.glob("[0-9][0-9]_*.ipynb"):
            latest[path.stem] = path
    return latest


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _verdict(verdict: str) -> str:
    return max((v for v in VERDICTS if verdict.startswith(v)), key=len, default="other")  # "holds in part" over "holds"


def _section(label: str, where: str, found: Table | str) -> list[str]:
    if isinstance(found, str):
        return [f"**{label}** (`{where}`): {found}.", ""]
    lines = [f"**{label}** (`{where}`, {found.notebook} on {found.device}):", "",
             "| claim | source | measured here | verdict |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in found.rows]
    return lines + [""]


def render(root: pathlib.Path = ROOT) -> str:
    notebooks = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    gpu = gpu_reference(root)
    found = {p.stem: (claims_of(p), claims_of(gpu[p.stem]) if p.stem in gpu else None) for p in notebooks}
    tally = {"here": dict.fromkeys(VERDICTS, 0), "GPU reference": dict.fromkeys(VERDICTS, 0)}
    for here, there in found.values():
        for machine, table in (("here", here), ("GPU reference", there)):
            if isinstance(table, Table):
                for row in table.rows:
                    key = _verdict(row[3])
                    tally[machine][key] = tally[machine].get(key, 0) + 1
    lines = [
        "# Every technique's claims, measured, on one page",
        "",
        "<!-- generated by scripts/summary.py from the notebooks' `claims` cells: do not edit by hand -->",
        "",
        "Each notebook checks the claims its technique is known for against what it measured, in a cell",
        "tagged `claims` (`wb.claims(...)`). This page is those tables, read from the **committed, executed",
        "notebooks**: `notebooks/` (the CPU run their saved outputs come from: the `cpu-quick` preset on",
        "the project's 2-core CPU) and `docs/gpu-reference/run*/notebooks/` (one NVIDIA H200, preset `gpu`,",
        "steps capped; the latest run that executed the notebook). Regenerate it after re-executing a",
        "notebook: `python scripts/summary.py` (`tests/test_summary.py` fails while it is stale).",
        "Which technique to reach for, and what goes wrong with each: [DECIDE.md](DECIDE.md).",
        "",
        "| verdicts | " + " | ".join(VERDICTS) + " |",
        "|---|" + "---:|" * len(VERDICTS),
    ]
    for machine, counts in tally.items():
        lines.append(f"| {machine} | " + " | ".join(str(counts[v]) for v in VERDICTS) + " |")
    lines.append("")
    for name, (here, there) in found.items():
        lines += [f"## {name}", ""]
        lines += _section("Here", f"notebooks/{name}.ipynb", here)
        if there is None:
            lines += ["**GPU reference**: not run on the GPU reference yet.", ""]
        else:
            lines += _section("GPU reference", str(gpu[name].relative_to(root)), there)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when docs/SUMMARY.md is stale")
    args = parser.parse_args(argv)
    target, text = ROOT / "docs" / "SUMMARY.md", render()
    if args.check:
        if target.read_text() != text:
            print("stale: docs/SUMMARY.md differs from the notebooks' claims; run python scripts/summary.py")
            return 1
        return 0
    try:  # whole or not at all: a full disk leaves the last SUMMARY.md
        write_whole(target, text)
    except OSError as error:
        print(f"error: {target.relative_to(ROOT)} could not be written ({error.strerror or error}); it is unchanged",
              file=sys.stderr)
        return 1
    print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
