"""What a run view writes: its numbers, each saying what it is, and its status line. Pure.

A StepRecord carries two kinds of rates: the last interval's (the steps since the previous
log step: what the run does now) and the run's means so far (every timed step: what the
results table will show). They differ, often by 20-30% on a small model, so they sit side
by side in two labelled columns; when the run ends the mean column holds the RunResult's
figures, written by `format_metric`, the results table's own formatter.

Example:
    >>> record = StepRecord("b", 20, 100, loss=1.5, elapsed_s=1.0, step_time_s=0.005, samples_per_sec=12800.0,
    ...                     mean_step_time_s=0.0076, mean_samples_per_sec=8451.0)
    >>> [(r.key, r.last, r.mean) for r in rate_rows(record, peak_source="")][:2]
    [('step_time_s', '5.0', '7.6'), ('samples_per_sec', '12,800', '8,451')]
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

from workbench.base.report import format_bytes
from workbench.core.measure.records import RunEnd, StepRecord
from workbench.core.measure.result import format_metric

# status -> (short word for the status line, its colour, the progress bar's style)
STATUS = {
    "running": ("running", "#1976d2", "info"),
    "ok": ("done", "#2e7d32", "success"),
    "interrupted": ("interrupted", "#ef6c00", "warning"),
    "oom": ("out of memory", "#c62828", "danger"),
    "failed": ("failed", "#c62828", "danger"),
}
MEAN_NOTE = ("run mean: every timed step so far (the first step counts FLOPs and bytes exactly and is not "
             "timed); when the run ends, these are the figures of its RunResult and the results table")


@dataclass(frozen=True, slots=True)
class RateRow:
    key: str
    """The last interval's figure's key; the run mean's is 'mean_' + key."""
    label: str
    last: str | None
    mean: str | None


def _mfu(value: float | None) -> str | None:
    return None if value is None else f"{value:.1%}"


def _tflops(value: float | None) -> str | None:
    return None if value is None else f"{value:.3g}"


def mfu_missing_reason(record: StepRecord, *, peak_source: str) -> str:
    """Why a record has no MFU: the peak's source says why there is none (e.g. an emulated dtype)."""
    if record.tflops_per_sec is None:
        return "FLOPs not counted"
    return peak_source or "no peak FLOP/s for this device and dtype"


def rate_rows(record: StepRecord, *, peak_source: str, final: dict[str, Any] | None = None) -> list[RateRow]:
    """The rates of a record: last interval and run mean. `final` (a RunEnd's summary)
    replaces the means with the RunResult's own figures once the run is over."""
    final = final or {}
    mean_step = final.get("step_time_s", record.mean_step_time_s)
    # FLOPs per step are counted once, so the mean TFLOP/s follows from the mean step time.
    mean_tflops = (record.tflops_per_sec * record.step_time_s / mean_step
                   if record.tflops_per_sec is not None and mean_step else None)
    rows = [
        RateRow("step_time_s", "ms / step", format_metric("step_time_s", record.step_time_s),
                None if mean_step is None else format_metric("step_time_s", mean_step)),
        RateRow("samples_per_sec", "samples / s", format_metric("samples_per_sec", record.samples_per_sec),
                _opt_metric("samples_per_sec", final.get("samples_per_sec", record.mean_samples_per_sec))),
    ]
    if record.tokens_per_sec is not None:
        rows.append(RateRow("tokens_per_sec", "tokens / s", format_metric("tokens_per_sec", record.tokens_per_sec),
                            _opt_metric("tokens_per_sec", final.get("tokens_per_sec", record.mean_tokens_per_sec))))
    if record.tflops_per_sec is not None:
        rows.append(RateRow("tflops_per_sec", "TFLOP/s", _tflops(record.tflops_per_sec), _tflops(mean_tflops)))
    if record.mfu is not None or record.mean_mfu is not None:
        rows.append(RateRow("mfu", "MFU", _mfu(record.mfu), _mfu(record.mean_mfu)))
    else:
        rows.append(RateRow("mfu", "MFU", f"n/a ({mfu_missing_reason(record, peak_source=peak_source)})", None))
    return rows


def _opt_metric(name: str, value: float | None) -> str | None:
    return None if value is None else format_metric(name, value)


def other_figures(record: StepRecord, *, memory_total_bytes: int | None) -> list[tuple[str, str, str]]:
    """(key, label, value) of everything else a record holds, each label saying what it is."""
    kind = record.memory_kind
    peak = None if record.memory_peak_bytes is None else format_bytes(record.memory_peak_bytes)
    if peak and memory_total_bytes:
        peak += f" of {format_bytes(memory_total_bytes)}"
    wait, step = record.data_wait_s, record.step_time_s
    rows = [
        ("loss", "training loss, last interval", None if record.loss is None else f"{record.loss:.4f}"),
        ("memory", f"{kind}, now", None if record.memory_bytes is None else format_bytes(record.memory_bytes)),
        ("memory_peak", f"{kind}, peak", peak),
        ("memory_reserved", "CUDA reserved, now",
         None if record.memory_reserved_bytes is None else format_bytes(record.memory_reserved_bytes)),
        ("activation_bytes", "saved activations, one micro-batch (exact)",
         None if record.activation_bytes is None else format_bytes(record.activation_bytes)),
        ("data_wait", "waiting for data, last interval",
         None if wait is None or step <= 0 else f"{wait / step:.0%} of a step"),
        ("lr", "learning rate", None if record.lr is None else f"{record.lr:.3g}"),
    ]
    rows += [(key, key.replace("_", " "), f"{value:.4g}") for key, value in record.extra.items()]
    return [(key, label, value) for key, label, value in rows if value is not None]


