"""The teacher's view of the room: each technique's measured effect, grouped by hardware class,
with the machines that disagree with the room named and why; and the room's predictions.

Records are what `measure.room.share` sends. An effect is measured within one learner's machine:
a baseline run (every technique at RunConfig's default: fp32, no accumulation, no checkpointing,
...) and a run of the same learner that differs from it in one field give that field's effect as
a throughput ratio. Across machines
only such ratios are compared, never raw speeds.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter, defaultdict
from typing import Any

from workbench.core.config import RunConfig
from workbench.core.report import Table

# Config fields that say how a run was logged or named, not what it trained.
_NOT_A_TECHNIQUE = {"model", "data", "seed", "log_every", "save_state_dir", "save_every", "resume_from",
                    "eval_samples", "preset", "device"}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.default is not dataclasses.MISSING}
# Fingerprint fields that explain a machine's different effect, in the words a teacher reads.
_WHY_FIELDS = {"class": "hardware", "bf16": "bf16", "fp16": "fp16", "int8_kernels": "int8 kernels",
               "threads": "threads", "device": "device"}
OUTLIER_FACTOR = 1.5
"""An effect this many times above or below the room's median for the technique is named."""


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
    return f"{changed[0]}={other.get(changed[0])}"


def effects(records: list[dict[str, Any]]) -> list[Effect]:
    """Every (baseline, technique) pair each learner shared, as a measured effect."""
    runs = defaultdict(list)
    for r in records:
        if r.get("kind") == "run" and r["figures"].get("status") == "ok" and r["figures"].get("samples_per_sec"):
            runs[(r["learner"], r["fingerprint"]["class"])].append(r)
    found = []
    for (learner, hardware), mine in runs.items():
        for base in mine:
            for other in mine:
                technique = _technique(base["config"], other["config"])
                if technique:
                    speedup = other["figures"]["samples_per_sec"] / base["figures"]["samples_per_sec"]
                    found.append(Effect(technique, learner, hardware, speedup, other["fingerprint"]))
    return sorted(found, key=lambda e: (e.technique, e.hardware, e.learner))


def _why(effect: Effect, others: list[Effect]) -> str:
    """The fingerprint fields where this machine differs from every other machine that measured it."""
    reasons = []
    for key, words in _WHY_FIELDS.items():
        theirs = sorted({str(o.fingerprint.get(key)) for o in others})
        mine = str(effect.fingerprint.get(key))
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
        median = statistics.median(e.speedup for e in group)
        for e in group:
            ratio = e.speedup / median
            if not 1 / OUTLIER_FACTOR <= ratio <= OUTLIER_FACTOR:
                named.append((e, ratio, _why(e, [o for o in group if o is not e])))
    return named


def room_table(records: list[dict[str, Any]]) -> Table:
    """Each technique's effect by hardware class: machines, median speed-up and its range."""
    groups = defaultdict(list)
    for e in effects(records):
        groups[(e.technique, e.hardware)].append(e.speedup)
    rows = [[technique, hardware, len(s), f"{statistics.median(s):.2f}x", f"{min(s):.2f}-{max(s):.2f}x"]
            for (technique, hardware), s in sorted(groups.items())]
    learners = len({r["learner"] for r in records})
    return Table(["technique", "hardware", "machines", "median speed-up", "range"], rows,
                 caption=f"What the room measured: {len(records)} records from {learners} learners "
                         "(speed-up: samples/s with the technique over the same machine's baseline)")


def outlier_table(records: list[dict[str, Any]]) -> Table:
    """The machines whose effect stands out from the room's, named by class and why."""
    rows = [[e.technique, e.learner, e.hardware, f"{e.speedup:.2f}x", f"{ratio:.2f}x the room's median", why]
            for e, ratio, why in outliers(effects(records))]
    return Table(["technique", "learner", "hardware", "speed-up", "against the room", "why"], rows,
                 caption=f"Outliers (more than {OUTLIER_FACTOR}x from the room's median)" if rows
                 else "No outliers: every machine within 1.5x of the room's median")


def calibration_table(records: list[dict[str, Any]]) -> Table:
    """The room's predictions against what it measured: per exercise, how many, and the median
    predicted/measured (numbers) or the share predicted right (choices)."""
    groups = defaultdict(list)
    for r in records:
        for row in r.get("rows", []) if r.get("kind") == "predictions" else []:
            groups[(row["notebook"], row["exercise"], row["kind"], row.get("unit") or "")].append(row)
    table = []
    for (notebook, exercise, kind, unit), rows in sorted(groups.items()):
        ratios = [r["predicted"] / r["measured"] for r in rows
                  if isinstance(r["predicted"], (int, float)) and isinstance(r["measured"], (int, float)) and r["measured"]]
        if kind in ("ratio", "bytes") and ratios:
            value = f"median predicted/measured {statistics.median(ratios):.2f}"
        else:
            value = f"{sum(r['predicted'] == r['measured'] for r in rows)}/{len(rows)} predicted right"
        table.append([notebook, exercise, kind + (f" ({unit})" if unit else ""), len(rows), value])
    return Table(["notebook", "exercise", "kind", "predictions", "calibration"], table,
                 caption="The room's predictions against its measurements")


def room_figure(records: list[dict[str, Any]]):
    """One panel per technique: each machine's speed-up by hardware class (log scale, 1x marked)."""
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
        ax.set_xticks(range(len(classes)), classes, rotation=20, ha="right", fontsize=8)
        ax.set_title(technique)
        ax.set_ylabel("speed-up over the same machine's baseline")
    plt.close(fig)
    return fig
