"""Run in each learner's kernel as it starts (the room's kernel spec: --IPKernelApp.exec_files).

When the learner's previous kernel was stopped by the room's memory limit (the cgroup's OOM-kill
count rose since they were last told), the first cell they run next says so, in that cell's output:
JupyterLab's own dialog only says "the kernel appears to have died".
"""


def _workbench_room_notice() -> None:
    import os
    import sys
    from pathlib import Path

    from room.limits import oom_kills

    kills = oom_kills()
    seen_file = Path.home() / ".workbench-room" / "oom_kills_seen"
    try:
        seen = int(seen_file.read_text())
    except (OSError, ValueError):
        seen = 0
    if kills is None or kills <= seen:
        return
    limit = int(os.environ.get("MEM_LIMIT", "0"))
    shown = f"{limit / 2**30:.1f} GiB" if limit else "the room's limit"

    def notice(*_: object) -> None:
        print(f"room: your previous kernel was stopped: your notebooks together went over your memory "
              f"limit ({shown}). Its variables are gone: run the cells above again, ask for less "
              f"(a smaller batch_size, model or seq_len), or shut down other notebooks' kernels.",
              file=sys.stderr)
        shell.events.unregister("pre_run_cell", notice)
        try:
            seen_file.parent.mkdir(parents=True, exist_ok=True)
            seen_file.write_text(str(kills))
        except OSError:
            pass  # told once more next time: better than a cell that fails

    shell = get_ipython()  # noqa: F821 (IPython's, in the namespace this file runs in)
    shell.events.register("pre_run_cell", notice)


_workbench_room_notice()
del _workbench_room_notice
