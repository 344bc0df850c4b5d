"""The package's layers, read from its own imports: arrows point down, nothing cycles, and no two
layers share a rank (each layer's rank is its place in LAYERS). docs/LAYOUT.md draws them.

    base        workbench/base/: errors, argument checks, tables, the precisions' names
    machine     workbench/machine/: this machine (devices, CPU class, caches, torchao) and its quirks
    floor       workbench/core/ but its subpackages: models, data, presets, your own model and data
    switches    workbench/core/switches/: one module per technique: its choices, checks, hooks, replay
    config      workbench/core/config/: RunConfig, resolved and checked; it reads the switches'
                choices and runs their checks, so it sits above them (issue 39: no arrow back up)
    measure     workbench/core/measure/: exact counters, meters, records, results
    engine      workbench/core/engine/: the loop on accelerate, its state, save and resume
    views       workbench/core/views/: sinks, the live dashboard, comparisons
    planner     workbench/planner/: the estimator (a step replayed on fake tensors), the fit check,
                plans, parallel plans; above the core, whose switches it replays
    launching   workbench/launching/: N processes (the one launcher); it checks the fit of N runs
    classroom   workbench/classroom/: the room, its records and views, the ledger, the fingerprint
    lessons     workbench/lessons/: one module per notebook and what only notebooks use
    top         workbench/__init__.py, api.py, cli.py, __main__.py, preflight.py

A module may import its own layer and the layers below. Some pairs never import each other
although one ranks above the other (APART): the engine and the views (the engine emits records,
views draw them; api.py joins them), the classroom and the planner or the launcher (a room's
records come from finished runs). Every import counts, including those inside functions: a
function-level import is how an upward dependency or a cycle hides from a linter.

The core a learner opens to see how a run is configured, switched, trained, measured and shown
(workbench/core/) is held to a line budget: see test_the_core_stays_within_its_line_budget.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "workbench"
LAYERS = ("base", "machine", "floor", "switches", "config", "measure", "engine", "views", "planner", "launching",
          "classroom", "lessons", "top")
RANK = {name: rank for rank, name in enumerate(LAYERS)}
APART = ({"engine", "views"}, {"classroom", "planner"}, {"classroom", "launching"})
CORE_SUBPACKAGES = ("switches", "config", "measure", "engine", "views")


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[1:2] == ["core"]:
        return parts[2] if len(parts) > 2 and parts[2] in CORE_SUBPACKAGES else "floor"
    return parts[1] if len(parts) >= 2 and parts[1] in RANK else "top"


def imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, imported workbench module) for every import in the file, at any depth."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("workbench")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if not base.startswith("workbench"):
                continue
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                candidate = f"{base}.{alias.name}"
                sub = PACKAGE.parent / (candidate.replace(".", "/") + ".py")
                found.append((node.lineno, candidate if sub.exists() or sub.with_suffix("").is_dir() else base))
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))
GRAPH = {module_name(p): {m for _, m in imports(p)} for p in MODULES}


def test_the_package_has_every_layer_and_no_module_outside_them() -> None:
    layers = {layer(m) for m in GRAPH}
    assert layers == set(RANK)
    top = sorted(m for m in GRAPH if layer(m) == "top")
    assert top == ["workbench", "workbench.__main__", "workbench.api", "workbench.cli", "workbench.preflight"]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down_only(path: pathlib.Path) -> None:
    here = layer(module_name(path))
    upward = []
    for line, target in imports(path):
        there = layer(target)
        side_by_side = {here, there} in APART
        if RANK[there] > RANK[here] or side_by_side:
            upward.append(f"line {line}: {here} imports {target} ({there})")
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_workbench_module_imported_exists(path: pathlib.Path) -> None:
    # A module moved without its importers rewritten fails here, not only where a test happens to
    # reach the import (a relative `from .core.course_files import` in __main__ outlived its move).
    missing = [f"line {line}: {target}" for line, target in imports(path)
               if not (PACKAGE.parent / (target.replace(".", "/") + ".py")).exists()
               and not (PACKAGE.parent / target.replace(".", "/")).is_dir()]
    assert not missing, "no such module: " + "; ".join(missing)


def test_no_import_cycles_even_through_function_level_imports() -> None:
    # Tarjan's strongly connected components over module -> imported module.
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in GRAPH:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    # A package's __init__ re-exporting its own modules is not a cycle of behaviour.
    cycles = [c for c in cycles if not all(m == c[0] or m.startswith(c[0] + ".") for m in c)]
    assert not cycles, cycles


def test_the_checker_sees_function_level_and_relative_imports(tmp_path: pathlib.Path) -> None:
    # The checker itself must not be blind: a planted upward import inside a function.
    fake = PACKAGE / "core" / "_layer_probe.py"
    try:
        fake.write_text("def f():\n    from workbench.core.views import dashboard\n    from ..lessons import planner\n")
        found = [m for _, m in imports(fake)]
        assert found == ["workbench.core.views.dashboard", "workbench.lessons.planner"]
    finally:
        fake.unlink()


def test_no_two_layers_share_a_rank_and_every_pair_apart_is_two_layers() -> None:
    assert len(set(RANK.values())) == len(LAYERS) == len(set(LAYERS))
    assert all(len(pair) == 2 and pair <= set(RANK) for pair in APART)


# The core (issue 39): what a learner opens to see how a run is configured (core/config), switched
# (core/switches), trained (core/engine: the loop), measured (core/measure: meters, records, results)
# and shown (core/views), with its floor (models, data, presets, your own model and data) under it.
# Every line of every module counts, docstrings and comments too: they are what the learner reads.
CORE = PACKAGE / "core"
CORE_LINE_BUDGET = 8_000
"""Issue 39's budget. 7,789 lines on 2026-12-05, when the classroom, the planner's counters and
wrappers, the notebooks' helpers, the launcher, the machine's quirks and the shared checks moved
out (docs/LAYOUT.md). Raise it only with a reason: what grows the core is what a learner reads."""


def core_lines() -> dict[str, int]:
    return {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in sorted(CORE.rglob("*.py"))}


def test_the_core_stays_within_its_line_budget() -> None:
    lines = core_lines()
    total = sum(lines.values())
    largest = ", ".join(f"{name} {n}" for name, n in sorted(lines.items(), key=lambda kv: -kv[1])[:5])
    assert total <= CORE_LINE_BUDGET, (
        f"the core (workbench/core/) holds {total:,} lines, over its budget of {CORE_LINE_BUDGET:,}: move what a "
        f"run does not need out of it (docs/LAYOUT.md). Largest: {largest}")


def test_the_core_is_one_folder_and_its_parts_are_layers() -> None:
    # Nothing of the core lives outside workbench/core/ (the old top-level packages are gone).
    for gone in ("switches", "measure", "engine", "views"):
        assert not (PACKAGE / gone).exists(), f"workbench/{gone}/ is back: its modules belong in workbench/core/{gone}/"
    assert {layer(m) for m in GRAPH if m.startswith("workbench.core")} == {"floor", *CORE_SUBPACKAGES}


def test_no_file_name_repeats_across_the_package() -> None:
    # Issue 39: two `records.py` (the run's records, the room's record format) read as one thing in
    # a traceback, a search or an import; each module's file name is its own.
    seen: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


# Issue 39: imports at the top of a module unless a comment says why. A function-level import is
# a cost moved to the first call (or a cycle, or an optional package) and the reader should not
# have to guess which: the comment on the line before the block (or on one of its lines) says.


def unexplained_function_level_imports(path: pathlib.Path) -> list[int]:
    """First line of each block of consecutive imports inside a function with no comment on the
    line before it or on one of its lines."""
    source = path.read_text()
    lines = source.splitlines()
    found = set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            for field in ("body", "orelse", "finalbody", "handlers"):
                statements = getattr(node, field, None)
                if not isinstance(statements, list):
                    continue
                block: list[ast.stmt] = []
                for statement in [*statements, None]:
                    if isinstance(statement, (ast.Import, ast.ImportFrom)):
                        block.append(statement)
                        continue
                    if block:
                        before = lines[block[0].lineno - 2].strip() if block[0].lineno > 1 else ""
                        own = "\n".join(lines[block[0].lineno - 1:block[-1].end_lineno])
                        if not before.startswith("#") and "#" not in own:
                            found.add(block[0].lineno)
                    block = []
    return sorted(found)


def test_every_function_level_import_says_why() -> None:
    missing = [f"workbench/{path.relative_to(PACKAGE)}:{line}"
               for path in MODULES
               for line in unexplained_function_level_imports(path)]
    assert not missing, ("imports inside a function with no comment saying why they are not at the top of "
                         "the module (issue 39): move each up, or say why it must wait:\n" + "\n".join(missing))


def test_the_import_comment_check_sees_a_silent_block(tmp_path: pathlib.Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    import json\n    import os\n\n\ndef g():\n    # lazy: a reason\n    import csv\n"
                     "    import io\n\n\ndef h():\n    import re  # a reason\n")
    assert unexplained_function_level_imports(probe) == [2]
