"""Exercises that make the learner think (issue 36.3), held on the committed notebooks: a checking
cell run before an answer is set prints no truth; the solution cells' answers pass the same checks;
every concept question is answerable from the core path, not only from an Optional section.

Each test reads the notebooks' JSON (their saved cpu-quick outputs): about a second for all twelve."""

import importlib.util
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
spec = importlib.util.spec_from_file_location("course_words", ROOT / "scripts" / "course_words.py")
course_words = importlib.util.module_from_spec(spec)
spec.loader.exec_module(course_words)

CHECK_CALL = re.compile(r"\b(wb\.check|lesson\.check_\w+)\(\s*answer")  # an exercise's check: its first argument an answer
EXPECTED = re.compile(r"^Correct: .*?\(expected (.+?)(?:, within [^)]*)?\)\s*$", re.M)
NUMBER = re.compile(r"-?\d[\d,]*\.?\d*(?:e[-+]?\d+)?")


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _tags(cell):
    return cell.get("metadata", {}).get("tags", [])


def _text(cell):
    return "\n".join("".join(o.get("text", "")) or "".join(o.get("data", {}).get("text/plain", ""))
                     for o in cell.get("outputs", []))


def core_cells(path):
    """(cell, on the core path) for every cell, Optional sections marked off as course_words does."""
    optional_level = None
    for cell in _cells(path):
        if cell["cell_type"] == "markdown" and "solution" not in _tags(cell):
            for _, heading in course_words._headings_outside_fences("".join(cell["source"])):
                optional_level = course_words._section(optional_level, heading or "")
        yield cell, optional_level is None


def truths(path):
    """What the core path's solution cells' checks printed as expected: the exercise's answers."""
    return [m for cell, core in core_cells(path) if core and cell["cell_type"] == "code" and "solution" in _tags(cell)
            for m in EXPECTED.findall(_text(cell))]


def _reveals(text, truth):
    if truth.startswith(("'", '"')):
        return truth in text
    value = float(truth)
    found = [float(n.replace(",", "")) for n in NUMBER.findall(text) if n.strip("-,.")]
    return any(abs(n - value) <= 0.01 * abs(value) for n in found if value)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_checking_cell_run_before_an_answer_prints_no_truth(path):
    known = truths(path)
    assert known, "the solution cells printed no checked answer"
    checking = [cell for cell, core in core_cells(path) if core and cell["cell_type"] == "code"
                and "solution" not in _tags(cell) and CHECK_CALL.search("".join(cell["source"]))]
    assert checking, "no checking cell on the core path"
    for cell in checking:
        text = _text(cell)
        if "skipped" in text:  # 05 without MiniLM's weights: the check does not run
            continue
        assert "Not answered yet" in text, f"the checking cell's saved output is not an unanswered check: {text[:200]!r}"
        shown = [t for t in known if _reveals(text.replace("Not answered yet: replace None with your answer.", ""), t)]
        assert not shown, f"an unanswered check shows the answer {shown}: {text[:300]!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_solution_answers_pass_the_checking_cells_own_checks(path):
    solutions = [cell for cell, core in core_cells(path) if core and cell["cell_type"] == "code" and "solution" in _tags(cell)]
    assert any(CHECK_CALL.search("".join(c["source"])) for c in solutions), "the solution does not re-run the check"
    text = "\n".join(_text(c) for c in solutions)
    assert "Correct:" in text or "not checked:" in text, text[:300]
    assert "Not answered" not in text and "is not right" not in text


# For every question in `## Questions`, words of the core path (markdown outside the Questions
# section, core code) that answer it: move them to an Optional section, or add a question the core
# path does not answer, and this fails. Read as: question n is answered where this phrase stands.
ANSWERED_AT = {
    "00_tour": ["FLOPs of the first step", "are **exact counts**", "two running averages",
                "reads its value (`.item()`) only at log steps", "measured on a CPU, read from the data sheet",
                "**Waiting for data**"],
    "01_mixed_precision": ["values below about 3e-8 round to zero", "before** clipping",
                           "steps skipped; scale 2**40 ->", "by less than half",
                           "16-bit copies of the weights", "**emulated**", "With TF32 on"],
    "02_gradient_accumulation": ["`.grad`", "dividing each loss by the number of steps", "frees its saved tensors",
                                 "each pay the per-step overheads again", "labelled tokens", "BatchNorm",
                                 "per-device batch × accumulation steps × number of GPUs"],
    "03_activation_checkpointing": ["everything it saves for backward", "its input:",
                                    "at most about a third of a step", "skips a block's last matrix",
                                    "The peak falls less", "it is rebuilt first", "the two combine"],
    "04_input_pipelines": ["no loader can beat", "With no workers", "as far as there are free cores",
                           "`prefetch_factor` absorbs jitter", "`persistent_workers` saves each epoch's start-up",
                           "`pin_memory` matters only for copies to a GPU", "at a random position"],
    "05_quantization": ["each batch's activation", "**per-channel**", "(not a Linear layer)", "**VNNI**",
                        "**fake quantization**", "never on test ones", "in a byte"],
    "06_multi_gpu": ["holds the whole model state", "every copy takes the", "broadcasts rank 0's",
                     "**Effective batch =", "world of one", "share the same cores"],
    "07_planner": ["on fake tensors", "shrink activations, not the model state", "keeps the **effective batch**",
                   "is **circular**", "temporaries included", "compare it with a whole run", "no combination fits"],
    "08_speed_without_changing_the_math": ["The first step pays for all of it", "inductor reorders fp32 arithmetic",
                                           "log-sum-exp per row", "whole update in one kernel", "names a range of lines",
                                           "8-bit exponent"],
    "09_train_fewer_bytes": ["a frozen one 4", "B starting at zero", "Activations are", "small tensors stay fp32",
                             "given only what trains", "r·(in + out)"],
    "10_tensor_and_pipeline_parallel": ["**Row-wise**", "reorders its rows", "input gradient is a partial sum",
                                        "(p-1)/(m+p-1)", "shares the embedding's weight", "fast links"],
    "11_two_nodes_on_one_machine": ["starts the training processes (workers)", "every agent dials",
                                    "stops the group's workers", "--resume-from auto", "rank 0 writes",
                                    "continues from the last save"],
}


def core_path_and_questions(path):
    """The core path's words (markdown outside `## Questions`, and code) and the questions' lines."""
    text, questions, in_questions = [], [], False
    for cell, core in core_cells(path):
        if not core or "solution" in _tags(cell):
            continue
        source = "".join(cell["source"])
        if cell["cell_type"] == "code":
            text.append(source)
            continue
        for line in source.splitlines():
            heading = course_words.HEADING.match(line)
            if heading and len(heading.group(1)) <= 2:
                in_questions = heading.group(2).strip().lower().startswith("questions")
            (questions if in_questions else text).append(line)
    return " ".join(" ".join(text).split()), [q for q in questions if course_words.QUESTION.match(q)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_question_is_answered_on_the_core_path(path):
    text, questions = core_path_and_questions(path)
    phrases = ANSWERED_AT[path.stem]
    assert len(questions) == len(phrases), f"{len(questions)} questions, {len(phrases)} places they are answered"
    missing = [f"Q{n}: {phrase!r}" for n, phrase in enumerate(phrases, 1) if " ".join(phrase.split()) not in text]
    assert not missing, "answered nowhere on the core path now: " + "; ".join(missing)
