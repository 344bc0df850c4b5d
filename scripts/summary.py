"""docs/SUMMARY.md from the executed notebooks: every notebook's "Claims checked" table, on one page.

Each notebook ends its core path with a cell tagged `claims` whose last expression is
`wb.claims(notebook, device, rows)`. This reads that cell's saved output in the committed
notebooks (`notebooks/`, the CPU run their outputs come from) and in the GPU reference
(`docs/gpu-reference/run*/notebooks/`, the latest run that executed a notebook), and writes the
tables, with a count of the verdicts, to docs/SUMMARY.md. Where a GPU run has no claims table (its
notebooks predate the claims cells), the figures `scripts/gpu_check.py` recorded for that notebook in
`run*/summary.json` are listed instead, as recorded: no verdict is made up for them. Nothing is typed by hand, so the page
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

from workbench.base.atomic_write import write_whole

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


def gpu_records(root: pathlib.Path) -> dict[str, list[tuple[str, dict, dict]]]:
    """Per notebook name, (run folder, its entry, the machine) from every GPU run's summary.json
    that recorded it, the latest run first (scripts/gpu_check.py's format)."""
    found: dict[str, list[tuple[str, dict, dict]]] = {}
    runs = sorted((root / "docs" / "gpu-reference").glob("run*/summary.json"),
                  key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0), reverse=True)
    for path in runs:
        record = json.loads(path.read_text())
        for name, entry in record.get("notebooks", {}).items():
            found.setdefault(name, []).append((path.parent.name, entry, record.get("machine", {})))
    return found


def _number(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"


def _flat(value) -> str:
    """A recorded figure in one line: numbers as `_number` writes them, nested records in brackets."""
    if isinstance(value, dict):
        return ", ".join(f"{k} ({_flat(v)})" if isinstance(v, dict) else f"{k} {_flat(v)}"
                         for k, v in value.items() if v is not None)
    if isinstance(value, list):
        return " ".join(f"[{_flat(v)}]" for v in value)
    return _number(value)


def _recorded(name: str, records: list[tuple[str, dict, dict]]) -> list[str]:
    """What the GPU check recorded for one notebook, run by run: no claims table, so no verdicts."""
    lines = []
    for run, entry, machine in records:
        where = f"docs/gpu-reference/{run}/summary.json"
        status = entry.get("status", "?") + (f" ({entry['error']})" if entry.get("error") else "")
        lines += [f"**GPU reference, recorded** (`{where}`, {machine.get('gpu', 'GPU')}, torch {machine.get('torch', '?')}; "
                  f"no claims cell in that run, so no verdicts): {status}, {_number(entry.get('seconds'))} s.", ""]
        claims = entry.get("claims") or {}
        runs, seen = [], set()
        for r in claims.get("runs", []):
            if r["name"] not in seen:
                seen.add(r["name"])
                runs.append(r)
        if runs:
            lines += ["| run | precision | batch x accum | steps | ms / step | samples / s | peak (GiB) | MFU |",
                      "|---|---|---|---:|---:|---:|---:|---:|"]
            for r in runs:
                ms = f"{r['step_time_s'] * 1000:.1f}" if r.get("step_time_s") else "-"
                sps = f"{r['samples_per_sec']:,.0f}" if r.get("samples_per_sec") else "-"
                peak = f"{r['peak_bytes'] / 2**30:.2f}" if r.get("peak_bytes") else "-"
                mfu = f"{r['mfu']:.3f}" if r.get("mfu") is not None else "-"
                lines.append(f"| {_cell(r['name'])} | {r.get('precision')} | {r.get('batch_size')} x {r.get('grad_accum_steps')} "
                             f"| {r.get('steps')} | {ms} | {sps} | {peak} | {mfu} |")
            lines.append("")
        figures = {k: v for k, v in claims.items() if k != "runs"}
        if figures:
            lines.append("Figures the check computed: " + "; ".join(f"`{k}` {_cell(_flat(v))}" for k, v in figures.items()) + ".")
            lines.append("")
        for skipped in entry.get("skipped", []):
            lines += [f"- {_cell(skipped)}"]
        if entry.get("skipped"):
            lines.append("")
    return lines


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
    gpu, recorded = gpu_reference(root), gpu_records(root)
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
        "the project's 2-core CPU) and `docs/gpu-reference/run*/` (the GPU check, `scripts/gpu_check.py`;",
        "the latest run that executed the notebook). A GPU run whose notebooks have no claims cell gives no",
        "verdicts: what it recorded in its `summary.json` is listed instead, as recorded, and",
        "[gpu-reference/README.md](gpu-reference/README.md) says from which commit it is. Regenerate this",
        "page after re-executing a notebook: `python scripts/summary.py` (`tests/test_summary.py` fails",
        "while it is stale).",
        "Which technique to reach for, and what goes wrong with each: [DECIDE.md](DECIDE.md).",
        "",
        "| verdicts | " + " | ".join(VERDICTS) + " |",
        "|---|" + "---:|" * len(VERDICTS),
    ]
    gpu_tables = any(isinstance(there, Table) for _, there in found.values())
    for machine, counts in tally.items():
        if machine == "here" or gpu_tables:
            lines.append(f"| {machine} | " + " | ".join(str(counts[v]) for v in VERDICTS) + " |")
    lines.append("")
    if not gpu_tables:
        lines += ["No verdicts from a GPU yet: no GPU run here has a notebook with a claims table. "
                  + (f"The GPU check's records ({len(recorded)} notebooks) are listed per notebook below."
                     if recorded else "No GPU run is recorded here."), ""]
    for name, (here, there) in found.items():
        lines += [f"## {name}", ""]
        lines += _section("Here", f"notebooks/{name}.ipynb", here)
        if isinstance(there, Table):
            lines += _section("GPU reference", str(gpu[name].relative_to(root)), there)
        elif name in recorded:
            lines += _recorded(name, recorded[name])
        elif there is None:
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
