"""Quantize a trained model: post-training (PTQ) three ways, and quantization-aware training (QAT).

Every function copies the model and returns the quantized copy, so the fp32 original stays
available to compare against. What each path is, and where it is fast:

* `dynamic_int8(model, backend="torch.ao")`: the deprecated `torch.ao.quantization.quantize_dynamic`
  (what seed 004 teaches). int8 weights, activations quantized on the fly; CPU only, and on x86
  its fbgemm kernels are still the fast int8 path in eager mode.
* `dynamic_int8(model)` / `weight_intx(model, bits=4)`: the current API, torchao `quantize_`
  with `Int8DynamicActivationInt8WeightConfig` / `Int8DynamicActivationIntxWeightConfig`.
  Its kernels target GPUs; on a CPU in eager mode measure before you believe a speed-up.
* static PTQ through torch.export + torchao's pt2e is written by hand in notebook 05;
  `per_tensor_weights` and `activation_scales` serve its knobs. In eager mode the result runs
  reference quantize/dequantize ops: accuracy is real, speed needs torch.compile lowering.
* `convert_qat`: torchao QAT's convert step. `RunConfig(qat="int4")` prepares the model inside
  the training loop; convert the trained model afterwards.

Only `nn.Linear` layers are quantized (embeddings and norms stay fp32). torchao is optional
(the `quantization` extra) and imported only when a function needs it, with its
load-time log lines silenced.

Example:
    >>> result = wb.run(wb.RunConfig(model="mlp"), keep_model=True)            # doctest: +SKIP
    >>> int8 = dynamic_int8(result.model, backend="torch.ao")                  # doctest: +SKIP
    >>> int2 = weight_intx(result.model, bits=2)                               # doctest: +SKIP

Measure quantized models side by side: size on disk, latency per batch, accuracy.

`measure(model, data, name=...)` gives one `QuantResult`; `compare_quantized(results)` lays
them out as a table and a figure, the first as the baseline for ratios.

* size on disk: the state_dict saved into memory (`torch.save` to a BytesIO), counting only
  tensors the model uses (an exported, converted graph keeps its unused fp32 originals);
* Linear weight bytes: an exact count of what the (formerly) Linear weights hold as stored:
  values plus scales and zero points; deterministic, so nbval can check it;
* latency: seconds for one batch, the median over the evaluation's full batches (topped up to
  `repeats` timings), the first `warmup` untimed, with a fixed thread count (noisy: compare as
  ratios measured in the same session);
* accuracy on the given held-out examples, and agreement: the share of predictions equal to
  the baseline's.

Example:
    >>> base = measure(model, data.test, name="fp32")                         # doctest: +SKIP
    >>> int8 = measure(dynamic_int8(model), data.test, name="int8", baseline=base)  # doctest: +SKIP
    >>> compare_quantized([base, int8])                                        # doctest: +SKIP
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.base.report import Results, Table, format_bytes
from workbench.core.models import unavailable_reason  # noqa: F401  (the notebook's names, in one place)
from workbench.lessons import evidence
from workbench.lessons.contention import interleaved_speedup
from workbench.lessons.figures_memory import weight_grid  # noqa: F401
from workbench.lessons.quant_bytes import linear_weight_bytes, size_on_disk
from workbench.machine.hardware import int8_kernels, int8_speedup_expected, presented_note
from workbench.machine.torchao_support import (
    config_by_name,
    first_line,
    import_torchao,
    intx_config,
    quiet_torchao_logs,
    require_linear,
    torchao_version,
)

BACKENDS = ("torchao", "torch.ao")


def _not_enum_notice(record: logging.LogRecord) -> bool:
    return "is an Enum subclass and is now natively supported" not in record.getMessage()


def load_torchao() -> None:
    """Import the torchao modules the notebook uses, once, quietly: on a CPU machine torchao
    logs that its CUDA-only extensions are missing, and pt2e trips a torch.jit deprecation
    notice. QAT's first prepare registers an Enum with torch's pytree, which logs a warning
    about torch's own API (not the learner's code): that one message is filtered out."""
    logging.getLogger("torch.utils._pytree").addFilter(_not_enum_notice)
    for module in ("torchao.quantization", "torchao.quantization.qat", "torchao.quantization.pt2e.quantize_pt2e",
                   "torchao.quantization.pt2e.quantizer.x86_inductor_quantizer"):
        import_torchao(module)

def _copy(model: nn.Module) -> nn.Module:
    require_linear(model)
    return copy.deepcopy(model).eval()


def quantize_with(model: nn.Module, config: Any) -> nn.Module:
    """A quantized copy of `model` under any torchao config (an object or a class name).

    An unsupported config becomes one ValueError line naming the config and the version.
    """
    if isinstance(config, str):
        config = config_by_name(config)
    quantization = import_torchao()
    quantized = _copy(model)
    try:
        with quiet_torchao_logs():
            quantization.quantize_(quantized, config)
    except (AssertionError, NotImplementedError, RuntimeError, TypeError, ValueError) as error:
        hint = ("for QAT use RunConfig(qat='int8'|'int4'|'int3'|'int2')" if type(config).__name__ == "QATConfig"
                else "try dynamic_int8() or weight_intx()")
        raise ValueError(f"torchao {torchao_version()} cannot apply {_config_name(config)}: "
                         f"{first_line(error)}; {hint}") from error
    return quantized


def dynamic_int8(model: nn.Module, *, backend: str = "torchao") -> nn.Module:
    """Dynamic INT8 PTQ: int8 weights; activations quantized per batch at run time.

    backend="torchao": the current API (torchao `Int8DynamicActivationInt8WeightConfig`).
    backend="torch.ao": the deprecated `torch.ao.quantization.quantize_dynamic` (CPU only);
    its deprecation warning is caught here, since the notebook labels the path itself.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not known; use 'torchao' (current) or 'torch.ao' (deprecated)")
    if backend == "torchao":
        return quantize_with(model, import_torchao().Int8DynamicActivationInt8WeightConfig())
    quantized = _copy(model).cpu()  # quantized::linear_dynamic has CPU kernels only
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization is deprecated", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions", category=UserWarning)
        return torch.ao.quantization.quantize_dynamic(quantized, {nn.Linear}, dtype=torch.qint8)


