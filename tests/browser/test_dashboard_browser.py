"""The dashboard, live in a real JupyterLab in headless Chromium.

Runs one cell that trains for ~8 s with the default sinks, reads the widget DOM
while it runs (the step and the throughput must change), then checks the final
state (status done, the static final plot in the cell's outputs) and saves
screenshots under test-artifacts/.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

pytestmark = pytest.mark.browser

# Two versions of the cell under test; RUN_CELL_SOURCE (at the end) picks one.
# A fake trainer that emits the records workbench.run() emits (no torch, no train.py):
FAKE_TRAINER_CELL = """\
# A fake trainer: emits the records workbench.run() emits, for ~8 s.
import random, time
from workbench.views.dashboard import Dashboard, default_sinks
from workbench.views.sinks import RunEnd, RunStart, StepRecord

sinks = default_sinks()
assert isinstance(sinks[0], Dashboard), f"expected the dashboard here, got {sinks}"
total, began = 80, time.perf_counter()
for sink in sinks:
    sink.start(RunStart("browser-check", total, "cpu", "fp32", {}, warnings=("fake trainer",)))
for step in range(1, total + 1):
    time.sleep(random.uniform(0.05, 0.15))
    elapsed = time.perf_counter() - began
    record = StepRecord(
        "browser-check", step, total, loss=2.5 / step**0.5, elapsed_s=elapsed,
        step_time_s=elapsed / step, samples_per_sec=64 * step / elapsed,
        memory_bytes=(200 + step) << 20, memory_peak_bytes=(250 + step) << 20,
        activation_bytes=3 << 20,
    )
    for sink in sinks:
        sink.log(record)
for sink in sinks:
    sink.end(RunEnd("browser-check", "ok", total))
"""

# A real run of ~8 s on the small MLP, with the default sinks (the dashboard here):
WORKBENCH_RUN_CELL = """\
import workbench as wb
from workbench.views.dashboard import Dashboard, default_sinks
assert isinstance(default_sinks()[0], Dashboard), default_sinks()
result = wb.run(wb.RunConfig(model="mlp", steps=3000, log_every=20), name="browser-check")
assert result.status == "ok", result.status
"""

RUN_CELL_SOURCE = WORKBENCH_RUN_CELL

CELL = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell"

# One snapshot of what the reader sees in the first cell.
READ_CELL_JS = """(cell) => {
  const el = document.querySelector(cell);
  if (!el) return null;
  const text = (sel) => { const n = el.querySelector(sel); return n ? n.innerText.trim() : null; };
  const plot = el.querySelector('img.wb-plot');
  const statics = [...el.querySelectorAll('.jp-RenderedImage img')];
  return {
    prompt: text('.jp-InputArea-prompt'),
    dashboard: !!el.querySelector('.jupyter-widgets.wb-dashboard'),
    step: text('.wb-step .widget-html-content'),
    samples: text('.wb-numbers [data-k="samples_per_sec"]'),
    status: text('.wb-status .widget-html-content'),
    bar: (el.querySelector('.wb-progress .progress-bar') || {style: {}}).style.width || null,
    plot_src: plot && plot.complete && plot.naturalWidth > 0 ? plot.src : null,
    static_images: statics.filter((img) => img.complete && img.naturalWidth > 0).length,
    errors: [...el.querySelectorAll('[data-mime-type="application/vnd.jupyter.error"]')]
      .map((n) => n.innerText),
    stderr: [...el.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]')]
      .map((n) => n.innerText),
    output_text: text('.jp-Cell-outputArea'),
  };
}"""


def _kernel_idle(page) -> bool:
    return page.evaluate(
        "() => [...document.querySelectorAll('.jp-StatusBar-TextItem')]"
        ".some((e) => /ipykernel\\) \\| Idle/.test(e.textContent))"
    )


def _wait(page, condition, timeout_s: float, what: str, lab) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard_browser_failure.png"))
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}\n{lab.log_tail()}")
        time.sleep(0.2)


def test_dashboard_updates_live_in_jupyterlab_and_keeps_the_final_state(jupyter_lab, page):
    jupyter_lab.write_notebook("dashboard.ipynb", RUN_CELL_SOURCE)
    page.goto(jupyter_lab.notebook_url("dashboard.ipynb"))
    _wait(page, lambda: _kernel_idle(page), 60, "the kernel to be idle", jupyter_lab)

    page.locator(f"{CELL} .jp-InputArea-editor").first.click()
    page.keyboard.press("Control+Enter")  # run in place (Shift+Enter would add a cell)

    samples: list[dict] = []
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        sample = page.evaluate(READ_CELL_JS, CELL)
        samples.append(sample)
        if sample and sample["prompt"] not in (None, "[ ]:", "[*]:"):
            break  # the cell finished
        if sample and sample["prompt"] == "[*]:" and sample["step"] and len(samples) % 8 == 4:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard_browser_live.png"))
        time.sleep(0.5)
    final = samples[-1]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard_browser.png"))

    assert final and final["prompt"] not in ("[ ]:", "[*]:"), f"the cell did not finish: {final}"
    assert not final["errors"], f"the cell raised:\n{final['errors']}"
    tracebacks = [s for s in final["stderr"] if "Traceback" in s or "dashboard error" in s]
    assert not tracebacks, f"errors on stderr:\n{tracebacks}"
    assert any(s and s["dashboard"] for s in samples), (
        "the dashboard never rendered as a widget (is the jupyterlab_widgets extension installed?); "
        f"the cell showed: {final['output_text']!r}"
    )

    live = [s for s in samples if s and s["prompt"] == "[*]:" and s["dashboard"] and s["step"]]
    assert len(live) >= 2, f"fewer than two readings while the cell ran: {samples}"
    assert len({s["step"] for s in live}) >= 2, "the step counter did not move during the run"
    assert len({s["samples"] for s in live}) >= 2, "the throughput did not change during the run"
    assert len({s["bar"] for s in live}) >= 2, "the progress bar did not move during the run"
    assert any(s["plot_src"] for s in live), "the live loss plot never showed an image"

    assert final["status"] and final["status"].startswith("done"), final
    done, total = map(int, re.match(r"step (\d+) / (\d+)", final["step"]).groups())
    assert done == total, final
    assert final["bar"] == "100%", final
    assert final["static_images"] >= 1, "the final plot was not left as a static image output"
