"""The dashboard, as a learner sees it: a real JupyterLab in headless Chromium.

Each test writes a notebook, runs its cells one at a time with Ctrl+Enter (as a learner
would), reads the widget DOM while they run and saves screenshots of each cell under
test-artifacts/ (git-ignored):

  dashboard_running.png      a run mid-way: the curve drawn in the browser, growing
  dashboard_done.png         the same run finished, as it stays after a later run
  dashboard_shared.png       one view the notebook made and passed to three runs
  dashboard_interrupted.png  Kernel > Interrupt (the toolbar's stop button) mid-run
  dashboard_oom.png          a run over a simulated memory budget (and _details.png, unfolded)

The widgets must render as widgets (the JupyterLab extensions of ipywidgets and bqplot
installed): where they show as plain text these tests fail.
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

pytestmark = pytest.mark.browser

# ~8 s of real training (the small MLP, 3,000 steps, a point every 20) with the default view.
LONG_RUN_CELL = """\
import workbench as wb
from workbench.core.views.dashboard import Dashboard, default_sinks
assert isinstance(default_sinks()[0], Dashboard), default_sinks()
first = wb.run(wb.RunConfig(model="mlp", preset="cpu-quick", steps=3000, log_every=20, eval_samples=0),
               name="first run")
assert first.status == "ok", first.status
"""
SECOND_RUN_CELL = """\
second = wb.run(wb.RunConfig(model="mlp", preset="cpu-quick", steps=300, log_every=10, eval_samples=0),
                name="second run")
from workbench.core.measure.result import results_table
table = results_table([second])
print("results table:", dict(zip(table.header, table.rows[0])))
"""
SHARED_VIEW_CELL = """\
view = wb.Dashboard()  # one view for the three runs below, asked for
same = wb.RunConfig(model="mlp", preset="cpu-quick", steps=60, log_every=5, eval_samples=0)
for name in ("fp32 a", "fp32 b", "fp32 c"):  # the same seed: the same curve three times
    wb.run(same, sinks=[view], name=name)
"""
INTERRUPTED_CELL = """\
import workbench as wb
wb.run(wb.RunConfig(model="mlp", preset="cpu-quick", steps=200_000, log_every=20, eval_samples=0),
       name="stopped by hand")
"""
OOM_CELL = """\
# A simulated 1 MB device: the model state alone needs more.
oom = wb.run(wb.RunConfig(model="mlp", preset="cpu-quick", memory_budget_bytes=1_000_000, eval_samples=0),
             name="over budget")
