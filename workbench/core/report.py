"""Reports: anything the workbench shows as a table, in text and in Jupyter.

A report says what its rows are, once (`header`, `rows()`, `caption()`); `Report` turns
them into the padded text table `print()` shows and the HTML table Jupyter renders, so no
class writes `__str__` and `_repr_html_` by hand. `format_bytes` and `html_table` are the
two formatting rules every layer shares; they sit here, at the bottom, so measuring code
can describe itself without importing the views.

Example:
    >>> print(text_table([("params", "1.0 KiB")], header=("part", "bytes")))
    part    bytes
    params  1.0 KiB
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def format_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB'; None -> 'n/a'."""
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def html_table(rows: Sequence[Sequence[Any]], *, header: Sequence[str] = (), caption: str = "") -> str:
    esc = lambda v: html.escape(str(v))  # noqa: E731
    parts = ["<table>"]
    if caption:
        parts.append(f"<caption style='text-align:left'><b>{esc(caption)}</b></caption>")
    if header:
        parts.append("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>")
    for row in rows:
        parts.append("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>")
    parts.append("</table>")
    return "".join(parts)


def text_table(rows: Sequence[Sequence[Any]], *, header: Sequence[str] = (), caption: str = "") -> str:
    """Rows as columns padded to their widest cell (the last column is not padded)."""
    lines = [list(map(str, r)) for r in ([header] if header else []) + list(rows)]
    if not lines:
        return caption
    widths = [max(len(line[i]) for line in lines if i < len(line)) for i in range(max(map(len, lines)))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(line[:-1], widths)) + ("  " if len(line) > 1 else "") + line[-1]
                     for line in lines)
    return f"{caption}\n{text}" if caption else text


class Report:
    """A table-shaped result: subclasses give `rows()` (and `header`, `caption()`),
    this gives `print()`'s text and Jupyter's HTML from them."""

    __slots__ = ()
    header: Sequence[str] = ()

    def rows(self) -> Sequence[Sequence[Any]]:
        raise NotImplementedError

    def caption(self) -> str:
        return ""

    def extra_html(self) -> str:
        """HTML shown under the table in Jupyter (a figure, say)."""
        return ""

    def __str__(self) -> str:
        return text_table(self.rows(), header=self.header, caption=self.caption())

    def _repr_html_(self) -> str:
        return html_table(self.rows(), header=self.header, caption=self.caption()) + self.extra_html()


@dataclass(frozen=True)
class Table:
    """Plain rows under a header, already formatted (what compare() and dials build)."""

    header: list[str]
    rows: list[list[Any]]
    caption: str = ""

    def to_html(self) -> str:
        return html_table(self.rows, header=self.header, caption=self.caption)

    _repr_html_ = to_html

    def __str__(self) -> str:
        return text_table(self.rows, header=self.header, caption=self.caption)
