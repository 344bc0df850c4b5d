"""Every figure in prose tied to its source: README.md, docs/*.md and the notebooks' markdown.

The rules are docs/NOTEBOOKS.md's "Figures in prose". A number a reader meets is one of:

- **generated**: between `<!-- figure NN § Heading | regex -->` and `<!-- /figure -->` (written by
  `scripts/course_facts.py` from the committed notebook's outputs), in a `<!-- course-facts: ... -->`
  table, or in docs/SUMMARY.md (generated whole): not checked here;
- **cited**: its sentence (a table's cell; else its paragraph, else the table's header row) cites
  `NN § Heading`, and a cell of that section tagged `nbval-check-output` prints it (as written, or
  rounded to the prose's digits): nbval holds those outputs, so a re-execution cannot change it
  unseen. A notebook's markdown always cites its own compared outputs;
- **the GPU reference**: its sentence names the `H200` and the number is in that check's records
  (`docs/gpu-reference/run*/`; only the runs the sentence names, if it names any);
- **a reference**: its sentence names a docs/SOURCES.md source, a data sheet or a model card;
- **dated**: its sentence says "measured YYYY-MM-DD" (a one-off no notebook repeats);
- **a definition**: it lies in a phrase of docs/NOTEBOOKS.md's ```definitions block.

Not figures: code, link targets, versions, dates, years, §4.1, issue and arXiv numbers, the seeds'
names, hyphenated words (8-bit), shapes (8x8), the header's "Time: about N minutes"
(tests/test_course.py), products worked out in the text (checked here), bare integers under 100
without a unit. "cell N" is refused (but for a GPU run's record: `run1 01 cell 26`).

    python scripts/prose_figures.py            # every figure not tied to its source; exit 1 if any
    python scripts/prose_figures.py --explain  # also how each tied figure is tied
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import sys
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parent.parent
GENERATED_WHOLE = ("docs/SUMMARY.md",)
FIGURE_SPAN = re.compile(r"(?<!`)<!-- figure (?P<cite>[^|>]+?) \| (?P<pattern>.+?) -->(?P<value>.*?)<!-- /figure -->", re.S)
BLOCK = re.compile(r"<!-- course-facts: (\S+) -->.*?<!-- /course-facts: \1 -->", re.S)
CITATION = re.compile(r"(?:(?<![\w])(?P<nb>\d\d|room) )?§ (?P<heading>[^)\];|,\n]+)")
CELL_NUMBER = re.compile(r"\b(?:\d\d )?cells? \d+", re.I)
UNIT = re.compile(r"\s?(?:ms|µs|s|sec|seconds?|min|minutes?|h|hours?|B|bytes?|KB|KiB|MB|MiB|GB|GiB|TB|TiB|"
                  r"FLOPs?|[GT]?FLOP/s|samples/s|tokens/s|points?)(?![\w])")
# a number: digits with thousands separators, decimals, an exponent; x before or after is a ratio
NUMBER = re.compile(r"(?<![\w.])(?P<pre>[x×~±+\-−]?)(?P<num>\d+(?:,\d{3})*(?:\.\d+)*(?:e[-+]?\d+)?)"
                    r"(?P<scale>[kMB])?(?P<post>[x×%]|)(?![\w])")
VERSION_WORDS = re.compile(r"(?:torch|pytorch|python|cuda|cu|accelerate|transformers|datasets|peft|torchao|nbformat|"
                           r"jupyterlab|jupyter|node\.js|numpy|pandas|mlxtend|pip|uv|CC BY|version|>=|<=|==|~=)\s*$", re.I)
# the rest of a list or range of versions: "Python 3.11, 3.12 or 3.13", "Python 3.12 and 3.13", "Python 3.11-3.13"
VERSION_LIST = re.compile(VERSION_WORDS.pattern[:-len(r"\s*$")] + r"\s*\d+(?:\.\d+)+"
                          r"(?:(?:,\s*|\s+and\s+|\s+or\s+|[-–])\d+(?:\.\d+)+)*(?:,\s*|\s+and\s+|\s+or\s+|[-–])$", re.I)
SCALE = {"k": 1e3, "M": 1e6, "B": 1e9}
ARITHMETIC = re.compile(r"(?<![\w.])\d[\d,]*(?:\s*[×*]\s*\d[\d,]*)+\s*=\s*\d[\d,]*(?![\w,]|\.\d)")
# SOURCES.md names that are also a tool's or a module's name: prose names them without quoting them
TOOL_NAMES = {"torchao", "NVIDIA DALI", "nanoGPT", "torch.utils.data", "torch.utils.checkpoint"}


@dataclass
class Cell:
    id: str
    compared: bool  # tagged nbval-check-output: nbval holds its output to the committed one
    text: str
    _figures: list | None = None

    @property
    def figures(self) -> list:
        if self._figures is None:
            self._figures = numbers(self.text)
        return self._figures


@dataclass
class Notebook:
    key: str
    path: pathlib.Path
    cells: list[Cell] = field(default_factory=list)
    sections: list[tuple[str, str, list[Cell]]] = field(default_factory=list)  # (normalised, heading, cells)
    prose: list[tuple[str, str]] = field(default_factory=list)  # (cell id, markdown)


def _outputs_text(cell: dict) -> str:
    parts = []
    for output in cell.get("outputs", []):
        for text in (output.get("text"), output.get("data", {}).get("text/plain")):
            if text:
                parts.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(parts)


def normalise_heading(text: str) -> str:
    text = re.sub(r"[*`_]", "", text).replace("’", "'")
    return re.sub(r"\s+", " ", text).strip().rstrip(":.").lower()


def _headings(markdown: str) -> list[tuple[int, str]]:
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return [(len(m.group(1)), m.group(2)) for m in re.finditer(r"^(#{1,6}) (.+)$", text, re.M)]


def notebook_key(path: pathlib.Path) -> str:
    return path.stem[:2] if path.stem[:2].isdigit() else path.stem


def load_notebook(path: pathlib.Path) -> Notebook:
    nb = Notebook(notebook_key(path), path)
    stack: list[tuple[int, list[Cell]]] = []
    for raw in json.loads(path.read_text())["cells"]:
        source = "".join(raw["source"]) if isinstance(raw["source"], list) else raw["source"]
        if raw["cell_type"] == "markdown":
            nb.prose.append((raw.get("id", "?"), source))
            for level, heading in _headings(source):
                while stack and stack[-1][0] >= level:
                    stack.pop()
                cells: list[Cell] = []
                nb.sections.append((normalise_heading(heading), heading, cells))
                stack.append((level, cells))
        elif raw["cell_type"] == "code":
            cell = Cell(raw.get("id", "?"), "nbval-check-output" in raw.get("metadata", {}).get("tags", []),
                        _outputs_text(raw))
            nb.cells.append(cell)
            for _, cells in stack:
                cells.append(cell)
    return nb


def notebooks(root: pathlib.Path = ROOT) -> dict[str, Notebook]:
    paths = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")) + sorted((root / "notebooks" / "teacher").glob("*.ipynb"))
    return {notebook_key(p): load_notebook(p) for p in paths}


def section(nb: Notebook, heading: str) -> list[Cell] | str:
    """The cells under the one heading that `heading` starts (normalised), or why there is none."""
    want = normalise_heading(heading)
    exact = [cells for norm, _, cells in nb.sections if norm == want]
    found = exact or [cells for norm, _, cells in nb.sections if norm.startswith(want)]
    if len(found) == 1:
        return found[0]
    what = "no heading" if not found else f"{len(found)} headings"
    return f"{nb.path.name} has {what} starting '{heading.strip()}'"


# ----- numbers -----

@dataclass(frozen=True)
class Figure:
    token: str
    value: float
    decimals: int
    start: int
    end: int


def _value(num: str, scale: str | None) -> tuple[float, int]:
    plain = num.replace(",", "")
    decimals = len(plain.split(".")[1].split("e")[0]) if "." in plain else 0
    return float(plain) * SCALE.get(scale or "", 1), decimals


def numbers(text: str) -> list[Figure]:
    """Every number in `text` (outputs: all of them; prose: filtered by `is_figure`)."""
    found = []
    for m in NUMBER.finditer(text):
        num = m.group("num")
        if num.count(".") > 1:  # a version or an address, not a quantity
            continue
        value, decimals = _value(num, m.group("scale"))
        found.append(Figure(m.group(0), value, decimals, m.start("num"), m.end()))
    return found


def is_figure(text: str, fig: Figure) -> bool:
    """A quantity a reader would take as measured or quoted (module docstring: what is not)."""
    before, after = text[max(0, fig.start - 24):fig.start], text[fig.end:fig.end + 16]
    token = fig.token.lstrip("x×~±+-−")
    if re.match(r"-[A-Za-z]", after) or re.search(r"[A-Za-z]-$", before):  # 8-bit, 2-core, AVX-512
        return False
    if re.search(r"(§|#|arXiv:|seeds? |and |, )$", before) and re.fullmatch(r"0\d\d", token):
        return False  # seed 000, seeds 000 and 003
    if re.search(r"§\s?$|#$|arXiv:$|[Ss]eeds? $", before) or fig.token == "x86":
        return False
    if VERSION_WORDS.search(before.rstrip(" (")) and not fig.token.endswith(("x", "%")):
        return False
    if VERSION_LIST.search(text[max(0, fig.start - 60):fig.start]) and "." in fig.token:
        return False
    if re.fullmatch(r"(19|20)\d\d", token) and not UNIT.match(after):
        return False  # a year
    if re.match(r"-\d\d-\d\d", after) or re.search(r"\d{4}-$", before) or re.search(r"\d{4}-\d\d-$", before):
        return False  # a date
    if fig.token.endswith(("x", "×", "%")) or fig.token.startswith(("x", "×")) or UNIT.match(after):
        return True
    return fig.decimals > 0 or "," in token or "e" in token or fig.value >= 100


class Haystack:
    """Numbers to find a prose figure among: as printed, or rounded to the digits the prose keeps."""

    def __init__(self, figures: list[Figure]):
        self.rounded: list[set[float]] = [set() for _ in range(13)]
        self.exact = {abs(f.value) for f in figures}
        for f in figures:
            for decimals in range(min(f.decimals, 12) + 1):
                self.rounded[decimals].add(round(abs(f.value), decimals))

    def __contains__(self, fig: Figure) -> bool:
        return abs(fig.value) in self.exact or round(abs(fig.value), min(fig.decimals, 12)) in self.rounded[min(fig.decimals, 12)]


def matches(fig: Figure, haystack: "Haystack | list[Figure]") -> bool:
    """`fig` as printed, or rounded to the digits the prose keeps (a list is made a Haystack)."""
    return fig in (haystack if isinstance(haystack, Haystack) else Haystack(haystack))


# ----- prose -----

def strip_code(text: str) -> str:
    """Code, comments and link targets blanked (same length, so positions and lines hold)."""
    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))
    for pattern in (r"```.*?```", r"<!--.*?-->", r"`[^`]*`", r"\]\([^)\n]*\)", r"https?://\S+", r"<[^>\n]+>"):
        text = re.sub(pattern, blank, text, flags=re.S)
    return text


def blocks(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph, list item, heading and table row."""
    out: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0

    def flush() -> None:
        if current:
            out.append((start, "\n".join(current)))
            current.clear()

    for i, line in enumerate(text.split("\n")):
        stripped = line.strip()
        if not stripped:
            flush()
        elif stripped.startswith(("|", "#")):
            flush()
            out.append((i, line))
        else:
            if re.match(r"([-*+]|\d+\.)\s", stripped):
                flush()
            if not current:
                start = i
            current.append(line)
    flush()
    return out


