"""The course's times, from one source, into README.md and docs/WORKSHOP.md.

Two kinds of time, never mixed up:
- **Run All seconds** (the machine's): the records in `benchmarks/results/*.json`, written by
  `benchmarks/notebook_times.py` (nbclient, one kernel a notebook) or `scripts/lab_run_all.py
  --record` (Run All in a real JupyterLab). A record is one column.
- **Learner minutes** (a person's, on a notebook's core path): estimated by
  `scripts/course_words.py` from the committed notebooks, the clock of a real room: the prose, each
  code cell by its length, the tables its saved outputs show, the exercise's predictions and
  explanation, the concept questions (`course_words.MINUTES`). An estimate, not a timing.

The tables sit between markers in the two documents and are rewritten here, never by hand:

    <!-- course-facts: run-all-times -->  ...  <!-- /course-facts: run-all-times -->

    python scripts/course_facts.py            # rewrite the tables
    python scripts/course_facts.py --check    # exit 1 naming every stale table (tests/test_course_facts.py)

Single figures in prose are generated the same way, from the committed notebooks' outputs
(docs/NOTEBOOKS.md, "Figures in prose"): `<!-- figure NN § Heading | regex -->VALUE<!-- /figure -->`
in README.md or docs/*.md gets VALUE from the first output in that section of notebook NN that the
regex matches (its first group, else the whole match). A timing the next run changes is quoted this
way or not at all; `scripts/prose_figures.py` checks every other figure against its source.

The three-hour path (docs/WORKSHOP.md) is laid out here too: a welcome, the notebooks in course
order while their learner minutes fit with SLACK minutes to spare, a break, a wrap-up; the
notebooks that do not fit are listed as the part of the course left for after the workshop. It
fits by construction, so a notebook that grows moves the cut, visibly, in a diff of WORKSHOP.md;
the slack absorbs a room's questions and a slow start (the path is cut, the model never bent).
docs/FACILITATOR.md's per-notebook clock comes from here too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import re
import sys

from workbench.base.atomic_write import write_whole

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# README's columns, in this order: the JupyterLab Run All records first (what a learner does).
README_RECORDS = ("lab-cpu-quick", "lab-cpu", "cpu-quick-avx2", "cpu-quick-avx2-hog", "cpu-avx2")
# WORKSHOP's path quotes these two: Run All in JupyterLab, every notebook measured.
WORKSHOP_RECORDS = ("lab-cpu-quick", "lab-cpu")
WORKSHOP_MINUTES = 180
WELCOME, BREAK, WRAP_UP = 10, 10, 5
SLACK = 15  # minutes the path leaves free under WORKSHOP_MINUTES: a real room runs late
BREAK_AFTER = 75  # minutes into the day: the break comes before the first notebook that starts later



def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return sys.modules[name]


course_words = _script("course_words")
prose_figures = _script("prose_figures")
facilitator = _script("facilitator")


def notebooks(folder: pathlib.Path = ROOT / "notebooks") -> list[pathlib.Path]:
    return sorted(folder.glob("[0-9][0-9]_*.ipynb"))


def load_record(stem: str, results: pathlib.Path = RESULTS) -> dict:
    """One record: {"label", "date", "notebooks": {name: {"seconds", "cpu_seconds"?, "status"}}}."""
    record = json.loads((results / f"{stem}.json").read_text())
    if "label" not in record:
        parts = [record["preset"], record.get("isa", "native")] + (["hog"] if record.get("hog") else [])
        record["label"] = ", ".join(p for p in parts if p != "native")
    return record


def _seconds(record: dict, name: str) -> str:
    entry = record["notebooks"].get(name)
    if entry is None:
        return "-"
    if entry.get("status", "ok") != "ok":
        return entry["status"]
    cpu = entry.get("cpu_seconds")
    return f"{entry['seconds']:.0f}" + (f" ({cpu:.0f})" if cpu is not None else "")


def _total(record: dict, names: list[str]) -> str:
    have = [record["notebooks"][n]["seconds"] for n in names if n in record["notebooks"]]
    missing = len(names) - len(have)
    return f"{sum(have):.0f}" + (f" ({missing} not measured)" if missing else "")


def run_all_times(paths: list[pathlib.Path], results: pathlib.Path = RESULTS) -> str:
    """README's table: per notebook the learner minutes and every record's Run All seconds."""
    records = [load_record(stem, results) for stem in README_RECORDS if (results / f"{stem}.json").exists()]
    names = [p.stem for p in paths]
    minutes = {p.stem: course_words.words(p)["minutes"] for p in paths}
    header = ["notebook", "learner, minutes (est.)"] + [f"{r['label']} ({r['date']})" for r in records]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for name in names:
        lines.append(f"| `{name}` | {minutes[name]} | " + " | ".join(_seconds(r, name) for r in records) + " |")
    lines.append(f"| total | {sum(minutes.values())} | " + " | ".join(_total(r, names) for r in records) + " |")
    return "\n".join(lines)


def plan(minutes: dict[str, int], day: int = WORKSHOP_MINUTES) -> tuple[list[tuple[int, str, int]], list[str]]:
    """The day as (start minute, what, minutes) rows, and the notebooks left for afterwards.
    Notebooks go in course order while they fit with SLACK minutes to spare (a later one needs
    the earlier ones)."""
    rows, clock, had_break = [(0, "welcome; pre-flight already green", WELCOME)], WELCOME, False
    left = list(minutes)
    while left:
        name = left[0]
        needs_break = not had_break and clock >= BREAK_AFTER
        if clock + BREAK * (not had_break) + minutes[name] + WRAP_UP + SLACK > day:
            break
        if needs_break:
            rows.append((clock, "break", BREAK))
            clock, had_break = clock + BREAK, True
        rows.append((clock, name, minutes[name]))
        clock += minutes[name]
        left.pop(0)
    if not had_break:
        rows.append((clock, "break", BREAK))
        clock += BREAK
    rows.append((clock, "wrap-up: docs/DECIDE.md, docs/SUMMARY.md", WRAP_UP))
    return rows, left


def workshop_path(paths: list[pathlib.Path], results: pathlib.Path = RESULTS) -> str:
    """WORKSHOP's three hours: the path that fits, with Run All seconds beside each notebook."""
    minutes = {p.stem: course_words.words(p)["minutes"] for p in paths}
    records = [load_record(stem, results) for stem in WORKSHOP_RECORDS if (results / f"{stem}.json").exists()]
    rows, left = plan(minutes)
    header = ["start", "what", "minutes (learner, est.)"] + [f"Run All, {r['label']} (s)" for r in records]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    for start, what, length in rows:
        seconds = [_seconds(r, what) for r in records] if what in minutes else [""] * len(records)
        label = f"`{what}`: core path" if what in minutes else what
        lines.append(f"| {start // 60}:{start % 60:02d} | {label} | {length} | " + " | ".join(seconds) + " |")
    end = rows[-1][0] + rows[-1][2]
    lines.append("")
    slack = WORKSHOP_MINUTES - end
    lines.append(f"Ends at {end // 60}:{end % 60:02d} of {WORKSHOP_MINUTES // 60}:{WORKSHOP_MINUTES % 60:02d}: "
                 f"{slack} minutes of slack for the room's questions and a late start (at least {SLACK}). "
                 + (("Not in the room's three hours (a second session, or at home): "
                     + ", ".join(f"`{n}` ({minutes[n]} min)" for n in left) + ".")
                    if left else "Every notebook's core path fits."))
    return "\n".join(lines)


