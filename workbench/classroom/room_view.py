"""The teacher's view of the room: who shared what by hardware class, each technique's measured effect
grouped by hardware class, with the machines that disagree with the room named and why; and the room's
predictions.

Records are what `classroom.sharing.share` sends (docs/ROOM_RECORDS.md). A record the views cannot show (a
store written by hand or by an older version: room_records.check) is skipped, and `skipped_table` says
which and why: one learner's record never breaks the room's view. Learners' text (names, run labels,
config values) is shown as text: tables escape it, the figure draws it with mathtext off.

An effect is measured within one learner's machine: a baseline run (every technique at RunConfig's
default: fp32, no accumulation, no checkpointing, ...) and a run of the same learner on the same
hardware that differs from it in one field give that field's effect as a throughput ratio. Across
machines only such ratios are compared, never raw speeds.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter, defaultdict
from typing import Any

from workbench.base.report import Table
from workbench.classroom import record_format as room_records
from workbench.core.config import RunConfig

# Config fields that say how a run was logged or named, not what it trained.
_NOT_A_TECHNIQUE = {"model", "data", "seed", "log_every", "save_state_dir", "save_every", "resume_from",
                    "eval_samples", "preset", "device"}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.default is not dataclasses.MISSING}
# Fingerprint fields that explain a machine's different effect, in the words a teacher reads.
_WHY_FIELDS = {"class": "hardware", "bf16": "bf16", "fp16": "fp16", "int8_kernels": "int8 kernels",
               "threads": "threads", "device": "device"}
OUTLIER_FACTOR = 1.5
"""An effect this many times above or below the room's median for the technique is named."""
LABEL = 60
"""Learners' text is cut to this many characters in tables and the figure."""


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= LABEL else text[: LABEL - 1] + "…"


def who(record: dict[str, Any]) -> str:
    """The account the store filed the record under (the door checked it), with the name it carries."""
    owner, learner = record.get("owner"), record.get("learner")
    if owner and learner and learner != owner and not str(learner).startswith("anon-"):
        return _short(f"{owner} ({learner})")
    return _short(owner or learner or "?")


def split(records: Any) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """(the records the views can show, [(which record, why not)] for the others)."""
    good, skipped = [], []
    for i, record in enumerate(records if isinstance(records, list) else []):
        problem = room_records.check(record)
        if problem is None:
            good.append(record)
        else:
            label = f"#{i} from {who(record)}" if isinstance(record, dict) else f"#{i}"
            skipped.append((label, _short(problem) if len(problem) <= 200 else problem[:199] + "…"))
    if not isinstance(records, list):
        skipped.append(("all", f"records must be a list (room_records()'s), not {type(records).__name__}"))
    return good, skipped


def _skipped_note(skipped: list) -> str:
    return f"; {len(skipped)} record(s) skipped: lesson.skipped_table(records) says why" if skipped else ""


@dataclasses.dataclass(frozen=True)
class Effect:
    technique: str
    """'precision=bf16': the one config field that differs from the baseline run."""
    learner: str
    hardware: str
    speedup: float
    """Technique throughput over baseline throughput, on the same machine."""
    fingerprint: dict[str, Any]


def _baseline(config: dict[str, Any]) -> bool:
    """Every technique at RunConfig's default (fields whose default is None are sizes the preset
    resolves, such as batch_size and lr: not techniques)."""
    return all(config[k] == default for k, default in _DEFAULTS.items()
               if k in config and default is not None and k not in _NOT_A_TECHNIQUE)


def _technique(base: dict[str, Any], other: dict[str, Any]) -> str | None:
    """'field=value' where `other` is `base` with one technique switched on; None otherwise."""
    changed = [k for k in base.keys() | other.keys() if k not in _NOT_A_TECHNIQUE and base.get(k) != other.get(k)]
    if len(changed) != 1 or not _baseline(base):
        return None
    field, was, now = changed[0], base.get(changed[0]), other.get(changed[0])
    if _DEFAULTS.get(field) is None and isinstance(was, (int, float)) and isinstance(now, (int, float)) and now < was:
        return None  # a size (batch_size, seq_len): its effect is read growing, not also shrinking back
    return _short(f"{field}={now}")