def scopes(block: str) -> list[tuple[int, str]]:
    """(offset, text): a table row's cells, else the sentences of the block."""
    if block.lstrip().startswith("|"):
        out, at = [], 0
        for part in block.split("|"):
            out.append((at, part))
            at += len(part) + 1
        return out
    out, at = [], 0
    for part in re.split(r"(?<=[.!?])(\s+)(?=[A-Z*_(\[])", block):
        if part.strip():
            out.append((at, part))
        at += len(part)
    return out


@dataclass
class Context:
    root: pathlib.Path
    notebooks: dict[str, Notebook]
    sources: list[str]
    definitions: list[str]
    gpu: "Haystack"
    gpu_runs: dict = field(default_factory=dict)  # run name -> its Haystack: a sentence naming `run2` is held to run2's
    used: set[str] = field(default_factory=set)
    source_pattern: re.Pattern | None = None

    def __post_init__(self) -> None:
        names = sorted(self.sources, key=len, reverse=True)
        self.source_pattern = re.compile(r"(?<![\w])(?:" + "|".join(map(re.escape, names)) + r")(?![\w])", re.I)


def source_names(root: pathlib.Path) -> list[str]:
    """The short names in docs/SOURCES.md's tables (first column)."""
    names = []
    for line in (root / "docs" / "SOURCES.md").read_text().splitlines():
        m = re.match(r"\|\s*([^|]+?)\s*\|", line)
        if m and m.group(1) not in ("short name", "---") and not set(m.group(1)) <= set("-"):
            names.append(m.group(1))
    names += ["seeds 000", "seeds 003", "the seed", "the seeds", "data sheet", "spec sheet", "model card"]
    return [n for n in names if n not in TOOL_NAMES]


