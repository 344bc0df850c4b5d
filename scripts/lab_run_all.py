"""Run All in a real JupyterLab, as a learner does, for each notebook: headless Chromium clicks
Run > Run All Cells, waits until every code cell has run (or an error stopped the queue), and
records the time, the errors and a screenshot.

    python scripts/lab_run_all.py --preset cpu 00_tour 01_mixed_precision   # or no names: all
    python scripts/lab_run_all.py --preset cpu-quick --out test-artifacts/run-all

Needs Chromium and playwright (`.ci/install-browser.sh`). Works on copies of the notebooks in a
temporary folder (JupyterLab writes outputs and checkpoints: the repository's files stay as they
are). Exit status 1 when a notebook shows an error or does not finish within --timeout-s.
What a browser sees that nbval cannot: the widgets render (the extension is there), the dashboard
ends in its final state, nothing waits for input.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHROMIUM = next((p for p in ("/usr/lib/chromium/chromium", shutil.which("chromium") or "") if p and os.path.exists(p)), None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CELLS = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell"
ERRORS = ('.jp-NotebookPanel:not(.lm-mod-hidden) [data-mime-type="application/vnd.jupyter.error"]')


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_lab(folder: pathlib.Path, preset: str) -> tuple[subprocess.Popen, str]:
    # No autosave, no news pop-up, and every cell in the page (JupyterLab 4 leaves cells out of view
    # out of the DOM by default: their prompts could not be read)
    for plugin, values in (("docmanager-extension/plugin", {"autosave": False}),
                           ("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False}),
                           ("notebook-extension/tracker", {"windowingMode": "none"})):
        path = folder / "settings" / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "WORKBENCH_PRESET": preset, "WORKBENCH_HEADLESS": "0", "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "JUPYTER_CONFIG_DIR": str(folder / "config"), "JUPYTER_RUNTIME_DIR": str(folder / "runtime"),
           "IPYTHONDIR": str(folder / "ipython")}
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={folder / 'notebooks'}", f"--LabApp.user_settings_dir={folder / 'settings'}",
               f"--LabApp.workspaces_dir={folder / 'workspaces'}"] + (["--allow-root"] if os.geteuid() == 0 else [])
    log = open(folder / "jupyter.log", "wb")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"jupyter lab exited: see {folder / 'jupyter.log'}")
        try:
            urllib.request.urlopen(urllib.request.Request(f"{url}/api/status",
                                                          headers={"Authorization": f"token {token}"}), timeout=5)
            return server, f"{url}|{token}"
        except OSError:
            time.sleep(0.5)
    raise SystemExit("jupyter lab did not answer within 90 s")


def _stop(server: subprocess.Popen) -> None:
    import psutil

    try:
        children = psutil.Process(server.pid).children(recursive=True)
    except psutil.Error:
        children = []
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
    for child in children:  # kernels run in their own sessions
        try:
            child.kill()
        except psutil.Error:
            pass


def _shut_down_kernels(url: str, token: str) -> None:
    """One kernel at a time: each notebook's kernel ends before the next starts (memory, cores)."""
    headers = {"Authorization": f"token {token}"}
    with urllib.request.urlopen(urllib.request.Request(f"{url}/api/sessions", headers=headers), timeout=10) as r:
        sessions = json.loads(r.read())
    for session in sessions:
        urllib.request.urlopen(urllib.request.Request(f"{url}/api/sessions/{session['id']}", method="DELETE",
                                                      headers=headers), timeout=30)


def run_all(page, url: str, token: str, name: str, timeout_s: float, shots: pathlib.Path) -> dict:
    page.goto(f"{url}/lab/tree/{name}.ipynb?reset&token={token}")
    page.wait_for_selector(CELLS, timeout=60_000)
    page.wait_for_function("() => document.body.innerText.includes('Idle')", timeout=90_000)
    page.click("text=Run", timeout=10_000)  # the menu bar's Run menu
    page.click("text=Run All Cells", timeout=10_000)
    start = time.monotonic()
    time.sleep(2)
    status = "timeout"
    while time.monotonic() - start < timeout_s:
        prompts = page.eval_on_selector_all(
            f"{CELLS} .jp-InputArea-prompt", "els => els.map(e => e.innerText.trim())")
        running = [p for p in prompts if p in ("[*]:", "[*]")]
        if page.query_selector(ERRORS):
            if not running:
                status = "error"
                break
        elif not running and all(p not in ("[ ]:", "[ ]", "") for p in prompts):
            status = "ok"
            break
        time.sleep(1)
    seconds = time.monotonic() - start
    errors = page.eval_on_selector_all(ERRORS, "els => els.map(e => e.innerText.slice(0, 1500))")
    widgets = len(page.query_selector_all(".jp-NotebookPanel:not(.lm-mod-hidden) .jupyter-widgets"))
    page.screenshot(path=str(shots / f"{name}.png"), full_page=False)
    return {"status": status, "seconds": round(seconds, 1), "errors": errors, "widget_views": widgets}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="names without .ipynb (default: all)")
    parser.add_argument("--preset", default="cpu-quick")
    parser.add_argument("--timeout-s", type=float, default=400)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "test-artifacts" / "run-all")
    parser.add_argument("--record", type=pathlib.Path, default=None,
                        help="also write the times as a record for scripts/course_facts.py, "
                             "e.g. benchmarks/results/lab-cpu.json")
    args = parser.parse_args()
    if CHROMIUM is None:
        raise SystemExit("no Chromium: run .ci/install-browser.sh")
    from playwright.sync_api import sync_playwright

    names = args.notebooks or sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    shots = args.out / args.preset
    shots.mkdir(parents=True, exist_ok=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="workbench-run-all-") as scratch:
        folder = pathlib.Path(scratch)
        shutil.copytree(ROOT / "notebooks", folder / "notebooks")
        for copy in (folder / "notebooks").glob("*.ipynb"):  # a fresh notebook: no outputs, no counts
            nb = json.loads(copy.read_text())
            for cell in nb["cells"]:
                if cell["cell_type"] == "code":
                    cell["outputs"], cell["execution_count"] = [], None
            nb.get("metadata", {}).pop("widgets", None)
            copy.write_text(json.dumps(nb))
        server, address = _start_lab(folder, args.preset)
        url, token = address.split("|")
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                for name in names:
                    page = browser.new_page(viewport={"width": 1280, "height": 1400})
                    try:
                        results[name] = run_all(page, url, token, name, args.timeout_s, shots)
                    finally:
                        page.close()
                        _shut_down_kernels(url, token)
                    print(f"{name:<40} {results[name]['status']:<8} {results[name]['seconds']:>6.1f} s  "
                          f"{results[name]['widget_views']} widget views"
                          + (f"\n    {results[name]['errors'][0][:400]}" if results[name]["errors"] else ""), flush=True)
                browser.close()
        finally:
            _stop(server)
    (shots / "summary.json").write_text(json.dumps({"preset": args.preset, "notebooks": results}, indent=1))
    if args.record:  # one column of README's times table (scripts/course_facts.py)
        args.record.write_text(json.dumps({
            "label": f"{args.preset}, JupyterLab", "kind": "lab", "preset": args.preset,
            "date": time.strftime("%Y-%m-%d"), "load_average": os.getloadavg(),
            "notebooks": {n: {"status": r["status"], "seconds": r["seconds"]} for n, r in results.items()},
            "total_seconds": round(sum(r["seconds"] for r in results.values()), 1)}, indent=1) + "\n")
    return 0 if all(r["status"] == "ok" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