# The room on one machine (docs/WORKSHOP.md): records with each notebook's peak memory
# (benchmarks/notebook_times.py), the machine sizes a teacher rents, and what the system keeps.
ROOM_RECORDS = ("cpu-quick-avx2", "cpu-avx2")
ROOM_MACHINES = ((8, 32), (16, 64), (32, 128), (64, 256))  # (cores, GiB)
SYSTEM_GIB = 4  # the OS, JupyterHub and its proxy


def _learner_needs(nb: dict) -> tuple[int, int]:
    """(MiB, cores) one learner holds while this notebook runs: the kernel's peak, plus two
    processes at the largest child's peak where it started processes (04's workers, 06's ranks)."""
    forks = (nb.get("children_cpu_seconds") or 0) >= 1
    return nb["peak_rss_mib"] + (2 * nb["largest_child_peak_rss_mib"] if forks else 0), 2 if forks else 1


def room_size(paths: list[pathlib.Path], results: pathlib.Path = RESULTS) -> str:
    """Learners per machine for the three-hour path, from the measured peaks and CPU seconds."""
    minutes = {p.stem: course_words.words(p)["minutes"] for p in paths}
    path = [what for _, what, _ in plan(minutes)[0] if what in minutes]
    records = [load_record(stem, results) for stem in ROOM_RECORDS if (results / f"{stem}.json").exists()]
    records = [r for r in records if all("peak_rss_mib" in r["notebooks"].get(n, {}) for n in path)]
    if not records:
        return "Not measured yet: `python benchmarks/notebook_times.py --preset cpu --isa avx2 --out benchmarks/results/cpu-avx2.json`."
    header = ["preset (record)", "memory a learner (MiB)", "cores a learner", "CPU s a learner, 3 h"]
    header += [f"{c} cores, {g} GiB" for c, g in ROOM_MACHINES]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for r in records:
        needs = [_learner_needs(r["notebooks"][n]) for n in path]
        mib = max(m for m, _ in needs)
        forking = [n[:2] for n, (_, c) in zip(path, needs) if c > 1]
        cpu = sum((r["notebooks"][n].get("cpu_seconds") or 0) + (r["notebooks"][n].get("children_cpu_seconds") or 0)
                  for n in path)
        fits = [str(min(c, (g - SYSTEM_GIB) * 1024 // mib)) for c, g in ROOM_MACHINES]
        lines.append(f"| {r['label']} ({r['date']}) | {mib:,} | 1" + (f" (2 in {', '.join(forking)})" if forking else "")
                     + f" | {cpu:.0f} | " + " | ".join(fits) + " |")
    return "\n".join(lines)


CITE = re.compile(r"(?P<nb>\d\d|room) § (?P<heading>.+)")


def fill_figures(text: str, where: str, notebooks: dict) -> str:
    """Every `<!-- figure NN § Heading | regex -->VALUE<!-- /figure -->` in `text` with VALUE read
    from the committed notebook's outputs in that section (the first match, in cell order)."""
    def one(m: re.Match) -> str:
        cite, pattern = m.group("cite").strip(), m.group("pattern")
        parsed = CITE.fullmatch(cite)
        nb = notebooks.get(parsed["nb"]) if parsed else None
        if nb is None:
            raise SystemExit(f"{where}: figure '{cite}': write it 'NN § Heading', NN a notebook's number (or room)")
        cells = prose_figures.section(nb, parsed["heading"])
        if isinstance(cells, str):
            raise SystemExit(f"{where}: figure '{cite}': {cells}")
        for cell in cells:
            found = re.search(pattern, cell.text)
            if found:
                value = found.group(1) if found.groups() else found.group(0)
                return f"<!-- figure {cite} | {pattern} -->{value}<!-- /figure -->"
        raise SystemExit(f"{where}: figure '{cite}': no output in that section matches /{pattern}/ "
                         f"(re-executed with other words? fix the pattern)")
    return prose_figures.FIGURE_SPAN.sub(one, text)


def prose_documents(root: pathlib.Path) -> list[str]:
    """The documents whose single figures are generated (docs/SUMMARY.md is generated whole)."""
    return [str(p.relative_to(root)) for p in prose_figures.documents(root)]


def presets_table(paths: list[pathlib.Path], results: pathlib.Path = RESULTS) -> str:
    """README's table of the three presets' shapes and steps, from workbench/core/presets.py."""
    from workbench.core.presets import PRESETS

    lines = ["| preset | MLP widths, batch | GPT layers x width, seq x batch | steps (emulated 16-bit arms) |",
             "|---|---|---|---|"]
    for name, p in PRESETS.items():
        gpt, sized = p.dims["gpt"], " (sized to the card, below)" if name == "gpu" else ""
        emulated = f" ({p.reduced_precision_steps_on_emulated_cpu})" if p.reduced_precision_steps_on_emulated_cpu else ""
        lines.append(f"| `{name}` | {'-'.join(map(str, p.dims['mlp']['hidden']))}, {p.batch_size['mlp']} "
                     f"| {gpt['n_layer']} x {gpt['d_model']}, {p.seq_len['gpt']} x {p.batch_size['gpt']}{sized} "
                     f"| {p.steps}{emulated} |")
    return "\n".join(lines)


def card_sizes(paths: list[pathlib.Path], results: pathlib.Path = RESULTS) -> str:
    """README's table of the gpu preset's GPT shape per card class, from workbench/core/presets.py."""
    from workbench.core.presets import CARD_HEADROOM, GPU_CARDS, UNKNOWN_CARD_GIB

    lines = ["| card memory (nvidia-smi) | GPT seq x batch |", "|---|---|"]
    for i, card in enumerate(GPU_CARDS):
        upper = f" to {GPU_CARDS[i + 1].min_gib:g} GiB" if i + 1 < len(GPU_CARDS) else " and more"
        unknown = " (and a card whose memory cannot be read)" if card.min_gib == UNKNOWN_CARD_GIB else ""
        lines.append(f"| {card.min_gib:g} GiB{upper}{unknown} | {card.gpt_seq_len} x {card.gpt_batch} |")
    lines += ["", f"Each notebook's largest run replays under {CARD_HEADROOM:.0%} of the smallest card of its class; "
              f"the largest class keeps batch {GPU_CARDS[-1].gpt_batch}, the batch the notebooks' claims were "
              "checked at on an H200 (larger batches were not checked)."]
    return "\n".join(lines)


BLOCKS = {  # (document, block name) -> what writes it
    ("README.md", "run-all-times"): run_all_times,
    ("README.md", "presets"): presets_table,
    ("README.md", "card-sizes"): card_sizes,
    ("docs/WORKSHOP.md", "workshop-path"): workshop_path,
    ("docs/WORKSHOP.md", "room-size"): room_size,
    ("docs/FACILITATOR.md", "facilitator-clock"): facilitator.clock_table,
}


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- course-facts: {name} -->", f"<!-- /course-facts: {name} -->"


def replace_block(text: str, name: str, body: str, where: str) -> str:
    begin, end = _markers(name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise SystemExit(f"{where}: needs exactly one '{begin}' followed by one '{end}' line")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def stale(root: pathlib.Path = ROOT, *, write: bool = False) -> list[str]:
    """The documents whose generated tables differ from what the sources give (rewritten if write)."""
    paths, found = notebooks(root / "notebooks"), []
    texts: dict[str, str] = {}
    for (document, name), make in BLOCKS.items():
        text = texts.get(document) or (root / document).read_text()
        new = replace_block(text, name, make(paths, root / "benchmarks" / "results"), document)
        if new != text:
            found.append(f"{document}: the '{name}' table is stale")
        texts[document] = new
    executed = prose_figures.notebooks(root)
    for document in prose_documents(root):
        text = texts.get(document) or (root / document).read_text()
        new = fill_figures(text, document, executed)
        if new != text:
            stale_spans = sum(a != b for a, b in zip(prose_figures.FIGURE_SPAN.findall(text),
                                                      prose_figures.FIGURE_SPAN.findall(new)))
            found.append(f"{document}: {stale_spans} generated figure(s) are stale")
            texts[document] = new
    if write:  # whole or not at all: a full disk must not cut README's hand-written text short
        for document, text in texts.items():
            try:
                write_whole(root / document, text)
            except OSError as error:
                raise SystemExit(f"{document}: could not be written ({error.strerror or error}); it is unchanged") from None
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming every stale table")
    args = parser.parse_args(argv)
    found = stale(write=not args.check)
    for line in found:
        print(("stale: " if args.check else "rewrote: ") + line + ("; run python scripts/course_facts.py" if args.check else ""))
    return 1 if (found and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
