"""A real JupyterLab and a headless Chromium for widget tests (see shared BROWSER_TESTING.md).

Tests here skip only when the browser or playwright is missing (install them with
`.ci/install-browser.sh`); everything else that goes wrong is a failure.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# JupyterLab settings for a quiet, read-only session: no autosave, no news pop-up.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False,
    },
}


@pytest.fixture(scope="session")
def chromium_executable() -> str:
    for candidate in CHROMIUM_CANDIDATES:
        executable = os.path.isfile(candidate) and os.access(candidate, os.X_OK)
        found = candidate if executable else shutil.which(candidate)
        if found:
            return found
    pytest.skip("no Chromium found (run .ci/install-browser.sh: apt package `chromium`)")


@pytest.fixture(scope="session")
def browser(chromium_executable: str) -> Iterator[object]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Python playwright not installed (run .ci/install-browser.sh)"
    )
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=chromium_executable, args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


@dataclass
class JupyterLab:
    url: str
    token: str
    root: Path
    log: Path

    def api(self, path: str, method: str = "GET") -> object:
        request = urllib.request.Request(
            f"{self.url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            body = response.read()
        return json.loads(body) if body else None

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?reset&token={self.token}"

    def write_notebook(self, name: str, *code_cells: str) -> Path:
        cells = [
            {"cell_type": "code", "execution_count": None, "id": f"cell{i}", "metadata": {},
             "outputs": [], "source": source}
            for i, source in enumerate(code_cells)
        ]
        notebook = {
            "cells": cells, "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                        "language": "python"}},
        }
        path = self.root / name
        path.write_text(json.dumps(notebook))
        return path

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def jupyter_lab(tmp_path: Path) -> Iterator[JupyterLab]:
    """JupyterLab on 127.0.0.1, a free port and a random token, all its files in tmp_path."""
    root, settings = tmp_path / "root", tmp_path / "settings"
    root.mkdir()
    for name, values in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        WORKBENCH_HEADLESS="0",  # the kernel is watched by a (headless) browser: use widgets
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        IPYTHONDIR=str(tmp_path / "ipython"),
    )
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={settings}",
        f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
    ]
    if os.geteuid() == 0:
        command.append("--allow-root")  # jupyter refuses to run as root otherwise
    log = tmp_path / "jupyter.log"
    with log.open("wb") as log_file:
        server = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=root)
    lab = JupyterLab(f"http://127.0.0.1:{port}", token, root, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                pytest.fail(f"jupyter lab exited with {server.returncode}:\n{lab.log_tail()}")
            try:
                lab.api("/api/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"jupyter lab did not answer within 60 s:\n{lab.log_tail()}")
                time.sleep(0.25)
        yield lab
    finally:
        _stop_server(server, lab)


def _stop_server(server: subprocess.Popen, lab: JupyterLab) -> None:
    """Stop the kernels and the server; kernels live in their own session, so end them by PID."""
    import psutil

    try:
        children = psutil.Process(server.pid).children(recursive=True)
    except psutil.Error:
        children = []
    try:
        for kernel in lab.api("/api/kernels") or []:
            lab.api(f"/api/kernels/{kernel['id']}", method="DELETE")
    except OSError:
        pass
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    for child in children:
        try:
            child.terminate()
            child.wait(timeout=5)
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired:
            child.kill()


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1280, "height": 1400})
    try:
        yield context.new_page()
    finally:
        context.close()