def torch_ao_deprecation() -> str | None:
    """The first line of the deprecation warning this torch gives `torch.ao.quantization`
    (read live from the installed version), or None if it gives none."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(2, 2)), {nn.Linear}, dtype=torch.qint8)
    for w in caught:
        if issubclass(w.category, DeprecationWarning) and "deprecated" in str(w.message):
            return str(w.message).strip().splitlines()[0].strip()
    return None


def weight_intx(model: nn.Module, *, bits: int, group_size: int | None = None) -> nn.Module:
    """Low-bit weight PTQ: `bits`-bit weights (torchao), int8 dynamic activations.

    Note: torchao's default CPU layout keeps each low-bit value in a byte (unpacked), so
    the file is no smaller than int8; packed layouts are backend-specific.
    """
    config = intx_config(bits, group_size=group_size)
    if group_size is not None:
        if bad := [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and m.in_features % group_size]:
            raise ValueError(f"group_size={group_size} does not divide the input width of Linear {bad[0]!r}; "
                             "pick a divisor of every in_features, or group_size=None (per-channel)")
    return quantize_with(model, config)


def convert_qat(model: nn.Module, *, bits: int) -> nn.Module:
    """A real quantized copy of a QAT-trained model (same scheme as weight_intx(bits)): `bits`
    must be the weights' width it trained with, or the conversion would discard what QAT learned."""
    require_linear(model)
    config = intx_config(bits)
    qat = import_torchao("torchao.quantization.qat")
    trained = {_fake_quant_scheme(m) for m in model.modules() if type(m).__name__.startswith("FakeQuantized")}
    if not trained:
        raise ValueError("this model has no fake-quantized layers: train it with RunConfig(qat='int4') "
                         "(or prepare_qat) first, or use weight_intx() for PTQ")
    asked = f"int8 activations, int{bits} weights per channel"
    if trained != {asked}:
        ours = [re.fullmatch(r"int8 activations, int(\d) weights per channel", scheme) for scheme in trained]
        fix = (f"pass bits={ours[0].group(1)}, the width it trained with" if len(ours) == 1 and ours[0]
               else "convert it with the torchao QATConfig it was prepared with (step='convert')")
        raise ValueError(f"convert_qat(bits={bits}) would quantize to {asked}, but the model was trained with "
                         f"{' and '.join(sorted(trained))}; {fix}")
    return quantize_with(model, qat.QATConfig(config, step="convert"))


