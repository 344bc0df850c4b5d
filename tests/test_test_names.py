"""No test module defines one top-level name twice: the second silently replaces the first, and pytest
runs only it. A merge once left two fixtures called `tiny_result` in tests/test_hostile.py; the compare
tests then got the other one's run, named 'mlp fp32 b32' instead of 'baseline', and failed in CI."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def defined_twice(source: str) -> list[str]:
    names = Counter(node.name for node in ast.parse(source).body
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
    return sorted(name for name, count in names.items() if count > 1)


def test_the_check_finds_a_name_defined_twice():
    assert defined_twice("def a(): pass\ndef b(): pass\ndef a(): pass\n") == ["a"]


@pytest.mark.parametrize("path", sorted(TESTS.rglob("*.py")), ids=lambda p: str(p.relative_to(TESTS)))
def test_no_test_module_defines_a_name_twice(path):
    assert defined_twice(path.read_text()) == [], f"{path.name} defines these twice; rename one"