def interval_label(first: int | None, last: int) -> str:
    """'steps 2-50' for the interval a record's rates cover (None: where it began is unknown)."""
    if first is None:
        return f"to step {last}"
    return f"step {last}" if first >= last else f"steps {first}&ndash;{last}"


def numbers_html(rates: list[RateRow], figures: list[tuple[str, str, str]], *, interval: tuple[int | None, int],
                 final: bool) -> str:
    """The rates as a two-column table (last interval | run mean), the rest as labelled tiles.
    Every value is `<b class="wb-v" data-k="KEY">` (a run mean's key is 'mean_' + KEY)."""
    pad = "padding:1px 0 1px 1.6em;text-align:right"

    def value(key: str, text: str | None, colspan: int = 1) -> str:
        span = f' colspan="{colspan}"' if colspan > 1 else ""
        if text is None:
            return f'<td style="{pad};opacity:0.5">&ndash;</td>'
        if text.startswith("n/a"):  # a reason, not a figure: left-aligned, not bold
            return f'<td{span} style="{pad.replace("right", "left")};opacity:0.8" class="wb-v" data-k="{key}">' \
                   f'{html.escape(text)}</td>'
        return f'<td style="{pad}"><b class="wb-v" data-k="{key}">{html.escape(text)}</b></td>'

    mean_sub = "= results table" if final else "so far"
    head = (f'<tr style="font-size:85%;opacity:0.75;line-height:1.2"><th></th>'
            f'<th style="{pad};font-weight:normal">last interval<br>{interval_label(*interval)}</th>'
            f'<th style="{pad};font-weight:normal" title="{html.escape(MEAN_NOTE)}">'
            f'<span style="text-decoration:underline dotted">run mean</span><br>{mean_sub}</th></tr>')
    body = ""
    for row in rates:
        if row.mean is None and row.last is not None and row.last.startswith("n/a"):
            cells = value(row.key, row.last, colspan=2)
        else:
            cells = value(row.key, row.last) + value(f"mean_{row.key}", row.mean)
        body += f'<tr><td style="opacity:0.75;padding:1px 0">{html.escape(row.label)}</td>{cells}</tr>'
    table = (f'<table class="wb-rates" style="border-collapse:collapse;margin:0 2.5em 0.5em 0">'
             f'{head}{body}</table>')
    tiles = "".join(
        '<div style="min-width:9em;max-width:15em;margin:0 1.4em 0.5em 0">'
        f'<div style="font-size:85%;opacity:0.7">{html.escape(label)}</div>'
        f'<b class="wb-v" data-k="{key}">{html.escape(text)}</b></div>'
        for key, label, text in figures)
    return (f'<div style="display:flex;flex-wrap:wrap;align-items:flex-start;line-height:1.35">{table}'
            f'<div style="display:flex;flex-wrap:wrap;flex:1;min-width:18em">{tiles}</div></div>')


def summary_line(label: str, status: str, last: StepRecord | None, end: RunEnd | None, *, total_steps: int) -> str:
    """'baseline: done, step 30 / 30, 7.6 ms/step (run mean), final loss 0.4433': a run in plain text."""
    steps = end.steps_done if end else (last.step if last else 0)
    parts = [f"{label}: {STATUS.get(status, (status,))[0]}, step {steps} / {total_steps}"]
    mean = (end.summary if end else {}).get("step_time_s", last.mean_step_time_s if last else None)
    if mean is not None:
        parts.append(f"{format_metric('step_time_s', mean)} ms/step (run mean)")
    if last is not None and last.loss is not None:
        parts.append(f"{'final loss' if end else 'loss'} {last.loss:.4f}")
    return ", ".join(parts)


RUNS_HEADER = ("run", "status", "steps", "final loss", "ms / step (run mean)", "samples / s (run mean)", "peak")


def runs_table_html(rows: list[list[str]]) -> str:
    """The runs a shared view has drawn, one row each (`RUNS_HEADER`)."""
    cell = 'style="padding:1px 1.2em 1px 0;text-align:left'
    heads = "".join(f'<th {cell};font-weight:normal;opacity:0.75">{html.escape(h)}</th>' for h in RUNS_HEADER)
    body = "".join("<tr>" + "".join(f'<td {cell}">{html.escape(c)}</td>' for c in row) + "</tr>" for row in rows)
    return (f'<table class="wb-history-table" style="font-size:90%;line-height:1.3;border-collapse:collapse;'
            f'margin-bottom:0.4em"><caption style="text-align:left">runs on this view</caption>'
            f'<tr>{heads}</tr>{body}</table>')


def status_html(status: str) -> str:
    """The short status line: one coloured word."""
    word, colour, _ = STATUS.get(status, (status, "#c62828", "danger"))
    return (f'<span style="background:{colour};color:white;border-radius:3px;padding:1px 8px;'
            f'white-space:nowrap">{html.escape(word)}</span>')


def details_html(end: RunEnd, *, total_steps: int) -> str:
    """What happened, folded: a one-line summary that opens onto the whole message."""
    word = STATUS.get(end.status, (end.status,))[0]
    summary = f"{word} at step {end.steps_done} of {total_steps}"
    text = end.message or "(no message)"
    if end.status == "interrupted":
        text += "\nThe partial result (the curve so far) is workbench.last_result()."
    return (f'<details class="wb-details-box"><summary style="cursor:pointer">{html.escape(summary)}: '
            f'details</summary><pre style="white-space:pre-wrap;font-size:85%;margin:0.3em 0 0 1em">'
            f'{html.escape(text)}</pre></details>')


def duration(seconds: float) -> str:
    """3.25 -> '3.2 s'; 125 -> '2 min 05 s'; inf -> '?'."""
    if not math.isfinite(seconds):
        return "?"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"
