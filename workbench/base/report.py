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

import base64
import html
import io
import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.base.arguments import as_float, listed, shown
from workbench.base.errors import ArgumentError


def format_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB'; None -> 'n/a'; nan and inf as they are."""
    if n is None:
        return "n/a"
    if isinstance(n, bool) or not isinstance(n, numbers.Real):
        raise ArgumentError(f"n must be a number of bytes or None, got {type(n).__name__} {shown(n)}; pass e.g. 1536")
    if not math.isfinite(as_float(n)):
        return str(as_float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def counted_rows(counts: Any) -> list[tuple[str, str]]:
    """The four exact counts of a step, labelled (a MemoryBreakdown or an Estimate)."""
    return [
        ("parameters", format_bytes(counts.parameter_bytes)),
        ("gradients", format_bytes(counts.gradient_bytes)),
        ("optimizer state", format_bytes(counts.optimizer_state_bytes)),
        ("saved activations (one micro-batch)", format_bytes(counts.activation_bytes)),
    ]


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


class UnknownName(KeyError):
    """A name a report does not hold (a KeyError, as a lookup's miss), shown as its one line."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _names(names: Iterable[Any]) -> str:
    """Names as a message lists them, each by its start: [a, b, ...]."""
    names = list(names)
    return "[" + ", ".join(map(shown, names[:10])) + (f", ... ({len(names)} in all)" if len(names) > 10 else "") + "]"


def plain_label(name: Any, *, most: int = 40) -> str:
    """A name as a figure's legend, tick or title shows it: one line of at most `most` characters
    (a 10,000-character run name made a tick label the size of a gigapixel image: out of memory),
    each '$' escaped so matplotlib draws it instead of parsing math (a 'a$^$b' run name raised
    mathtext's ParseSyntaxException at the figure)."""
    text = " ".join(str(name).split())
    text = text if len(text) <= most else text[: most - 1] + "\u2026"
    return text.replace("$", r"\$")


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

    def __repr__(self) -> str:
        return str(self)


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


def figure_html(figure: Any, *, tight: bool = True) -> str:
    """A matplotlib figure as an inline <img>: a saved notebook shows it on the web."""
    buf = io.BytesIO()
    figure.savefig(buf, format="png", dpi=90, bbox_inches="tight" if tight else None)
    return f"<img src='data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}'/>"


class Results(Report):
    """Named results measured together, the first the baseline: what compare(), the
    quantization comparison and the checkpointing dial have in common.

    Subclasses name their items (`kind`, e.g. "run"), give `rows()`/`header`, and may
    override `value()` (how a metric is read off an item) and `make_figure()`.
    """

    kind = "result"
    """What one item is called in messages ("run", "variant", "dial setting")."""
    name_hint = "pass name="
    empty_message = ""
    """What to say when there is nothing to compare (default: 'need at least one <kind>')."""

    item_type: type | None = None
    """The class every item must be (None: anything with a `name`)."""
    argument, example = "items", "[baseline, other, ...]"
    """The parameter that takes the items, and a call that passes them (for messages)."""

    def __init__(self, items: Sequence[Any]) -> None:
        empty = f"{self.empty_message or f'need at least one {self.kind}'}; pass {self.example}"
        items = [] if items is None else listed(self.argument, items, self.example)
        if not items:
            raise ArgumentError(empty)
        for i, item in enumerate(items):
            if not isinstance(item, self.item_type or object) or not hasattr(item, "name"):
                raise ArgumentError(f"{self.argument}[{i}] is a {type(item).__name__}, not a "
                                    f"{(self.item_type or object).__name__} with a name; pass {self.example}")
        names = [item.name for item in items]
        if len(set(map(repr, names))) != len(names):
            raise ArgumentError(f"{self.kind} names must differ to compare them, got {_names(names)}; {self.name_hint}")
        self.items = items
        self._figure: Any = None

    def item(self, name: str) -> Any:
        for item in self.items:
            if item.name == name:
                return item
        raise UnknownName(f"no {self.kind} named {shown(name)}; {self.kind}s: {_names(i.name for i in self.items)}")

    def value(self, item: Any, metric: str) -> Any:
        return getattr(item, metric)

    def ratio(self, metric: str, name: str, *, to: str | None = None) -> float:
        """metric(name) / metric(to, default the first item)."""
        base = self.item(to) if to else self.items[0]
        num, den = self.value(self.item(name), metric), self.value(base, metric)
        if num is None or not den:
            raise ValueError(f"{metric} was not measured for {name!r} and {base.name!r}")
        return num / den

    def make_figure(self) -> Any:
        return None

    @property
    def figure(self) -> Any:
        if self._figure is None:
            self._figure = self.make_figure()
        return self._figure

    def extra_html(self) -> str:
        figure = self.figure
        return figure_html(figure) if figure is not None else ""

    def __repr__(self) -> str:
        return str(self)
