"""The room on one machine (issues 29, 40): `make room` on loopback, a teacher and three learners in four
browsers at once, over HTTPS, with the package index and npm unreachable.

One hub for the module (make room SEATS=3 --https, as root; three learner accounts and a teacher's with a
prefix of their own, removed at the end by make room-reset), started with pip's index and npm's registry
pointing at a closed port and `npm`/`node` replaced by stubs that fail: everything comes from the
environment. The teacher opens the room's notebook and watches the live room; each learner logs in through
the hub's login page (PAM), gets their own copy of 00 and Run All runs it to its end, the three at once;
its last cell shares their runs (one learner's prediction too), and the teacher's view shows all three
without a cell being run again. One learner can neither read nor change another's files, nor reach their
server; a run asking for more than the learner's memory limit is refused in one line, and a kernel that
allocates past the limit anyway is the only one stopped. The teacher restarts a learner's server from the
hub's admin page; `make room-update` brings a fixed notebook to every learner without touching their
work; an idle learner's server is stopped by the hub's idle culler. Screenshots and the measured times:
test-artifacts/room/.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "test-artifacts/room"
CELLS = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell"
ERRORS = '.jp-NotebookPanel:not(.lm-mod-hidden) [data-mime-type="application/vnd.jupyter.error"]'
STDERR = '.jp-NotebookPanel:not(.lm-mod-hidden) [data-mime-type="application/vnd.jupyter.stderr"]'
IDLE_JS = ("() => [...document.querySelectorAll('.jp-StatusBar-TextItem')]"
           ".some((e) => /ipykernel\\) \\| Idle/.test(e.textContent))")
MEMORY = "1536M"  # each learner's limit here: 00 under cpu-quick peaks well below it
CULL_IDLE_S = 120  # the idle culler's timeout here (a workshop's default: an hour); a server started under
# load can take a minute before its learner's page first reaches it: a shorter timeout culled those here


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _make(*args: str, env: dict) -> subprocess.CompletedProcess:
    # `-o setup`: this environment is installed already (setup's own offline install is the wheelhouse's
    # test), and a test must not re-install it.
    return subprocess.run(["make", "-o", "setup", *args, f"PY={sys.executable}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


WATCH_CELL = """
import json
from workbench.lessons import room as lesson
room = lesson.simulated_room(("learner-a",))
open("room.json", "w").write(json.dumps({"url": room.url, "key": room.learner_keys["learner-a"]}))
view = lesson.watch(room, every_s=1)
view
"""


def test_the_teachers_view_refreshes_itself_while_a_learner_shares(jupyter_lab, page):
    """No root, no hub: JupyterLab, the teacher's live view on a simulated room, and a share from outside
    the kernel; the page shows it without a cell being run (the refresh task, widgets updated in place)."""
    from workbench.classroom import sharing as share

    jupyter_lab.write_notebook("watch.ipynb", WATCH_CELL, "view.stop()\nroom.stop()")
    page.goto(jupyter_lab.notebook_url("watch.ipynb"))
    page.wait_for_selector(CELLS, timeout=90_000)
    page.wait_for_function(IDLE_JS, timeout=120_000)
    _run_cell(page, 0)
    widgets = ".jp-NotebookPanel:not(.lm-mod-hidden) .jupyter-widgets"
    page.wait_for_selector(f"{widgets} >> text=0 records from 0 learners", timeout=30_000)
    where = json.loads((jupyter_lab.root / "room.json").read_text())
    row = {"notebook": "00_tour", "exercise": "answer_a", "predicted": 2.0, "measured": 1.6, "kind": "ratio",
           "unit": "x", "verdict": "wrong"}
    made = share.records(predictions=[row], notebook="00_tour", name="Ada")
    shared_at = time.monotonic()
    share._call(where["url"], "POST", "records", body={"records": made}, timeout_s=30, key=where["key"])
    page.wait_for_selector(f"{widgets} >> text=1 records from 1 learners", timeout=30_000)
    seen_s = time.monotonic() - shared_at
    assert "answer_a" in " ".join(_texts(page, widgets)) and seen_s < 30
    _run_cell(page, 1)


def _offline_env(base: dict, folder: Path) -> dict:
    """pip's index and npm's registry on a closed port, npm and node stubs that fail: `make room` must
    need neither (issue 40, point 3)."""
    stubs = folder / "offline-bin"
    stubs.mkdir()
    for tool in ("npm", "node", "npx"):
        (stubs / tool).write_text(f"#!/bin/sh\necho '{tool}: not here (a room without npm)' >&2\nexit 97\n")
        (stubs / tool).chmod(0o755)
    closed = f"http://127.0.0.1:{_free_port()}"
    return {**base, "PATH": f"{stubs}:{base.get('PATH', '/usr/bin:/bin')}", "PIP_INDEX_URL": f"{closed}/simple",
            "PIP_NO_INDEX": "1", "npm_config_registry": closed, "npm_config_offline": "true"}


@pytest.fixture(scope="module")
def room(tmp_path_factory, browser):
    if os.geteuid() != 0:
        pytest.skip("the room makes system accounts and cgroups: run as root")
    # Not under pytest's own temporary folder: another pytest session as root chmods /tmp/pytest-of-root to
    # 0700, which masks the ACL entry that lets the learners pass (seen here: a spawn failed half way).
    folder = Path(tempfile.mkdtemp(prefix="workbench-room-test-", dir="/var/tmp"))
    state = folder / "state"
    prefix = "wbt" + secrets.token_hex(2)  # never a real account's name
    port = _free_port()
    env = _offline_env({**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
                        "WORKBENCH_ROOM_STATE": str(state)}, folder)
    args = (f"--ip 127.0.0.1 --port {port} --prefix {prefix} --teacher {prefix}t --memory {MEMORY} --cores 1 "
            f"--preset cpu-quick --https --cull-idle {CULL_IDLE_S}")
    started = time.monotonic()
    hubs_own: list[psutil.Process] = []
    try:
        proc = _make("room", "SEATS=3", f"ROOM_ARGS={args}", env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "not here (a room without npm)" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
        roster = dict(line.split() for line in (state / "roster.txt").read_text().splitlines()
                      if not line.startswith("#"))
        info = json.loads((state / "room.json").read_text())
        hub = psutil.Process(int((state / "jupyterhub.pid").read_text()))
        hubs_own = hub.children(recursive=True)  # its proxy and services, as the room starts them
        yield {"url": f"https://127.0.0.1:{port}", "roster": roster, "state": state, "info": info, "env": env,
               "teacher": f"{prefix}t", "start_s": time.monotonic() - started, "output": proc.stdout}
    finally:
        if (state / "jupyterhub.log").exists():  # kept for a failure's reading; the state goes with the reset
            SHOTS.mkdir(parents=True, exist_ok=True)
            (SHOTS / "jupyterhub.log").write_bytes((state / "jupyterhub.log").read_bytes())
            ps = subprocess.run(["ps", "-o", "pid,user,stat,wchan:32,rss,etime,args", "-u",
                                 ",".join(room_users(prefix) or ["root"])], capture_output=True, text=True)
            (SHOTS / "ps.txt").write_text(ps.stdout + ps.stderr)
        stopped = _make("room-stop", env=env)
        assert stopped.returncode == 0 and "room stopped" in stopped.stdout, stopped.stdout + stopped.stderr
        # the hub's proxy and idle culler outlived it once (CI: still running minutes after the test)
        outlived = [_described(p) for p in hubs_own if _alive(p)]
        assert not outlived, f"room-stop left the hub's own processes running: {outlived}"
        done = _make("room-reset", env=env)
        left = room_users(prefix)
        shutil.rmtree(folder, ignore_errors=True)
        assert done.returncode == 0 and not left, done.stdout + done.stderr + f" accounts left: {left}"


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _described(process: psutil.Process) -> str:
    try:
        return f"{process.pid}: {' '.join(process.cmdline()[:3])}"
    except psutil.Error:
        return str(process.pid)


def room_users(prefix: str) -> list[str]:
    return [name for name in (*(f"{prefix}{i:02d}" for i in (1, 2, 3)), f"{prefix}t") if _exists(name)]


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _login(page, url: str, name: str, password: str) -> None:
    page.goto(f"{url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", password)
    page.click("#login_submit")


def _open(page, url: str, name: str, notebook: str) -> None:
    page.wait_for_url(f"**/user/{name}/lab**", timeout=180_000)  # the spawn, then JupyterLab
    page.goto(f"{url}/user/{name}/lab/tree/{notebook}?reset")
    page.wait_for_selector(CELLS, timeout=90_000)
    page.wait_for_function(IDLE_JS, timeout=120_000)  # the notebook's kernel, ready


def _prompts(page) -> list[str]:
    return page.eval_on_selector_all(f"{CELLS} .jp-InputArea-prompt", "els => els.map(e => e.innerText.trim())")


def _done(page) -> bool:
    prompts = _prompts(page)
    running = any(p in ("[*]:", "[*]") for p in prompts)
    return not running and (page.query_selector(ERRORS) is not None or all(p not in ("[ ]:", "[ ]", "") for p in prompts))


def _texts(page, selector: str) -> list[str]:
    return page.eval_on_selector_all(selector, "els => els.map(e => e.innerText.slice(0, 1500))")


# Each test learner's own JupyterLab settings (what a learner could set in Settings): every cell in the
# page (JupyterLab 4 leaves cells out of view out of the DOM: their prompts could not be read), no news pop-up.
LAB_SETTINGS = {"notebook-extension/tracker": {"windowingMode": "none"},
                "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False}}


def _lab_settings(name: str) -> None:
    account = pwd.getpwnam(name)
    for plugin, values in LAB_SETTINGS.items():
        path = Path(account.pw_dir) / ".jupyter/lab/user-settings/@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    for folder, _, files in os.walk(Path(account.pw_dir) / ".jupyter"):
        for path in [folder, *(os.path.join(folder, f) for f in files)]:
            os.chown(path, account.pw_uid, account.pw_gid)


@pytest.fixture(scope="module")
def learners(room, browser):
    """Three learners and the teacher logged in at once, each in a browser context of their own (the
    room's certificate is self-signed: test_the_room_speaks_https checks it against the room's own file)."""
    for name in [*room["roster"]]:
        _lab_settings(name)
    names = sorted(n for n in room["roster"] if n != room["teacher"])
    contexts = [browser.new_context(viewport={"width": 1280, "height": 1000}, ignore_https_errors=True)
                for _ in range(4)]
    pages = [context.new_page() for context in contexts]
    for page, name in zip(pages, [room["teacher"], *names]):  # four logins, then four spawns under way together
        _login(page, room["url"], name, room["roster"][name])
    room["teacher_page"], room["contexts"] = pages[0], dict(zip(names, contexts[1:]))
    yield list(zip(names, pages[1:]))
    for context in contexts:
        try:
            context.close()
        except Exception:  # noqa: BLE001 - one closed by a test already (the learner who left)
            pass


def _set_cell(page, startswith: str, text: str) -> None:
    """Replace the source of the code cell whose source starts with `startswith` (a learner typing)."""
    index = page.eval_on_selector_all(f"{CELLS} .jp-InputArea-editor",
                                      f"els => els.findIndex(e => e.innerText.trim().startsWith({json.dumps(startswith)}))")
    assert index >= 0, f"no cell starts with {startswith!r}"
    page.locator(f"{CELLS} .jp-InputArea-editor").nth(index).click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(text)  # as pasted: no brackets closed for us


def _teacher_view(page) -> str:
    return " ".join(_texts(page, ".jp-NotebookPanel:not(.lm-mod-hidden) .jupyter-widgets"))


def test_three_learners_run_all_of_00_and_the_teacher_watches_them_share(room, learners):
    teacher = room["teacher_page"]
    started = time.monotonic()
    _open(teacher, room["url"], room["teacher"], "room.ipynb")
    _run_all(teacher)  # the live room (no learner played): the view starts empty and refreshes itself
    for name, page in learners:
        _open(page, room["url"], name, "00_tour.ipynb")
    opened = time.monotonic() - started
    # one learner answers (a): right, as 00's solution reasons it, so Run All goes on (a wrong answer stops it)
    _set_cell(learners[0][1], "answer_a = None", "answer_a = (baseline.memory.model_state_bytes + 4 * baseline.memory"
              ".activation_bytes) / (baseline.memory.model_state_bytes + baseline.memory.activation_bytes)\nanswer_b = None")
    for _, page in learners:
        _run_all(page)
    run_started = time.monotonic()
    finished: dict[str, float] = {}
    while len(finished) < len(learners) and time.monotonic() - run_started < 400:
        time.sleep(1)
        for name, page in learners:
            if name not in finished and _done(page):
                finished[name] = round(time.monotonic() - run_started, 1)
    # the teacher's view, refreshed by itself every 5 s: all three learners within a refresh or two
    seen_at = None
    while time.monotonic() - run_started < 460:
        view = _teacher_view(teacher)
        if "from 3 learners" in view and "live" in view:
            seen_at = round(time.monotonic() - run_started, 1)
            break
        time.sleep(1)
    SHOTS.mkdir(parents=True, exist_ok=True)
    teacher.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jupyter-widgets").first.scroll_into_view_if_needed()
    teacher.screenshot(path=str(SHOTS / "teacher_room.png"))
    report = {"hub start (make room) s": round(room["start_s"], 1), "four logins and notebooks open s": round(opened, 1),
              "Run All of 00 s, by learner": finished, "teacher's view shows all three s": seen_at,
              "limits": room["info"]["limit_mode"]}
    (SHOTS / "times.json").write_text(json.dumps(report, indent=1))
    print("room:", report)
    for name, page in learners:
        page.screenshot(path=str(SHOTS / f"{name}_00.png"))
        assert name in finished, f"{name}: Run All of 00 did not end within 400 s; prompts {_prompts(page)}"
        errors = _texts(page, ERRORS) + [t for t in _texts(page, STDERR) if "Traceback" in t or "Error" in t]
        assert not errors, f"{name}: {errors}"
        assert page.url.startswith(f"{room['url']}/user/{name}/"), page.url  # their own server
        prompts = _prompts(page)
        assert prompts and all(p.startswith("[") and p[1:-2].isdigit() for p in prompts), prompts
        shared = [t for t in _texts(page, f"{CELLS} .jp-OutputArea-output") if t.startswith("room: ")]
        expected = "2 runs and 1 prediction" if name == learners[0][0] else "2 runs"
        assert shared and shared[-1].startswith(f"room: shared {expected} (") and f" as {name} " in shared[-1], shared
    view = _teacher_view(teacher)
    assert seen_at is not None, f"the teacher's view never showed the three learners: {view[:1500]}"
    assert "batch_size=" in view and "answer_a" in view, view[:1500]  # an effect per learner, and the prediction
    records = [json.loads(line) for path in (room["state"] / "records").glob("*.jsonl") for line in path.read_text().splitlines()]
    assert sorted({r["owner"] for r in records}) == sorted(n for n, _ in learners)  # each filed under its account
    # a saves their work, as a learner does before moving on (JupyterLab's autosave comes every 120 s: a
    # Run All shorter than that left a's answer unsaved, and the update test below found the old file)
    learners[0][1].keyboard.press("Control+s")


def test_a_learner_cannot_read_or_change_another_learners_files(room, learners):
    (a, page_a), (b, _) = learners[0], learners[1]
    theirs = Path(pwd.getpwnam(b).pw_dir)
    assert oct(theirs.stat().st_mode & 0o777) == "0o700"
    assert (theirs / "workbench/00_tour.ipynb").exists()  # their copy, made at their first login
    for attempt in (f"cat {theirs}/workbench/00_tour.ipynb", f"ls {theirs}", f"touch {theirs}/workbench/x.ipynb",
                    f"rm {theirs}/workbench/00_tour.ipynb"):
        proc = subprocess.run(["su", "-s", "/bin/sh", a, "-c", attempt], capture_output=True, text=True)
        assert proc.returncode != 0 and "Permission denied" in proc.stderr, (attempt, proc.stdout, proc.stderr)
    # nor through the hub: A's login does not open B's server
    answer = page_a.request.get(f"{room['url']}/user/{b}/api/contents/00_tour.ipynb", max_redirects=5)
    assert answer.status in (403, 404), (answer.status, answer.text()[:300])
    own = page_a.request.get(f"{room['url']}/user/{a}/api/contents/00_tour.ipynb?content=0")
    assert own.status == 200, own.status
    # nor the store: b's key reads b's records only, and cannot delete a's
    keys = {who["name"]: key for key, who in json.loads((room["state"] / "room-keys.json").read_text()).items()}
    store = f"http://127.0.0.1:{room['info']['store_port']}/services/room/records"
    mine = _store(store, keys[b])
    assert mine and {r["owner"] for r in mine} == {b}
    theirs = [r for r in _store(store, keys[room["teacher"]]) if r["owner"] == a]
    assert _store(store, keys[b], method="DELETE", path=f"/{theirs[0]['id']}") == 403
    # b is done for the day: their page closes, and the idle culler will stop their server (the last test)
    room["contexts"][b].close()
    room["b_left_at"] = time.monotonic()


def _store(url: str, key: str, method: str = "GET", path: str = ""):
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url + path, method=method, headers={"Authorization": f"token {key}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())["records"]
    except urllib.error.HTTPError as e:
        return e.code


def _notebook(path: Path, owner: str, *cells: str) -> None:
    notebook = {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {},
                           "outputs": [], "source": source} for i, source in enumerate(cells)],
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                            "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(notebook))
    account = pwd.getpwnam(owner)
    os.chown(path, account.pw_uid, account.pw_gid)


def _run_cell(page, index: int, timeout_s: float = 120) -> None:
    page.locator(f"{CELLS} .jp-InputArea-editor").nth(index).click()
    page.keyboard.press("Control+Enter")
    _wait_ran(page, index, timeout_s)


def _wait_ran(page, index: int, timeout_s: float = 120) -> None:
    """Until cell `index` has run (its prompt a number; JupyterLab 4 shows a raised error as stderr)."""
    deadline = time.monotonic() + timeout_s
    time.sleep(0.5)
    while _prompts(page)[index] in ("[*]:", "[*]", "[ ]:", "[ ]", ""):
        if time.monotonic() > deadline:
            page.screenshot(path=str(SHOTS / f"cell_{index}_stuck.png"))
            pytest.fail(f"cell {index} still running after {timeout_s} s: test-artifacts/room/cell_{index}_stuck.png")
        time.sleep(0.3)


def _cell_output(page, index: int) -> str:
    return page.eval_on_selector_all(f"{CELLS} .jp-Cell-outputArea", "els => els.map(e => e.innerText)")[index]


def _idle_within(page, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not page.evaluate(IDLE_JS):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _run_all(page) -> None:
    page.click("text=Run", timeout=10_000)  # the menu bar's Run menu
    page.click("text=Run All Cells", timeout=10_000)


def test_over_the_memory_limit_only_that_learner_is_told_and_stopped(room, learners):
    (a, page_a), (b, page_b) = learners[0], learners[2]
    home_a, home_b = (Path(pwd.getpwnam(n).pw_dir) / "workbench" for n in (a, b))
    _notebook(home_a / "refused.ipynb", a,
              "import workbench as wb\n"
              "wb.run(wb.RunConfig(model='mlp', preset='cpu-quick', dims={'hidden': [16384, 16384]}))")
    _notebook(home_a / "over.ipynb", a,
              "import torch\nx = torch.ones(512 * 2**20)  # 2 GiB, past the limit, no workbench to refuse it",
              "print('after the restart')")
    _notebook(home_b / "alive.ipynb", b, "kept = 'B keeps this'", "print(kept, sum(range(10)))")
    _open(page_b, room["url"], b, "alive.ipynb")
    _run_cell(page_b, 0)

    _open(page_a, room["url"], a, "refused.ipynb")
    _run_all(page_a)  # refused before it allocates, in one line
    _wait_ran(page_a, 0)
    refused = _cell_output(page_a, 0)
    page_a.screenshot(path=str(SHOTS / "memory_refused.png"))
    # workbench's one line (under IPython's traceback), the free memory read from the learner's cgroup:
    # under their limit, not the machine's many GiB
    line = next((x for x in refused.splitlines() if x.startswith("DoesNotFit: this run needs at least")), None)
    assert line and "; use smaller dims" in line, refused
    free = re.search(r"this machine has ([\d.]+) (MiB|GiB) free", line)
    limit_gib = int(room["info"]["memory_bytes"]) / 2**30
    assert free and float(free[1]) / (1024 if free[2] == "MiB" else 1) < limit_gib, line

    _open(page_a, room["url"], a, "over.ipynb")
    _run_all(page_a)  # the kernel dies: JupyterLab says it restarts
    page_a.wait_for_selector("text=appears to have died", timeout=120_000)
    page_a.screenshot(path=str(SHOTS / "memory_killed.png"))
    page_a.click(".jp-Dialog button:has-text('Ok')")
    # Seen here: the restarted kernel runs, but the page can stay at "Starting" (its connection to the
    # kernel opened before the kernel was up). A learner reloads the page then; so does this test, once,
    # and says so in times.json.
    reloaded = not _idle_within(page_a, 45)
    if reloaded:
        page_a.screenshot(path=str(SHOTS / "memory_not_idle.png"))
        page_a.reload()
        page_a.wait_for_selector(CELLS, timeout=90_000)
        assert _idle_within(page_a, 90), "the restarted kernel was not idle after a reload either"
    times = json.loads((SHOTS / "times.json").read_text()) if (SHOTS / "times.json").exists() else {}
    (SHOTS / "times.json").write_text(json.dumps({**times, "page reload needed after the OOM restart": reloaded}))
    _run_cell(page_a, 1)
    told = _cell_output(page_a, 1)
    page_a.screenshot(path=str(SHOTS / "memory_told.png"))
    assert "after the restart" in told and "went over your memory limit" in told, told
    assert f"({limit_gib:.1f} GiB)" in told, told

    _run_cell(page_b, 1)  # the other learner's kernel: untouched, its variable still there
    assert "B keeps this 45" in _cell_output(page_b, 1), _cell_output(page_b, 1)


def _hub(room, method: str, path: str):
    """The hub's REST API with the room's admin token (what scripts/room_hub.py status and restart use)."""
    import ssl
    import urllib.request

    token = (room["state"] / "admin-token").read_text().strip()
    context = ssl.create_default_context(cafile=str(room["state"] / "tls/room.crt"))
    request = urllib.request.Request(f"{room['url']}/hub/api{path}", method=method,
                                     headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=30, context=context) as answer:
        body = answer.read()
    return json.loads(body) if body else None


def test_the_room_speaks_https_with_the_teachers_certificate(room):
    import ssl
    import urllib.error
    import urllib.request

    cert = room["state"] / "tls/room.crt"
    context = ssl.create_default_context(cafile=str(cert))  # the teacher's certificate verifies: host and chain
    with urllib.request.urlopen(f"{room['url']}/hub/health", timeout=30, context=context) as answer:
        assert answer.status == 200
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # not the system's trust store
        urllib.request.urlopen(f"{room['url']}/hub/health", timeout=30, context=ssl.create_default_context())
    with pytest.raises(OSError):  # plain HTTP on the same port is not served
        urllib.request.urlopen(room["url"].replace("https", "http") + "/hub/health", timeout=30)


def test_the_teacher_restarts_a_learners_server_from_the_admin_page(room, learners):
    teacher = room["teacher_page"]
    name = learners[2][0]
    before = _hub(room, "GET", f"/users/{name}")["servers"][""]["started"]
    teacher.goto(f"{room['url']}/hub/admin")
    row = teacher.locator("tr", has_text=name).first
    row.wait_for(timeout=60_000)
    teacher.screenshot(path=str(SHOTS / "admin.png"))
    row.get_by_role("button", name=re.compile("stop server", re.I)).click()
    deadline = time.monotonic() + 120
    while _hub(room, "GET", f"/users/{name}")["servers"].get(""):
        assert time.monotonic() < deadline, f"{name}'s server did not stop within 120 s"
        time.sleep(1)
    # Under load the stop answers 'pending' and the page may not redraw the row when it ends (seen here once
    # in three runs): reloaded, as a teacher would, the row offers Start Server.
    teacher.reload()
    row = teacher.locator("tr", has_text=name).first
    row.get_by_role("button", name=re.compile("start server", re.I)).click(timeout=90_000)
    deadline = time.monotonic() + 180
    while not (_hub(room, "GET", f"/users/{name}")["servers"].get("") or {}).get("ready"):
        assert time.monotonic() < deadline, f"{name}'s server did not start again within 180 s"
        time.sleep(1)
    teacher.screenshot(path=str(SHOTS / "admin_restarted.png"))
    assert _hub(room, "GET", f"/users/{name}")["servers"][""]["started"] != before
    page = learners[2][1]  # the learner's page finds their server again, their files as they were
    _open(page, room["url"], name, "00_tour.ipynb")
    assert (Path(pwd.getpwnam(name).pw_dir) / "workbench/alive.ipynb").exists()


def test_a_fixed_notebook_reaches_every_learner_without_touching_their_work(room, learners, tmp_path):
    (a, page_a), (c, _) = learners[0], learners[2]
    home_a, home_c = (Path(pwd.getpwnam(n).pw_dir) / "workbench" for n in (a, c))
    _open(page_a, room["url"], a, "00_tour.ipynb")
    page_a.keyboard.press("Control+s")  # a's 00, with their prediction and outputs, saved: their work
    deadline = time.monotonic() + 30
    while "answer_a = (baseline" not in (home_a / "00_tour.ipynb").read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    theirs = (home_a / "00_tour.ipynb").read_bytes()
    assert b"answer_a = (baseline" in theirs
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    for name in ("00_tour.ipynb", "03_activation_checkpointing.ipynb"):
        notebook = json.loads((room["state"] / "copies" / name).read_text())
        notebook["cells"].insert(0, {"cell_type": "markdown", "id": "fix", "metadata": {}, "source": "FIXED BY THE TEACHER"})
        (fixed / name).write_text(json.dumps(notebook))
    untouched_c = (home_c / "03_activation_checkpointing.ipynb").read_bytes()
    done = subprocess.run([sys.executable, "scripts/room_hub.py", "update", "--from", str(fixed)], cwd=REPO,
                          env=room["env"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no learner's work was changed" in done.stdout, done.stdout
    assert (home_a / "00_tour.ipynb").read_bytes() == theirs  # a's work: untouched
    beside = sorted(home_a.glob("00_tour (update *).ipynb"))
    assert len(beside) == 1 and "FIXED BY THE TEACHER" in beside[0].read_text()
    assert beside[0].stat().st_uid == pwd.getpwnam(a).pw_uid  # theirs to open and change
    now_c = (home_c / "03_activation_checkpointing.ipynb").read_text()
    assert "FIXED BY THE TEACHER" in now_c and now_c.encode() != untouched_c  # c never opened 03: replaced
    listed = page_a.request.get(f"{room['url']}/user/{a}/api/contents/")  # what a's JupyterLab lists
    assert beside[0].name in [f["name"] for f in listed.json()["content"]]


def test_an_idle_learners_server_is_stopped_by_the_hubs_idle_culler(room, learners):
    b = learners[1][0]
    assert {"idle-culler", "room"} <= set(_hub(room, "GET", "/services")), "the hub runs the culler and the store"
    deadline = room["b_left_at"] + CULL_IDLE_S + 3 * room["info"]["cull_every_s"] + 60
    while _hub(room, "GET", f"/users/{b}")["servers"].get(""):
        assert time.monotonic() < deadline, (f"{b}'s server, idle since their page closed, still runs "
                                             f"{time.monotonic() - room['b_left_at']:.0f} s later")
        time.sleep(2)
    culled_after = round(time.monotonic() - room["b_left_at"], 1)
    for name, _ in (learners[0], learners[2]):  # the learners still working keep their servers
        assert _hub(room, "GET", f"/users/{name}")["servers"].get(""), name
    times = json.loads((SHOTS / "times.json").read_text()) if (SHOTS / "times.json").exists() else {}
    (SHOTS / "times.json").write_text(json.dumps({**times, "idle server culled after its page closed, s": culled_after}))