def definitions(root: pathlib.Path) -> list[str]:
    """The phrases of the ```definitions block in docs/NOTEBOOKS.md (text before two spaces)."""
    text = (root / "docs" / "NOTEBOOKS.md").read_text()
    m = re.search(r"```definitions\n(.*?)```", text, re.S)
    return [re.split(r"\s{2,}", line.strip())[0] for line in (m.group(1) if m else "").splitlines() if line.strip()]


def gpu_figures(root: pathlib.Path) -> dict[str, list[Figure]]:
    """Per GPU run (`run1`, ...), every number it recorded: summary.json, log.txt, reread.txt (its
    offline re-read), the executed notebooks."""
    found: dict[str, list[Figure]] = {}
    for run in sorted((root / "docs" / "gpu-reference").glob("run*")):
        figures: list[Figure] = []

        def walk(value) -> None:
            if isinstance(value, dict):
                for v in value.values():
                    walk(v)
            elif isinstance(value, list):
                for v in value:
                    walk(v)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                # as recorded, a fraction as %, seconds as ms, bytes as GB, GiB, MiB
                for v in {value, value * 100, value * 1000, value / 1e9, value / 2**30, value / 2**20}:
                    figures.append(Figure(str(v), float(v), 12, 0, 0))
        if (run / "summary.json").exists():
            walk(json.loads((run / "summary.json").read_text()))
        for record in ("log.txt", "reread.txt"):
            if (run / record).exists():
                figures += numbers((run / record).read_text())
        for path in sorted((run / "notebooks").glob("*.ipynb")):
            figures += [f for c in load_notebook(path).cells for f in c.figures]
        found[run.name] = figures
    return found


