"""Every notebook has the course's shape (docs/NOTEBOOKS.md): a core path a learner finishes in
about 20 minutes, a claims table, concept questions with answers, and learner code that imports
only `workbench`, its lesson module and real libraries. Each test names every notebook that
misses, not only the first."""

import importlib.util
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MAX_CORE_WORDS = 1000
INTERNAL_IMPORT = re.compile(r"^\s*(?:from\s+workbench\.(core|measure|engine|planner)\b"
                             r"|import\s+workbench\.(core|measure|engine|planner)\b"
                             r"|from\s+workbench\s+import\s+.*\b(core|measure|engine|planner)\b)[^\n]*", re.M)
HEADING = re.compile(r"^(#{1,6})\s+(.*)$", re.M)

spec = importlib.util.spec_from_file_location("course_words", ROOT / "scripts" / "course_words.py")
course_words = importlib.util.module_from_spec(spec)
spec.loader.exec_module(course_words)


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _tags(cell):
    return cell.get("metadata", {}).get("tags", [])


def _misses(check):
    return [f"{path.stem}: {why}" for path in NOTEBOOKS if (why := check(path))]


def _core_words(path):
    core = course_words.words(path)["core"]
    return f"{core} core words (at most {MAX_CORE_WORDS})" if core > MAX_CORE_WORDS else None


def _claims_cell(path):
    cells = [c for c in _cells(path) if "claims" in _tags(c)]
    if not cells:
        return "no cell tagged `claims`"
    if not any(c["cell_type"] == "code" and "wb.claims(" in "".join(c["source"]) for c in cells):
        return "its `claims` cell does not call wb.claims(...)"
    return None


def questions_answered(cells):
    """None when a `## Questions` heading outside an Optional section is followed, before the next
    heading of level 2 or higher, by a cell tagged `solution`; else what is missing."""
    inside = None  # the level of the Questions heading we are under
    for cell in cells:
        if inside is not None and "solution" in _tags(cell):
            return None
        if cell["cell_type"] != "markdown":
            continue
        for hashes, title in HEADING.findall("".join(cell["source"])):
            if inside is not None and len(hashes) <= inside:
                return "its `## Questions` section has no cell tagged `solution` (the answers)"
            if title.strip().lower().startswith("questions") and len(hashes) == 2:
                inside = len(hashes)
    return "no `## Questions` section" if inside is None else \
        "its `## Questions` section has no cell tagged `solution` (the answers)"


def _by_hand_and_exercise(path):
    """The technique's own lines in a core code cell, marked `# + technique` (run under wb.monitor
    in a training notebook; 07's are wb.estimate and a plan), and exactly one predict-run-explain
    exercise (an `**Explain` cell and its check: wb.check, or the lesson's check_... where a timing
    needs the free-core guard) on the core path."""
    code = course_words.core_code_cells(path)
    missing = []
    if not any(re.search(r"#\s*\+\s*\S", c) for c in code):
        missing.append("no core code cell marks the technique's lines `# + technique`")
    exercises = course_words.words(path)["exercises"]
    if exercises != 1:
        missing.append(f"{exercises} predict-run-explain exercises on the core path (`**Explain` cells), not 1")
    elif not any(re.search(r"\b(wb\.check|lesson\.check_\w+)\(", c) for c in code):
        missing.append("its exercise has no checking cell (wb.check or lesson.check_...) on the core path")
    return "; ".join(missing) or None


HEADER_TIME = re.compile(r"Time:?\**:?\s*about\s+(\d+)\s*min", re.I)


def _header_time(path):
    """The header's "Time: about N minutes" is the learner estimate course_words.py computes,
    the same figure README's and WORKSHOP's generated tables quote."""
    first = next((c for c in _cells(path) if c["cell_type"] == "markdown"), None)
    found = HEADER_TIME.search("".join(first["source"])) if first else None
    minutes = course_words.words(path)["minutes"]
    if found is None:
        return f'its header has no "Time: about N minutes" (N = {minutes}, scripts/course_words.py)'
    if int(found.group(1)) != minutes:
        return f"its header says about {found.group(1)} minutes; scripts/course_words.py estimates {minutes}"
    return None


def _internal_imports(path):
    found = [f"cell {i}: {m.group(0).strip()}" for i, cell in enumerate(_cells(path)) if cell["cell_type"] == "code"
             for m in INTERNAL_IMPORT.finditer("".join(cell["source"]))]
    return "imports the library's insides: " + "; ".join(found) if found else None


@pytest.mark.parametrize("check", [_core_words, _claims_cell, lambda p: questions_answered(_cells(p)), _internal_imports,
                                   _header_time, _by_hand_and_exercise],
                         ids=["core path at most 1,000 words", "a claims cell", "questions with answers",
                              "no internal imports", "the header's learner time", "marked technique lines, one exercise"])
def test_every_notebook_has_the_course_shape(check):
    assert NOTEBOOKS, "no notebooks found"
    misses = _misses(check)
    assert not misses, f"{len(misses)} of {len(NOTEBOOKS)} notebooks:\n" + "\n".join(misses)


def _md(text, tags=()):
    return {"cell_type": "markdown", "metadata": {"tags": list(tags)}, "source": text}


def test_questions_need_their_answers_in_the_section():
    answered = [_md("## Questions\n1. Why?"), _md("1. Because.", tags=["solution"]), _md("## Optional: more")]
    assert questions_answered(answered) is None
    assert "no cell tagged" in questions_answered([_md("## Questions\n1. Why?"), _md("## Optional: x"),
                                                   _md("1. Because.", tags=["solution"])])
    assert "no cell tagged" in questions_answered([_md("## Questions\n1. Why?")])
    assert questions_answered([_md("## Exercises")]) == "no `## Questions` section"


def test_the_header_time_is_read_in_the_ways_it_is_written():
    for text in ("**Time: about 21 minutes** (estimated", "*Time*: about 21 min", "Time: about 21 minutes"):
        assert HEADER_TIME.search(text).group(1) == "21", text
    assert HEADER_TIME.search("Time: 14 s (cpu-quick)") is None


def test_the_import_rule_catches_every_spelling():
    for line in ("from workbench.core.data import x", "import workbench.core.measure.counters as c",
                 "from workbench import engine", "  from workbench.planner import estimate"):
        assert INTERNAL_IMPORT.search(line), line
    for line in ("import workbench as wb", "from workbench.lessons import mixed_precision as lesson",
                 "# from workbench.core import x is what we avoid", "x = 'workbench.core'"):
        assert not INTERNAL_IMPORT.search(line), line
