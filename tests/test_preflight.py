"""The workshop pre-flight: every check reports, a missing piece is a problem with its fix."""

import io
import json

from workbench import preflight


def test_a_ready_machine_passes_every_check_quickly(tmp_path):
    out = io.StringIO()
    findings = preflight.preflight(stream=out)
    text = out.getvalue()
    assert not [f for f in findings if f.status == "problem"], text
    for what in ("required packages", "MNIST digits", "MiniLM weights", "bf16", "fp16", "a training run"):
        assert what in text
    assert "ready: every notebook can run here" in text
    assert preflight.main(["--json", str(tmp_path / "f.json")]) == 0
    assert {f["what"] for f in json.loads((tmp_path / "f.json").read_text())} >= {"a training run", "GPU"}


def test_a_missing_package_is_a_problem_that_says_how_to_fix_it(monkeypatch):
    monkeypatch.setattr(preflight, "REQUIRED", (*preflight.REQUIRED, "no_such_package_here"))
    out = io.StringIO()
    findings = preflight.preflight(stream=out)
    problem = next(f for f in findings if f.status == "problem")
    assert "no_such_package_here" in problem.detail and "make lab" in problem.detail
    assert "1 problem(s)" in out.getvalue()


def test_a_check_that_breaks_is_reported_not_raised(monkeypatch):
    def broken():
        raise OSError("disk gone")

    monkeypatch.setitem(preflight.CHECKS, "data", broken)
    findings = preflight.preflight(stream=io.StringIO())
    assert any(f.what == "data" and "OSError: disk gone" in f.detail for f in findings)