def _fake_quant_scheme(layer: nn.Module) -> str:
    """What a fake-quantized layer trained with, in convert_qat's words: 'int8 activations, int4
    weights per channel' (what prepare_qat(bits=4) inserts)."""
    def described(quantizer: Any, what: str) -> str:
        config = getattr(quantizer, "config", None)
        if config is None:
            return f"{what} unquantized"
        dtype = str(getattr(config, "dtype", type(config).__name__)).removeprefix("torch.")
        granularity = getattr(config, "granularity", None)
        size = getattr(granularity, "group_size", None)
        where = {"PerAxis": " per channel", "PerToken": ""}.get(type(granularity).__name__, f" {granularity}")
        return f"{dtype} {what}" + (f" in groups of {size}" if size else where)
    activations = described(getattr(layer, "activation_fake_quantizer", None), "activations")
    return f"{activations}, {described(getattr(layer, 'weight_fake_quantizer', None), 'weights')}"


def activation_scales(model: nn.Module) -> list[float]:
    """The fixed activation scales a pt2e-converted model computes with, in graph order: what
    calibration chose (one real number per integer step of each quantized activation)."""
    if not isinstance(model, torch.fx.GraphModule):
        raise ValueError(f"activation_scales needs a model converted by convert_pt2e, got {type(model).__name__}")
    return [float(n.args[1]) for n in model.graph.nodes
            if n.op == "call_function" and "quantize_per_tensor" in str(n.target)
            and "dequantize" not in str(n.target) and isinstance(n.args[1], float)]


def per_tensor_weights(config: Any) -> Any:
    """A pt2e quantization config (e.g. the x86 default) with one symmetric scale per weight
    tensor instead of one per output row."""
    observer = import_torchao("torchao.quantization.pt2e").MinMaxObserver
    weight = dataclasses.replace(config.weight, qscheme=torch.per_tensor_symmetric, ch_axis=None,
                                 observer_or_fake_quant_ctr=observer.with_args(eps=2**-12))
    return dataclasses.replace(config, weight=weight)


def _config_name(config: Any) -> str:
    base = getattr(config, "base_config", None)
    return f"{type(config).__name__}({type(base).__name__})" if base is not None else type(config).__name__

@dataclass(frozen=True, slots=True)
class QuantResult:
    name: str
    size_bytes: int
    """torch.save(state_dict) into memory: the file a deployment would ship."""
    linear_weight_bytes: int
    """Exact bytes of the (formerly) Linear weights as stored, scales and zero points included."""
    latency_s: float
    """Median seconds per batch of `batch_size`, warm-up excluded."""
    latency_times_s: list[float]
    accuracy: float
    agreement: float | None
    """Share of predictions equal to the baseline's (None for the baseline itself)."""
    samples: int
    batch_size: int
    threads: int
    device: str
    note: str = ""
    predictions: torch.Tensor | None = field(default=None, repr=False, compare=False)
    correct: torch.Tensor | None = field(default=None, repr=False, compare=False)
    """Per example evaluated: whether the prediction was right (to compare on the same examples)."""

    def accuracy_change(self, baseline: QuantResult) -> float:
        """This accuracy minus the baseline's on the same examples (this may have seen fewer:
        a time budget stops a slow variant early, on a prefix of the baseline's examples)."""
        if baseline.correct is None or len(baseline.correct) < self.samples:
            return self.accuracy - baseline.accuracy
        return self.accuracy - baseline.correct[: self.samples].float().mean().item()


def _device_of(model: nn.Module) -> torch.device:
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # a timing needs the GPU's work finished


