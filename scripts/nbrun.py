"""Run a notebook top to bottom in this process, without a Jupyter kernel, and save its outputs.

IPython's InteractiveShell executes each code cell as a notebook kernel would (the last
expression is displayed, `display()` works, magics work); stdout, stderr, rich displays and
the error of a failing cell become the cell's outputs in nbformat 4 JSON, written after
every cell so that a notebook stopped by a timeout keeps what it ran. Like Run All, the first
error stops the notebook. Needs only IPython (and what the notebook itself imports): no
ipykernel, jupyter_client, nbclient or nbformat, so it runs where those are not installed.

    python scripts/nbrun.py notebooks/00_tour.ipynb /tmp/00_tour.ipynb

`execute()` returns the shell's namespace too, for callers that read results out of it
(scripts/gpu_check.py does).
"""

from __future__ import annotations

import base64
import io
import json
import os
import pathlib
import sys
import time
import traceback
from typing import Any, Callable


class _Tee(io.TextIOBase):
    """Collects a stream's text for the cell's outputs and echoes it to the real stream (the log)."""

    def __init__(self, echo: Any) -> None:
        self.parts: list[str] = []
        self.echo = echo

    def write(self, text: str) -> int:
        self.parts.append(text)
        self.echo.write(text)
        return len(text)

    def flush(self) -> None:
        self.echo.flush()

    def text(self) -> str:
        return "".join(self.parts)


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    """A display's mime bundle as nbformat stores it: binary images base64, text as lines."""
    out = {}
    for mime, value in data.items():
        if isinstance(value, bytes):
            value = base64.b64encode(value).decode()
        elif not isinstance(value, str):
            value = json.dumps(value) if mime.endswith("json") else str(value)
        out[mime] = value
    return out


def _shell(outputs: list[dict[str, Any]]) -> Any:
    """An InteractiveShell whose displays and last-expression results land in `outputs`."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
            outputs.append({"output_type": "display_data", "data": _jsonable(data), "metadata": metadata or {}})

        def clear_output(self, wait=False):
            outputs.clear()

    class Hook(DisplayHook):
        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            outputs.append({"output_type": "execute_result", "execution_count": self.shell.execution_count,
                            "data": _jsonable(format_dict), "metadata": md_dict or {}})

    shell = InteractiveShell.instance()
    try:
        shell.colors = "nocolor"  # plain tracebacks in the log and the saved outputs
    except Exception:  # older IPython spells it NoColor
        shell.colors = "NoColor"
    shell.display_pub = Publisher(shell=shell)
    shell.displayhook = Hook(shell=shell, cache_size=shell.cache_size)
    shell.display_trap.hook = shell.displayhook
    return shell


def _write_whole(target: pathlib.Path, text: str) -> None:
    """`text` into `target` through a temporary file renamed over it: a process killed while it
    writes (the GPU check's timeout) leaves the last cell's whole notebook, not a cut-short one.
    (workbench.base.atomic_write.write_whole's twin: this runner imports nothing but IPython.)"""
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def execute(source: pathlib.Path, target: pathlib.Path, *,
            on_cell: Callable[[int, float], None] | None = None) -> tuple[str, str | None, dict[str, Any]]:
    """Run every code cell of `source` in order, writing the executed notebook to `target`
    after each cell. Returns (status 'ok' or 'error', the error's last line, the namespace)."""
    nb = json.loads(source.read_text())
    outputs: list[dict[str, Any]] = []
    shell = _shell(outputs)
    status, error = "ok", None
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        code = "".join(cell["source"])
        outputs.clear()
        out, err = _Tee(sys.__stdout__), _Tee(sys.__stderr__)
        print(f"\n----- [{index}] {code.splitlines()[0][:90] if code else ''}", file=sys.__stdout__, flush=True)
        began = time.perf_counter()
        real = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        try:
            result = shell.run_cell(code, store_history=True)
        finally:
            sys.stdout, sys.stderr = real
        seconds = time.perf_counter() - began
        streams = [{"output_type": "stream", "name": name, "text": tee.text()}
                   for name, tee in (("stdout", out), ("stderr", err)) if tee.text()]
        cell["outputs"] = streams + list(outputs)
        cell["execution_count"] = shell.execution_count - 1
        cell.setdefault("metadata", {})["wall_s"] = round(seconds, 2)
        failure = result.error_in_exec or result.error_before_exec
        if failure is not None:
            lines = traceback.format_exception(type(failure), failure, failure.__traceback__)
            cell["outputs"].append({"output_type": "error", "ename": type(failure).__name__,
                                    "evalue": str(failure), "traceback": lines})
            status, error = "error", f"cell {index}: {type(failure).__name__}: {str(failure).strip()[:400]}"
        _write_whole(target, json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        if on_cell is not None:
            on_cell(index, seconds)
        if failure is not None:
            break
    return status, error, shell.user_ns


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python scripts/nbrun.py NOTEBOOK.ipynb EXECUTED.ipynb", file=sys.stderr)
        return 2
    try:
        status, error, _ = execute(pathlib.Path(args[0]), pathlib.Path(args[1]))
    except OSError as failure:  # the executed copy could not be written (a full disk)
        print(f"error: {args[1]} could not be written ({failure.strerror or failure}); the file there, if any, "
              "is unchanged", file=sys.stderr)
        return 1
    print(f"\n{args[0]}: {status}" + (f" ({error})" if error else ""))
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