def _speed(record: dict[str, Any]) -> float | None:
    value = record["figures"].get("samples_per_sec")
    return float(value) if record["figures"].get("status") == "ok" and room_records.finite(value) and value > 0 else None


def effects(records: list[dict[str, Any]]) -> list[Effect]:
    """Every (baseline, technique) pair each learner shared on one machine, as a measured effect."""
    return _effects(split(records)[0])


def _effects(good: list[dict[str, Any]]) -> list[Effect]:
    runs = defaultdict(list)
    for r in good:
        if r["kind"] == "run" and _speed(r):
            runs[(who(r), str(r["fingerprint"]["class"]))].append(r)
    found = []
    for (learner, hardware), mine in runs.items():
        for base in mine:
            for other in mine:
                technique = _technique(base["config"], other["config"])
                if technique:
                    found.append(Effect(technique, learner, _short(hardware), _speed(other) / _speed(base),
                                        other["fingerprint"]))
    return sorted(found, key=lambda e: (e.technique, e.hardware, e.learner))


def _why(effect: Effect, seen: dict[str, Counter]) -> str:
    """The fingerprint fields where this machine differs from every other machine that measured it
    (`seen`: per field, how many machines of the technique had each value)."""
    reasons = []
    for key, words in _WHY_FIELDS.items():
        mine = _short(effect.fingerprint.get(key))
        theirs = sorted(v for v, n in seen[key].items() if n - (v == mine) > 0)
        if mine not in theirs and (key not in ("bf16", "fp16") or key in effect.technique):
            reasons.append(f"{words} {mine} (others: {', '.join(theirs)})")
    return "; ".join(reasons) or "same hardware as others in the room: a busy machine or noise (run it again)"


def outliers(found: list[Effect]) -> list[tuple[Effect, float, str]]:
    """(effect, its ratio to the room's median for the technique, why) for each machine whose effect
    is more than OUTLIER_FACTOR away from that median; techniques three machines or more measured."""
    by_technique = defaultdict(list)
    for e in found:
        by_technique[e.technique].append(e)
    named = []
    for group in by_technique.values():
        if len(group) < 3:
            continue
        median = statistics.median(e.speedup for e in group)  # every speed-up > 0 and finite: so is this
        seen = {key: Counter(_short(e.fingerprint.get(key)) for e in group) for key in _WHY_FIELDS}
        for e in group:
            ratio = e.speedup / median
            if not 1 / OUTLIER_FACTOR <= ratio <= OUTLIER_FACTOR:
                named.append((e, ratio, _why(e, seen)))
    return named


def class_table(records: list[dict[str, Any]]) -> Table:
    """Who shared what, by hardware class: learners, runs, predictions and the latest share."""
    good, skipped = split(records)
    groups: dict[str, dict[str, Any]] = defaultdict(lambda: {"learners": set(), "runs": 0, "rows": 0, "last": ""})
    for r in good:
        g = groups[_short(r["fingerprint"]["class"])]
        g["learners"].add(who(r))
        g["runs" if r["kind"] == "run" else "rows"] += 1 if r["kind"] == "run" else len(r["rows"])
        g["last"] = max(g["last"], str(r.get("received", "")))
    rows = [[hardware, len(g["learners"]), g["runs"], g["rows"], g["last"][11:19] or "?"]
            for hardware, g in sorted(groups.items())]
    learners = len({who(r) for r in good})
    return Table(["hardware", "learners", "runs", "predictions", "latest (UTC)"], rows,
                 caption=f"The room by hardware class: {len(good)} records from {learners} learners{_skipped_note(skipped)}")