@torch.no_grad()
def measure(model: nn.Module, data: Any, *, name: str, baseline: QuantResult | None = None,
            batch_size: int = 64, repeats: int = 10, warmup: int = 1, threads: int | None = None,
            note: str = "", max_seconds: float | None = None) -> QuantResult:
    """Size, latency per batch and accuracy of `model` on `data` (a dataset with .inputs and
    .labels, e.g. `wb.load_data(...).test`), on the device the model is on.

    The evaluation's full batches double as latency samples (the first `warmup` untimed);
    when they give fewer than `repeats` timings, the first batch is run again until they do.
    `threads`: torch CPU threads while measuring (default: the current setting); keep it the
    same for every variant compared. `max_seconds`: a time budget for a variant that may be
    very slow here (torchao's int8 ran 0.02x fp32 on one AVX2-only CPU): past it, evaluation
    stops after the current batch, accuracy counts the examples seen (`samples`, named in the
    note) and comparisons with the baseline use the same examples.
    """
    if not (hasattr(data, "inputs") and hasattr(data, "labels")):
        raise TypeError(f"data must have .inputs and .labels (e.g. wb.load_data(...).test), got {type(data).__name__}")
    if batch_size < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"batch_size={batch_size} and repeats={repeats} must be >= 1, warmup={warmup} >= 0")
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        model.eval()
        device = _device_of(model)
        inputs, labels = data.inputs, data.labels
        batch_size = min(batch_size, len(labels))
        predictions, times = [], []
        began = time.perf_counter()

        def over_budget() -> bool:
            return max_seconds is not None and time.perf_counter() - began > max_seconds

        def timed(batch: torch.Tensor) -> torch.Tensor:
            _sync(device)
            start = time.perf_counter()
            logits = model(batch)
            _sync(device)
            times.append(time.perf_counter() - start)
            return logits

        for i in range(0, len(labels), batch_size):
            if i and over_budget() and len(times) > warmup:
                break
            batch = inputs[i:i + batch_size].to(device)
            # Only full batches are timed: a short last batch would pull the median down.
            logits = timed(batch) if len(batch) == batch_size else model(batch)
            predictions.append(logits.argmax(-1).cpu())
        predictions = torch.cat(predictions)
        labels = labels[: len(predictions)]
        # The first calls pick kernels, fill caches and, for some paths, quantize lazily.
        first = inputs[:batch_size].to(device)
        for _ in range(warmup - len(times)):  # too few full batches to warm up on
            model(first)
        times = times[warmup:]
        while len(times) < repeats and not (times and over_budget()):
            timed(first)
        used_threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(previous_threads)
    seen, total = len(predictions), len(data.labels)
    agreement = None
    if baseline is not None and baseline.predictions is not None:
        # A variant stopped by its time budget saw a prefix of the examples; otherwise all of them.
        if len(baseline.predictions) < seen or (seen == total and len(baseline.predictions) != seen):
            raise ValueError(f"baseline {baseline.name!r} was measured on {len(baseline.predictions)} examples, "
                             f"this on {seen}; measure both on the same data")
        agreement = (baseline.predictions[:seen] == predictions).float().mean().item()
    if seen < total:
        budget_note = f"{seen} of {total} examples (time budget)"
        note = f"{note}; {budget_note}" if note else budget_note
    return QuantResult(
        name=name, size_bytes=size_on_disk(model), linear_weight_bytes=linear_weight_bytes(model),
        latency_s=statistics.median(times), latency_times_s=times,
        accuracy=(predictions == labels).float().mean().item(), agreement=agreement,
        samples=len(labels), batch_size=batch_size, threads=used_threads,
        device=device.type, note=note, predictions=predictions, correct=predictions == labels,
    )


class QuantComparison(Results):
    """Quantized variants side by side; ratios against the first. Example:

        >>> cmp = compare_quantized([fp32, int8])         # doctest: +SKIP
        >>> cmp.ratio("latency_s", "int8")  # int8 time over fp32 time  # doctest: +SKIP
    """

    kind = "variant"
    empty_message = "compare_quantized() needs at least one QuantResult"
    name_hint = "pass name= to measure()"
    header = ["variant", "device", "size on disk", "x smaller", "Linear weights", "ms / batch",
              "x faster", "accuracy", "change (points)", "agrees with first", "note"]

    @property
    def results(self) -> list[QuantResult]:
        return self.items

    def result(self, name: str) -> QuantResult:
        return self.item(name)

    def rows(self) -> list[list[str]]:
        base = self.results[0]
        return [[
            r.name, r.device, format_bytes(r.size_bytes), f"{base.size_bytes / r.size_bytes:.2f}",
            format_bytes(r.linear_weight_bytes), f"{r.latency_s * 1e3:.1f}",
            f"{base.latency_s / r.latency_s:.2f}", f"{r.accuracy:.3f}",
            f"{r.accuracy_change(base) * 100:+.1f}",
            "-" if r.agreement is None else f"{r.agreement:.1%}", r.note,
        ] for r in self.results]

    @property
    def table(self) -> Table:
        return Table(list(self.header), self.rows())

    def caption(self) -> str:
        r = self.results[0]
        return (f"{r.samples} held-out examples; latency: median of {len(r.latency_times_s)} batches "
                f"of {r.batch_size}, {r.threads} thread(s), warm-up excluded")

    def make_figure(self):
        return quant_figure(self.results)

    def __str__(self) -> str:
        return str(self.table)