def context(root: pathlib.Path = ROOT) -> Context:
    runs = gpu_figures(root)
    return Context(root, notebooks(root), source_names(root), definitions(root),
                   Haystack([f for figures in runs.values() for f in figures]),
                   {name: Haystack(figures) for name, figures in runs.items()})


def _defined(scope: str, fig: Figure, phrases: list[str], used: set[str]) -> bool:
    flat = re.sub(r"[*_]", "", scope)
    for phrase in phrases:
        pattern = r"\s+".join(map(re.escape, re.sub(r"[*_]", "", phrase).split()))
        for m in re.finditer(pattern, flat):
            # positions in `flat` shift by the emphasis removed before them
            shift = len(scope[:fig.start]) - len(re.sub(r"[*_]", "", scope[:fig.start]))
            if m.start() <= fig.start - shift < m.end():
                used.add(phrase)
                return True
    return False


def check_text(text: str, where: str, ctx: Context, own: Notebook | None = None, gpu: bool = False,
               explain: list[str] | None = None) -> list[str]:
    """Each figure in `text` (a document or a markdown cell) that is not tied to its source.
    `own`: the notebook whose markdown this is (its compared outputs are always cited); `gpu`: a
    page about the GPU reference (its records are always cited); `explain`: gets a line per figure
    saying how it was tied."""
    problems = []
    text = BLOCK.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    text = FIGURE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    clean = strip_code(text)
    header: dict | None = None
    for line, block in blocks(clean):
        for m in CELL_NUMBER.finditer(block):
            if re.search(r"run\d+ (\d\d )?$", block[:m.start()]):
                continue  # a cell of a GPU run's executed notebook: a record, whose cells never move
            problems.append(f"{where}:{line + 1}: '{m.group(0)}': a cell number moves when a cell is added; "
                            "cite the section (NN § Heading)")
        is_row = block.lstrip().startswith("|")
        block_cites = _citations(block, ctx, own)
        problems += [f"{where}:{line + 1}: {e}" for e in block_cites["errors"]]
        if not is_row:
            header = None
        elif header is None:
            header = block_cites  # a table's first row: its citations stand for every row
        for offset, scope in scopes(block):
            cites = _citations(scope, ctx, own)
            if not _cites_anything(cites):  # a cell citing nothing: its row's and its header's; a sentence: its paragraph's
                cites = _merged(block_cites, header) if is_row and header is not block_cites else block_cites
            scope = re.sub(r"Time: about \d+ minutes", lambda m: " " * len(m.group(0)), scope)
            for m in ARITHMETIC.finditer(scope):  # a product worked out in the text: checked here
                *factors, result = (int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", m.group(0)))
                if math.prod(factors) != result:
                    problems.append(f"{where}:{line + 1}: '{m.group(0)}' is wrong: the product is {math.prod(factors):,}")
            scope = ARITHMETIC.sub(lambda m: " " * len(m.group(0)), scope)
            for fig in numbers(scope):
                how = None
                if not is_figure(scope, fig):
                    continue
                sections = cites["sections"] + ([own.cells] if own is not None else [])
                if _defined(scope, fig, ctx.definitions, ctx.used):
                    how = "a definition"
                elif cites["reference"] or cites["dated"]:
                    how = "a reference" if cites["reference"] else "dated"
                elif (cites["gpu"] or gpu) and matches(fig, _gpu_haystack(scope, ctx)):
                    how = "the H200's records"
                elif matches(fig, [f for cells in sections for c in cells if c.compared for f in c.figures]):
                    how = "a cited compared output"
                if how:
                    if explain is not None:
                        explain.append(f"{where}:{line + 1}: {fig.token}: {how}: {re.sub(chr(10) + ' *', ' ', scope.strip())[:110]}")
                    continue
                loose = [f for cells in sections for c in cells if not c.compared for f in c.figures]
                snippet = re.sub(r"\s+", " ", scope.strip())[:90]
                if matches(fig, loose):
                    why = ("is printed only by cells whose output changes run to run (not nbval-check-output): "
                           "generate it (<!-- figure ... -->) or do not quote it")
                elif cites["sections"] or cites["gpu"] or gpu or own is not None:
                    why = "is not in what it cites" + (" (the H200's records)" if cites["gpu"] or gpu else "")
                else:
                    why = ("cites nothing: cite the section that prints it (NN § Heading), the H200, a source "
                           "in docs/SOURCES.md, or list it as a definition in docs/NOTEBOOKS.md")
                problems.append(f"{where}:{line + 1}: '{fig.token}' {why}: \"{snippet}\"")
    return problems


def _gpu_haystack(scope: str, ctx: Context) -> "Haystack":
    """The records of the GPU runs the text names (`run1 01`), else of them all."""
    named = [ctx.gpu_runs[f"run{n}"] for n in re.findall(r"\brun(\d+)\b", scope) if f"run{n}" in ctx.gpu_runs]
    if not named:
        return ctx.gpu
    haystack = Haystack([])
    for h in named:
        haystack.exact |= h.exact
        for mine, theirs in zip(haystack.rounded, h.rounded):
            mine |= theirs
    return haystack


def _merged(a: dict, b: dict) -> dict:
    return {"sections": a["sections"] + b["sections"], "reference": a["reference"] or b["reference"],
            "gpu": a["gpu"] or b["gpu"], "dated": a["dated"] or b["dated"], "errors": []}


def _cites_anything(cites: dict) -> bool:
    return bool(cites["sections"] or cites["reference"] or cites["gpu"] or cites["dated"])


def _citations(scope: str, ctx: Context, own: Notebook | None) -> dict:
    """What a piece of prose cites: notebook sections, a source, the H200's records, a dated measurement."""
    sections, errors = [], []
    for m in CITATION.finditer(scope):
        key = m.group("nb") or (own.key if own else None)
        nb = ctx.notebooks.get(key) if key else None
        if nb is None:
            errors.append(f"'{m.group(0).strip()}' names no notebook")
            continue
        cells = section(nb, m.group("heading"))
        if isinstance(cells, str):
            errors.append(f"'{m.group(0).strip()}': {cells}")
        else:
            sections.append(cells)
    flat = re.sub(r"\s+", " ", scope)
    reference = bool(ctx.source_pattern.search(flat))
    dated = bool(re.search(r"\b[Mm]easured\b[^.;]*?\b20\d\d-\d\d-\d\d\b", flat))
    return {"sections": sections, "reference": reference, "gpu": "H200" in flat, "dated": dated, "errors": errors}


def documents(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    paths = [root / "README.md"] + sorted((root / "docs").glob("*.md")) + sorted((root / "docs").glob("*/README.md"))
    return [p for p in paths if str(p.relative_to(root)) not in GENERATED_WHOLE]


def check(root: pathlib.Path = ROOT, explain: list[str] | None = None) -> list[str]:
    """Every untied figure and stale reference in the course's prose, one line each."""
    ctx = context(root)
    problems = []
    for path in documents(root):
        where = str(path.relative_to(root))
        problems += check_text(path.read_text(), where, ctx, gpu=where.startswith("docs/gpu-reference/"), explain=explain)
    for nb in ctx.notebooks.values():
        for cell_id, markdown in nb.prose:
            problems += check_text(markdown, f"{nb.path.relative_to(root)} (cell id {cell_id})", ctx, own=nb,
                                   explain=explain)
    problems += [f"docs/NOTEBOOKS.md: the definition '{d}' is used nowhere: remove it" for d in ctx.definitions
                 if d not in ctx.used]
    return problems


def main(argv: list[str] | None = None) -> int:
    explain: list[str] | None = [] if "--explain" in (sys.argv[1:] if argv is None else argv) else None
    problems = check(explain=explain)
    for line in explain or []:
        print(line)
    for line in problems:
        print(line)
    print(f"{len(problems)} figure(s) not tied to their source" if problems else "every figure is tied to its source")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