def room_table(records: list[dict[str, Any]]) -> Table:
    """Each technique's effect by hardware class: machines, median speed-up and its range."""
    good, skipped = split(records)
    groups = defaultdict(list)
    for e in _effects(good):
        groups[(e.technique, e.hardware)].append(e.speedup)
    rows = [[technique, hardware, len(s), f"{statistics.median(s):.2f}x", f"{min(s):.2f}-{max(s):.2f}x"]
            for (technique, hardware), s in sorted(groups.items())]
    learners = len({who(r) for r in good})
    return Table(["technique", "hardware", "machines", "median speed-up", "range"], rows,
                 caption=f"What the room measured: {len(good)} records from {learners} learners "
                         f"(speed-up: samples/s with the technique over the same machine's baseline){_skipped_note(skipped)}")


def outlier_table(records: list[dict[str, Any]]) -> Table:
    """The machines whose effect stands out from the room's, named by class and why."""
    rows = [[e.technique, e.learner, e.hardware, f"{e.speedup:.2f}x", f"{ratio:.2f}x the room's median", why]
            for e, ratio, why in outliers(effects(records))]
    return Table(["technique", "learner", "hardware", "speed-up", "against the room", "why"], rows,
                 caption=f"Outliers (more than {OUTLIER_FACTOR}x from the room's median)" if rows
                 else "No outliers: every machine within 1.5x of the room's median")


def _ratio(row: dict[str, Any]) -> float | None:
    p, m = row["predicted"], row["measured"]
    if not (room_records.finite(p) and room_records.finite(m)) or float(p) <= 0 or float(m) <= 0:
        return None
    r = float(p) / float(m)
    return r if math.isfinite(r) and r > 0 else None


def calibration_table(records: list[dict[str, Any]]) -> Table:
    """The room's predictions against what it measured: per exercise, how many, and the median
    predicted/measured (numbers) or the share predicted right (choices)."""
    good, skipped = split(records)
    groups = defaultdict(list)
    for r in good:
        for row in r["rows"] if r["kind"] == "predictions" else []:
            groups[(_short(row["notebook"]), _short(row["exercise"]), row["kind"], _short(row.get("unit", "")))].append(row)
    table = []
    for (notebook, exercise, kind, unit), rows in sorted(groups.items()):
        ratios = [r for r in map(_ratio, rows) if r is not None]
        if kind != "choice" and ratios:
            value = f"median predicted/measured {statistics.median(ratios):.2f}"
        else:
            value = f"{sum(r['verdict'] == 'right' for r in rows)}/{len(rows)} predicted right"
        table.append([notebook, exercise, kind + (f" ({unit})" if unit else ""), len(rows), value])
    return Table(["notebook", "exercise", "kind", "predictions", "calibration"], table,
                 caption=f"The room's predictions against its measurements{_skipped_note(skipped)}")


def skipped_table(records: list[dict[str, Any]]) -> Table:
    """The records the views skip, each with why (the field and what it must be)."""
    rows = split(records)[1]
    return Table(["record", "why it is skipped"], [list(r) for r in rows],
                 caption=f"{len(rows)} record(s) the views cannot show" if rows else "Every record can be shown")


def room_figure(records: list[dict[str, Any]]):
    """One panel per technique: each machine's speed-up by hardware class (log scale, 1x marked).
    Labels are learners' text: drawn as text (mathtext off), never parsed."""
    # matplotlib only when a figure is drawn: importing this module stays light
    import matplotlib.pyplot as plt

    found = effects(records)
    techniques = sorted({e.technique for e in found})
    fig, axes = plt.subplots(1, max(len(techniques), 1), figsize=(4.5 * max(len(techniques), 1), 3.2), squeeze=False)
    for ax, technique in zip(axes[0], techniques):
        mine = [e for e in found if e.technique == technique]
        classes = sorted({e.hardware for e in mine})
        ax.scatter([classes.index(e.hardware) for e in mine], [e.speedup for e in mine])
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(classes)), classes, rotation=20, ha="right", fontsize=8, parse_math=False)
        ax.set_title(technique, parse_math=False)
        ax.set_ylabel("speed-up over the same machine's baseline")
    if not techniques:
        axes[0][0].set_title("no technique measured against a baseline yet")
    plt.close(fig)
    return fig