def quant_figure(results: Sequence[QuantResult]):
    """Bars of size on disk, latency per batch and accuracy, one colour per variant."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state

    fig = Figure(figsize=(13, 3.4))
    axes = fig.subplots(1, 3)
    names = [r.name for r in results]
    colours = [f"C{i}" for i in range(len(results))]
    panels = [([r.size_bytes / 2**20 for r in results], "size on disk (MiB)"),
              ([r.latency_s * 1e3 for r in results], f"ms per batch of {results[0].batch_size}"),
              ([r.accuracy for r in results], "held-out accuracy")]
    for ax, (values, title) in zip(axes, panels):
        ax.bar(range(len(results)), values, color=colours)
        ax.set_xticks(range(len(results)), names, rotation=25, ha="right", fontsize=8)
        ax.set_title(title)
    low = min(r.accuracy for r in results)
    axes[2].set_ylim(max(0.0, low - 0.1), min(1.0, max(r.accuracy for r in results) + 0.05))
    fig.tight_layout()
    return fig


def compare_quantized(results: Sequence[QuantResult]) -> QuantComparison:
    """Lay quantized variants side by side; the first is the baseline for ratios."""
    return QuantComparison(results)


def _accuracy_evidence(base: QuantResult, arms: Sequence[QuantResult], chance: float | None, effect: float) -> Any:
    """evidence.accuracy on the examples both were scored on: the paired standard error from the
    share of examples on which exactly one of the two was right (McNemar's discordant pairs)."""
    n = min(r.samples for r in arms)
    discordant = max((base.correct[:n] != r.correct[:n]).float().mean().item() for r in arms) \
        if base.correct is not None and all(r.correct is not None for r in arms) else None
    return evidence.accuracy(base.accuracy, [r.accuracy for r in arms], samples=n, chance=chance, effect=effect,
                             disagree=discordant)


def claims_rows(fp32: QuantResult, dynamic: QuantResult, static: QuantResult, ptq: QuantResult, qat: QuantResult,
                speeds: dict[str, Any], *, minilm: Sequence[QuantResult] = (), trained: bool = True,
                chance: dict[str, float] | None = None) -> list[tuple[Any, ...]]:
    """The notebook's claims, read from its measurements (rows for `wb.claims`).

    `speeds`: model name -> `interleaved_speedup` of torch.ao's dynamic INT8 against fp32.
    `minilm`: (fp32, torchao int8, torch.ao int8) on the reviews, where MiniLM is installed.
    Asserts what is a property of the method, not of a busy machine: torch.ao's speed-up on a
    CPU with VNNI and a free core; accuracy bounds only when the models were trained
    (`trained`; a capped run's answers sit on the decision boundary, where rounding flips them).
    """
    seed = "seed 004 §3 (docs/SOURCES.md)"
    chance = chance or {}  # unknown chance: the accuracy rows say their evidence is short
    kernels, vnni = int8_kernels(), int8_speedup_expected("cpu")
    presented = presented_note()  # a CPU class presented for a test: the int8 kernels timed are not its own
    for name, s in speeds.items():
        if vnni and s.core.free and s.ratio < 1.5 and not presented:
            raise AssertionError(f"dynamic INT8 should speed up the {name} on a CPU with VNNI: {s.ratio:.2f}x")
    ratios = [s.ratio for s in speeds.values()]
    speed_verdict = "holds" if min(ratios) >= 1.1 else "does not hold here" if max(ratios) <= 1 / 1.1 else "holds in part"
    tao = [("MLP", fp32.latency_s / dynamic.latency_s)] + ([("MiniLM", minilm[0].latency_s / minilm[1].latency_s)]
                                                          if minilm else [])
    rows = [("dynamic INT8 speeds up inference", seed,
             "torch.ao (fbgemm, " + kernels + "), interleaved with fp32: "
             + ", ".join(f"{n} {s.ratio:.2f}x" for n, s in speeds.items()) + "; torchao quantize_ in CPU eager mode: "
             + ", ".join(f"{n} {r:.2f}x" for n, r in tao),
             f"{speed_verdict}: fp32's speed = 1.00x; int8 kernels "
             f"on {kernels}" + (" (VNNI)" if vnni else " without VNNI, where int8 is not reliably faster")
             + (f" ({presented}: not asserted)" if presented else ""),
             # a presented CPU class times this CPU's kernels, not the class's: no timing is its evidence
             evidence.speed({} if presented else {n: s.ratio for n, s in speeds.items()}, 1.1,
                            free_core=not presented and all(s.core.free for s in speeds.values()),
                            why_busy=f"{presented}: the kernels timed are this CPU's" if presented else
                            ", ".join(f"{n}: this process had {s.core.share:.0%} of its core(s)"
                                      for n, s in speeds.items() if not s.core.free)))]
    shrink = f"MLP file {fp32.size_bytes / dynamic.size_bytes:.2f}x smaller"
    if minilm:
        if minilm[2].linear_weight_bytes * 4 != minilm[0].linear_weight_bytes:
            raise AssertionError("torch.ao's int8 Linear weights should be exactly 1/4 of fp32's")
        shrink += (f"; MiniLM file {minilm[0].size_bytes / minilm[1].size_bytes:.2f}x, its Linear weights "
                   f"{minilm[0].linear_weight_bytes / minilm[2].linear_weight_bytes:.0f}x (embeddings stay fp32)")
    rows.append(("dynamic INT8 shrinks the model", seed, shrink,
                 "holds: by as much as a model's bytes are Linear weights" if minilm else "holds", evidence.count()))
    if minilm:
        loss_tao, loss_ao = (-r.accuracy_change(minilm[0]) * 100 for r in minilm[1:])
        if trained and (loss_tao > 1.5 or loss_ao > 3.0):
            raise AssertionError(f"dynamic INT8 lost {loss_tao:.1f} (torchao) / {loss_ao:.1f} (torch.ao) points")
        worst = max(loss_tao, loss_ao)
        rows.append(("dynamic INT8 costs ~1-2% accuracy", seed,
                     f"MiniLM, {minilm[0].samples} reviews: torchao {-loss_tao:+.1f} points, torch.ao {-loss_ao:+.1f}",
                     ("holds" if worst <= 2 else "does not hold here") if trained
                     else "not shown here: a capped run, too short to train the model",
                     _accuracy_evidence(minilm[0], minilm[1:], chance.get("MiniLM"), 0.01)))
    static_change = static.accuracy_change(fp32) * 100
    rows.append(("static INT8 with calibrated activation ranges keeps accuracy", "Krishnamoorthi 2018",
                 f"MLP, pt2e: {static_change:+.1f} points; {fp32.latency_s / static.latency_s:.2f}x fp32's speed "
                 "in eager mode (reference quantize/dequantize ops)",
                 "holds" if abs(static_change) <= 1 else "does not hold here",
                 _accuracy_evidence(fp32, [static], chance.get("MLP"), 0.01)))
    qat_loss = (fp32.accuracy - qat.accuracy) * 100
    if trained and (qat.accuracy < ptq.accuracy or qat_loss > 1):
        raise AssertionError(f"QAT int2 {qat.accuracy:.3f} vs PTQ {ptq.accuracy:.3f}, fp32 {fp32.accuracy:.3f}")
    rows.append(("QAT's accuracy loss is usually under 0.5%", seed,
                 f"MLP at int2 weights: fp32 {fp32.accuracy:.3f}, PTQ {ptq.accuracy:.3f}, QAT {qat.accuracy:.3f}",
                 "holds" if qat_loss <= 0.5 else "holds in part: QAT recovers most of PTQ's loss, within a point"
                 if qat_loss <= 1 else "does not hold here", _accuracy_evidence(fp32, [qat], chance.get("MLP"), 0.005)))
    return rows