assert oom.status == "oom", oom.status
"""

CELL = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell"

# What the reader sees in cell `index`: the texts of the view, its curve and images.
READ_CELL_JS = """([cellSelector, index]) => {
  const el = document.querySelectorAll(cellSelector)[index];
  if (!el) return null;
  const text = (sel) => { const n = el.querySelector(sel); return n ? n.innerText.trim() : null; };
  const shown = (n) => !!n && n.getClientRects().length > 0;
  const bar = el.querySelector('.wb-progress .progress-bar');
  const figure = el.querySelector('.wb-plot-figure');
  const path = figure && figure.querySelector('path.line');
  const d = path ? path.getAttribute('d') || '' : '';
  const images = [...el.querySelectorAll('.jp-OutputArea-output img')];
  return {
    prompt: text('.jp-InputArea-prompt'),
    dashboard: !!el.querySelector('.jupyter-widgets.wb-dashboard'),
    dashboards: el.querySelectorAll('.jupyter-widgets.wb-dashboard').length,
    view_text: text('.wb-dashboard'),
    title: text('.wb-title'),
    status: text('.wb-status'),
    step: text('.wb-step'),
    details: text('.wb-details summary'),
    details_open: !!el.querySelector('.wb-details details[open]'),
    details_text: text('.wb-details details'),
    mean_ms: text('.wb-numbers [data-k="mean_step_time_s"]'),
    mean_samples: text('.wb-numbers [data-k="mean_samples_per_sec"]'),
    bar_width: bar ? bar.style.width : null,
    bar_class: bar ? bar.className : null,
    bar_pixels: bar ? bar.getBoundingClientRect().width : null,
    title_pixels: (el.querySelector('.wb-title') || {getBoundingClientRect: () => ({width: 0})})
      .getBoundingClientRect().width,
    figure_rendered: !!(figure && figure.classList.contains('bqplot') && figure.querySelector('svg')),
    figure_shown: shown(figure),
    curve_points: (d.match(/[ML]/g) || []).length,
    curve_d: d,
    images: images.map((img) => ({ok: img.complete && img.naturalWidth > 0, src: img.src.slice(-4000)})),
    // (hidden ones too: a figure that failed to load is hidden like a working one once its run ends)
    widget_errors: [
      ...[...el.querySelectorAll('.jupyter-widgets-error-widget')].map((n) => 'a widget view failed: ' +
        ((n.parentElement || n).className || '') + ' ' + (n.parentElement || n).textContent.trim()),
      ...[...el.querySelectorAll('.jupyter-widgets')].filter((n) => n.children.length === 0)
        .map((n) => n.textContent.trim()).filter((t) => /Error displaying widget|model not found/.test(t)),
    ],
    plain_widget_text: /HTML\\(value=|VBox\\(children=|Figure\\(/.test(el.innerText),
    errors: [...el.querySelectorAll('[data-mime-type="application/vnd.jupyter.error"]')].map((n) => n.innerText),
    // (JupyterLab 4 renders a raised exception's traceback as stderr.)
    stderr: [...el.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]')].map((n) => n.innerText),
    output_text: text('.jp-Cell-outputArea'),
  };
}"""


def _read(page, index: int) -> dict | None:
    return page.evaluate(READ_CELL_JS, [CELL, index])


def _kernel_idle(page) -> bool:
    return page.evaluate(
        "() => [...document.querySelectorAll('.jp-StatusBar-TextItem')]"
        ".some((e) => /ipykernel\\) \\| Idle/.test(e.textContent))"
    )


def _fail(page, lab, message: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard_browser_failure.png"))
    pytest.fail(f"{message}\n{lab.log_tail()}")


def _wait(page, lab, condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            _fail(page, lab, f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)


def _open(page, lab, name: str, *cells: str) -> None:
    lab.write_notebook(name, *cells)
    page.goto(lab.notebook_url(name))
    _wait(page, lab, lambda: _kernel_idle(page), 60, "the kernel to be idle")


def _run_cell(page, index: int) -> None:
    page.locator(f"{CELL} .jp-InputArea-editor").nth(index).click()
    page.keyboard.press("Control+Enter")  # run in place (Shift+Enter would add a cell)


def _finished(sample: dict | None) -> bool:
    return bool(sample) and sample["prompt"] not in (None, "[ ]:", "[*]:")


def _shot(page, index: int, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(CELL).nth(index).screenshot(path=str(ARTIFACTS / name))


def _assert_rendered_as_widgets(sample: dict) -> None:
    assert sample["dashboard"] and not sample["plain_widget_text"], (
        "the dashboard did not render as a widget (is the ipywidgets JupyterLab extension installed?); "
        f"the cell showed: {sample['output_text']!r}")
    assert not sample["widget_errors"], (
        f"a widget failed to render (is bqplot's JupyterLab extension installed?): {sample['widget_errors']}")
    assert all(image["ok"] for image in sample["images"]), "a broken image in the cell's outputs"


def _view_state(sample: dict) -> dict:
    """What the reader sees of a finished run's cell, which must not change: its text, the
    curve (while shown: a hidden figure's path is re-laid out by any resize) and images."""
    return {"text": sample["view_text"], "figure_shown": sample["figure_shown"],
            "curve": hashlib.sha1(sample["curve_d"].encode()).hexdigest() if sample["figure_shown"] else None,
            "images": [hashlib.sha1(i["src"].encode()).hexdigest() for i in sample["images"]],
            "bar": (sample["bar_width"], sample["bar_class"])}


def _changes(before: dict, after: dict) -> dict:
    return {key: (before[key], after[key]) for key in before if before[key] != after[key]}


def test_each_run_draws_its_curve_live_and_keeps_its_final_view(jupyter_lab, page):
    _open(page, jupyter_lab, "live.ipynb", LONG_RUN_CELL, SECOND_RUN_CELL, SHARED_VIEW_CELL)
    _run_cell(page, 0)

    samples: list[dict] = []
    shot_taken = False
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        sample = _read(page, 0)
        samples.append(sample)
        if _finished(sample):
            break
        if sample and sample["figure_rendered"] and sample["curve_points"] >= 20 and not shot_taken:
            _shot(page, 0, "dashboard_running.png")
            shot_taken = True
        time.sleep(0.5)
    done = samples[-1]
    _shot(page, 0, "dashboard_done.png")
    assert _finished(done), f"the cell did not finish: {done}"
    assert not done["errors"], f"the cell raised:\n{done['errors']}"
    assert not [s for s in done["stderr"] if "Traceback" in s or "dashboard error" in s], done["stderr"]
    _assert_rendered_as_widgets(done)

    failed = [s["widget_errors"] for s in samples if s and s["widget_errors"]]
    assert not failed, f"a widget failed to render (is bqplot's JupyterLab extension installed?): {failed[0]}"
    broken = [s for s in samples if s and not all(image["ok"] for image in s["images"])]
    assert not broken, f"a broken image showed while the cell ran (at the kernel's first run): {broken[0]}"
    # While the view says "running": once the run has ended the live figure steps aside for its
    # static copy, and the cell's prompt still reads [*] while the kernel renders that copy (a
    # reading in that window failed CI once: "hidden during the run")
    live = [s for s in samples if s and s["prompt"] == "[*]:" and s["figure_rendered"] and s["curve_points"]
            and "running" in (s["status"] or "")]
    assert len(live) >= 3, f"fewer than three readings of a drawn curve while the cell ran: {samples[-3:]}"
    assert live[-1]["curve_points"] > live[0]["curve_points"], (
        f"the curve did not grow during the run: {[s['curve_points'] for s in live]}")
    assert all(s["figure_shown"] for s in live), "the live curve was hidden during the run"
    assert len({s["step"] for s in live}) >= 2, "the step counter did not move during the run"
    assert shot_taken, "no mid-run screenshot: the curve never had 20 points while the cell ran"

    assert done["status"] == "done", done["status"]
    steps_done, total = map(int, re.match(r"step (\d+) / (\d+)", done["step"]).groups())
    assert steps_done == total == 3000, done["step"]
    assert done["bar_width"] == "100%" and "success" in done["bar_class"], done
    assert len(done["images"]) == 1, "the final curve was not left as one static image output"
    assert not done["figure_shown"], "the live figure should step aside for its static copy"
    before = _view_state(done)

    _run_cell(page, 1)
    _wait(page, jupyter_lab, lambda: _finished(_read(page, 1)), 90, "the second cell to finish")
    second = _read(page, 1)
    assert not second["errors"], second["errors"]
    _assert_rendered_as_widgets(second)
    assert second["title"].startswith("second run") and second["status"] == "done", second
    # The view's run means are the results table's figures, string for string.
    table = second["output_text"]
    assert f"'ms / step': '{second['mean_ms']}'" in table, (second["mean_ms"], table)
    assert f"'samples / s': '{second['mean_samples']}'" in table, (second["mean_samples"], table)

    after = _read(page, 0)
    assert after["title"].startswith("first run"), after["title"]
    assert _view_state(after) == before, f"the first cell's view changed when a later cell ran: {_changes(before, _view_state(after))}"

    _run_cell(page, 2)
    _wait(page, jupyter_lab, lambda: _finished(_read(page, 2)), 90, "the shared-view cell to finish")
    shared = _read(page, 2)
    _shot(page, 2, "dashboard_shared.png")
    assert not shared["errors"] and not shared["stderr"], shared["errors"] + shared["stderr"]
    _assert_rendered_as_widgets(shared)
    assert shared["dashboards"] == 1 and len(shared["images"]) == 1, (
        f"one view and one static image for the three runs, not {shared['dashboards']} and {len(shared['images'])}")
    assert "fp32 b (dashed, circle markers) lies on fp32 a" in shared["view_text"], shared["view_text"]
    assert "runs on this view" in shared["view_text"] and "fp32 c" in shared["view_text"]
    assert _view_state(_read(page, 0)) == before, _changes(before, _view_state(_read(page, 0)))


def test_interrupted_and_out_of_memory_runs_say_so_in_a_short_line_with_details(jupyter_lab, page):
    _open(page, jupyter_lab, "failures.ipynb", INTERRUPTED_CELL, OOM_CELL)
    _run_cell(page, 0)
    _wait(page, jupyter_lab, lambda: (_read(page, 0) or {}).get("curve_points", 0) >= 10, 90,
          "the curve of the run to interrupt")
    page.locator('.jp-NotebookPanel:not(.lm-mod-hidden) [data-command="notebook:interrupt-kernel"]').click()
    _wait(page, jupyter_lab, lambda: _finished(_read(page, 0)), 60, "the interrupted cell to stop")
    time.sleep(0.5)  # the last widget messages
    stopped = _read(page, 0)
    _shot(page, 0, "dashboard_interrupted.png")
    _assert_rendered_as_widgets(stopped)
    assert stopped["status"] == "interrupted", stopped["status"]
    # JupyterLab renders a cell's error as stderr: the RunInterrupted that stops Run All there,
    # one line under the view rather than a screen of library frames.
    error = " ".join(stopped["stderr"])
    assert "RunInterrupted: stopped by hand" in error, "Run All must stop at an interrupted run"
    assert "Traceback" not in error and len(error.splitlines()) <= 3, error
    at = int(re.match(r"stopped at step (\d+) / 200000", stopped["step"]).group(1))
    assert stopped["details"] == f"interrupted at step {at} of 200000: details", stopped["details"]
    assert not stopped["details_open"], "the details start folded"
    assert "warning" in stopped["bar_class"] and stopped["bar_width"] == "100%", stopped
    assert len(stopped["images"]) == 1, "the curve so far is left as a static image"

    _run_cell(page, 1)
    _wait(page, jupyter_lab, lambda: _finished(_read(page, 1)), 90, "the out-of-memory cell to finish")
    oom = _read(page, 1)
    _shot(page, 1, "dashboard_oom.png")
    assert not oom["errors"] and not oom["stderr"], oom["errors"] + oom["stderr"]
    _assert_rendered_as_widgets(oom)
    assert oom["status"] == "out of memory", oom["status"]
    assert oom["details"] == "out of memory at step 1 of 30: details", oom["details"]
    assert "danger" in oom["bar_class"] and oom["bar_width"] == "100%" and oom["bar_pixels"] > 50, oom
    assert oom["title_pixels"] > 200, f"the title is squeezed to {oom['title_pixels']} px"
    assert oom["images"] == [], "a run that logged no step has no curve to show"
    page.locator(CELL).nth(1).locator(".wb-details summary").click()
    _wait(page, jupyter_lab, lambda: _read(page, 1)["details_open"], 10, "the details to unfold")
    _shot(page, 1, "dashboard_oom_details.png")
    assert "Simulated by the workbench" in _read(page, 1)["details_text"]
