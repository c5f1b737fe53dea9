"""CPU inference benchmark of a ModernBERT-base-sized encoder at long context: 4k to 128k tokens.

What is measured: one forward pass (under ``torch.inference_mode()``) of a 22-layer encoder with
ModernBERT-base's shape, built from a config with random weights (no checkpoint is needed):
``ModernBertConfig(hidden_size=768, num_hidden_layers=22, num_attention_heads=12,
intermediate_size=1152, global_attn_every_n_layers=3, local_attention=128, vocab_size=50368,
max_position_embeddings=max(lengths), dropouts 0)``, so 8 global layers (0, 3, ..., 21) and 14
local layers (softmax within |i - j| <= 64). CPU, float32, batch 1, on the same random input_ids
(seeded by T) and an all-ones attention_mask (1, T) for every contender. The contenders, all in
the same run:

1. ``sliced_relu_global``: ``hf_sliced_attn.prepare_config(config, "sliced_relu")`` (default
   ``layers="global"``) then ``AutoModel.from_config(config)``: the global layers run sliced ReLU
   (1 slice, linear projection: the paper's formula; conversions use 4 slices and an MLP, about
   1.3x slower, see bench_attention.py), the local layers keep softmax, computed band by band
   within the window (``hf_sliced_attn.ops.windowed_softmax``).
2. ``rela_global``: the same with ``"rela"`` (quadratic in T on the global layers, blocked memory).
3. ``sliced_relu_all``: ``"sliced_relu"`` with ``layers="all"``: the local layers run sliced ReLU
   within the window too.
4. ``sdpa_global``: the baseline of the bars, the same encoder code path with softmax on every layer:
   ``prepare_config(config, "sliced_relu", layers=[])`` marks every layer as kept on softmax, so the
   plugin's attention function sends the global layers to transformers' ``sdpa_attention_forward``
   (with the padding mask, which is None here since nothing is padded: PyTorch's fused kernel, O(T)
   memory, O(T^2) time) and the local layers to the same banded windowed softmax as 1 and 2.
5. ``sdpa_stock``: transformers' own ModernBERT with ``attn_implementation="sdpa"`` (no plugin). Its
   local layers get a dense (1, 1, T, T) sliding-window mask, so every layer is O(T^2) in time and
   the masks O(T^2) in memory: it runs only where that fits (see skipping).

What each model really runs is checked, not assumed: after building, every attention layer's
``hf_sliced_attn_mode`` mark and plugin modules are compared with what the contender should have,
and during the warm-up the calls to the plugin's softmax paths (``sdpa_attention_forward``,
``windowed_softmax``) and to the mechanism (through ``hf_sliced_attn.attention.observe_attention``)
are counted per forward. Both are written to the report and the JSON; a mismatch stops the run. When both ``sdpa_global`` and
``sdpa_stock`` run, their warm-up outputs (same seed, so the same weights) are compared.

Time: ``time.perf_counter()`` around one forward. One warm-up forward per contender, at the
smallest length only (a 128k forward takes minutes: no warm-up at long lengths); then the median
of 3 runs for T < 16384, a single run from T = 16384 on. Each model is built once per contender
(``max_position_embeddings`` covers the largest T), and freed before the next contender.

Peak memory: the growth of the process's resident-set high-water mark. Before each timed run,
Python garbage is collected, ``malloc_trim(0)`` returns freed heap pages to the kernel and ``5`` is
written to ``/proc/self/clear_refs``, which resets ``VmHWM`` to the current ``VmRSS``; after the run
``VmHWM - VmRSS_before`` is the largest extra resident memory at any instant of the forward. The
model's weights and the inputs exist before the baseline and are not counted; activations,
attention temporaries, masks and the output are. The largest value over the runs is reported.

Skipping: a point is skipped (printed and recorded as "skipped", with the reason) when
extrapolation from the contender's previous measured point, time ~ T^a and memory ~ T^b, predicts
more than ``--time-limit`` seconds (default 1800, so that sdpa_global's 64k point, the bar's baseline, runs) or more than 80% of the RAM available at that
moment; the larger T of that contender are then skipped too. a = 1.1 for the sliced contenders
and 2 for those with quadratic global layers (rela_global, sdpa_global, sdpa_stock); b = 1, except
sdpa_stock, b = 2 (its dense masks).

Results: the tables are printed and written to ``<output>/long_context.md`` (command, environment,
commit, total time, load average at the start and end; bars; time and peak memory per T and
contender; time ratios against sliced_relu_global; what each contender's layers ran), the raw
numbers to ``long_context.json`` and a log-log plot (time vs T, peak memory vs T) to
``long_context.png``. ``<output>`` is ``benchmarks/results`` unless ``--output`` is given. Bars:
peak(131072) / peak(32768) for sliced_relu_global (linear = 4, required <= 4.6) and, at T = 65536,
sdpa_global time / sliced_relu_global time (required >= 4), each PASS, FAIL or "not measured".

Duration on 2 otherwise idle cores (measured; more when other jobs share them): about 80 min.
sliced_relu_global and sliced_relu_all take about 10 min each for all lengths (128k: 340-380 s);
rela_global about 11 min (stops at 32k); sdpa_global about 25 min (its 64k forward takes 18 min;
128k is skipped); sdpa_stock about 18 min (stops at 32k, where its dense masks take 16 GiB).

Commands::

    python benchmarks/bench_long_context.py                       # the full run (about 80 min)
    python benchmarks/bench_long_context.py --contenders sliced_relu_global,sdpa_global --lengths 4096,65536  # the 64k bar only (about 25 min)
    python benchmarks/bench_long_context.py --layers 2 --lengths 256,1024 --threads 1 --output /tmp/lc_smoke
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import psutil  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModel, ModernBertConfig  # noqa: E402

import hf_sliced_attn  # noqa: E402
from benchmarks._report import Bar, fmt_bytes, fmt_time, reset_peak, source_state, status_kib  # noqa: E402
import hf_sliced_attn.attention as plugin_attention  # noqa: E402
from hf_sliced_attn.attention import LAYER_MODE_ATTR, SOFTMAX, observe_attention  # noqa: E402

LENGTHS = (4096, 16384, 32768, 65536, 131072)
SINGLE_RUN_FROM = 16384
"""From this T on, one timed run; below it the median of ``REPS``."""
REPS = 3
MEMORY_FRACTION = 0.8
TIME_LIMIT_S = 1800.0
RESULTS = Path(__file__).resolve().parent / "results"
STEM = "long_context"
VOCAB_SIZE = 50368
SUBJECT, BASELINE = "sliced_relu_global", "sdpa_global"


@dataclass(frozen=True)
class Contender:
    """An encoder variant. ``mechanism`` None is stock transformers with ``attn_implementation="sdpa"``;
    ``time_exp`` and ``memory_exp`` are the exponents used to predict the next point for skipping."""

    name: str
    mechanism: str | None
    options: dict[str, Any]
    time_exp: float
    memory_exp: float
    global_mode: str | None  # the expected hf_sliced_attn_mode of the global / local layers (None: no mark)
    local_mode: str | None


CONTENDERS = [
    Contender("sliced_relu_global", "sliced_relu", {}, 1.1, 1.0, "sliced_relu", SOFTMAX),
    Contender("rela_global", "rela", {}, 2.0, 1.0, "rela", SOFTMAX),
    Contender("sliced_relu_all", "sliced_relu", {"layers": "all"}, 1.1, 1.0, "sliced_relu", "sliced_relu"),
    Contender("sdpa_global", "sliced_relu", {"layers": []}, 2.0, 1.0, SOFTMAX, SOFTMAX),
    Contender("sdpa_stock", None, {}, 2.0, 2.0, None, None),
]
BY_NAME = {c.name: c for c in CONTENDERS}


# --------------------------------------------------------------------------- the encoders


def encoder_config(args: argparse.Namespace, max_length: int) -> ModernBertConfig:
    """ModernBERT-base's shape (or the test overrides), dropouts 0, positions up to ``max_length``."""
    return ModernBertConfig(
        hidden_size=args.hidden_size, num_hidden_layers=args.layers, num_attention_heads=args.heads,
        intermediate_size=args.intermediate_size, global_attn_every_n_layers=3, local_attention=128,
        max_position_embeddings=max_length, vocab_size=VOCAB_SIZE, attention_dropout=0.0,
        embedding_dropout=0.0, mlp_dropout=0.0, classifier_dropout=0.0,
    )


def build_model(contender: Contender, args: argparse.Namespace, max_length: int) -> torch.nn.Module:
    """The contender's encoder, random weights from seed 0, in eval mode."""
    config = encoder_config(args, max_length)
    torch.manual_seed(0)
    if contender.mechanism is None:
        model = AutoModel.from_config(config, attn_implementation="sdpa")
    else:
        config = hf_sliced_attn.prepare_config(config, contender.mechanism, **dict(contender.options))
        model = AutoModel.from_config(config)
    return model.eval()


def describe_layers(model: torch.nn.Module) -> list[dict[str, Any]]:
    """Per attention layer: its type (full/sliding), its plugin mark and the plugin modules it holds."""
    plugin_names = hf_sliced_attn.MECHANISMS.module_names()
    return [
        {
            "index": index,
            "type": model.config.layer_types[index],
            "mode": getattr(layer.attn, LAYER_MODE_ATTR, None),
            "plugin_modules": sorted(name for name, _ in layer.attn.named_children() if name in plugin_names),
        }
        for index, layer in enumerate(model.layers)
    ]


class CheckFailed(RuntimeError):
    """A model does not run what its contender claims: the run stops."""


def check_layers(contender: Contender, layers: list[dict[str, Any]]) -> None:
    """Every layer carries the mark and modules the contender means; raise CheckFailed otherwise."""
    for layer in layers:
        expected = contender.global_mode if layer["type"] == "full_attention" else contender.local_mode
        has_modules = expected not in (None, SOFTMAX)
        if layer["mode"] != expected or bool(layer["plugin_modules"]) != has_modules:
            raise CheckFailed(
                f"{contender.name}: layer {layer['index']} ({layer['type']}) is marked {layer['mode']!r} with "
                f"modules {layer['plugin_modules']}; expected {expected!r} with{'' if has_modules else 'out'} modules"
            )


@contextmanager
def count_attention_calls() -> Iterator[dict[str, int]]:
    """Count, within the block, the plugin's softmax paths and the mechanism's calls."""
    counts = {"sdpa_attention_forward": 0, "windowed_softmax": 0, "mechanism": 0}
    originals = {name: getattr(plugin_attention, name) for name in ("sdpa_attention_forward", "windowed_softmax")}

    def counting(name: str):
        def wrapper(*args: Any, **kwargs: Any):
            counts[name] += 1
            return originals[name](*args, **kwargs)
        return wrapper

    def observer(**_: Any) -> None:
        counts["mechanism"] += 1

    for name in originals:
        setattr(plugin_attention, name, counting(name))
    try:
        with observe_attention(observer):
            yield counts
    finally:
        for name, original in originals.items():
            setattr(plugin_attention, name, original)


def expected_calls(contender: Contender, layers: list[dict[str, Any]]) -> dict[str, int]:
    """The calls ``count_attention_calls`` should see in one forward of the contender's model."""
    counts = {"sdpa_attention_forward": 0, "windowed_softmax": 0, "mechanism": 0}
    if contender.mechanism is None:
        return counts  # stock transformers never enters the plugin
    for layer in layers:
        if layer["mode"] != SOFTMAX:
            counts["mechanism"] += 1
        elif layer["type"] == "full_attention":
            counts["sdpa_attention_forward"] += 1
        else:
            counts["windowed_softmax"] += 1
    return counts


# --------------------------------------------------------------------------- measuring

def forward(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).last_hidden_state


@dataclass
class Point:
    """Median seconds per forward, the largest peak-memory growth in bytes, and every run's seconds."""

    seconds: float
    peak_bytes: int
    runs: list[float] = field(default_factory=list)


def timed_runs(model: torch.nn.Module, input_ids: torch.Tensor, reps: int) -> Point:
    seconds, peaks = [], []
    for _ in range(reps):
        baseline = reset_peak()
        start = time.perf_counter()
        out = forward(model, input_ids)
        seconds.append(time.perf_counter() - start)
        peaks.append(max(0, status_kib("VmHWM") * 1024 - baseline))
        del out
    return Point(statistics.median(seconds), max(peaks), seconds)


def skip_reason(contender: Contender, length: int, previous: tuple[int, Point | str] | None,
                time_limit: float) -> str | None:
    """Why the point at ``length`` is not run, from the contender's previous point; None to run it."""
    if previous is None:
        return None
    prev_length, prev = previous
    if prev == "skipped":
        return "a smaller T was skipped"
    if not isinstance(prev, Point):
        return None
    ratio = length / prev_length
    seconds = prev.seconds * ratio**contender.time_exp
    memory = prev.peak_bytes * ratio**contender.memory_exp
    available = psutil.virtual_memory().available
    if seconds > time_limit:
        return f"predicted {seconds:.0f} s > {time_limit:.0f} s (time ~ T^{contender.time_exp:g} from T={prev_length})"
    if memory > MEMORY_FRACTION * available:
        return (f"predicted {memory / 2**30:.1f} GiB > {MEMORY_FRACTION:.0%} of {available / 2**30:.1f} GiB available "
                f"(memory ~ T^{contender.memory_exp:g} from T={prev_length})")
    return None


@dataclass
class ContenderRecord:
    """What one contender's model was and did: its layers, the calls counted in the warm-up, its points."""

    layers: list[dict[str, Any]] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    expected_calls: dict[str, int] = field(default_factory=dict)
    build_seconds: float = 0.0
    points: dict[int, Point | str] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)


def log(name: str, length: int, text: str) -> None:
    print(f"  {name:20s} T={length:7d}  {text}", flush=True)


def run_contender(contender: Contender, args: argparse.Namespace, inputs: dict[int, torch.Tensor],
                  warmups: dict[str, torch.Tensor]) -> ContenderRecord:
    """Build the model once, check its layers, warm up at the smallest T, then measure every T."""
    record = ContenderRecord()
    start = time.perf_counter()
    model = build_model(contender, args, max(inputs))
    record.build_seconds = time.perf_counter() - start
    record.layers = describe_layers(model)
    check_layers(contender, record.layers)
    record.expected_calls = expected_calls(contender, record.layers)
    previous: tuple[int, Point | str] | None = None
    for index, length in enumerate(sorted(inputs)):
        reason = skip_reason(contender, length, previous, args.time_limit)
        if reason is not None:
            log(contender.name, length, f"skipped ({reason})")
            record.points[length], record.reasons[length] = "skipped", reason
            previous = (length, "skipped")
            continue
        try:
            if index == 0:  # the one warm-up, with the attention calls counted
                with count_attention_calls() as calls:
                    warmups[contender.name] = forward(model, inputs[length])
                record.calls = dict(calls)
                if record.calls != record.expected_calls:
                    raise CheckFailed(f"{contender.name}: attention calls {record.calls}, expected {record.expected_calls}")
            point = timed_runs(model, inputs[length], 1 if length >= SINGLE_RUN_FROM else REPS)
        except CheckFailed:
            raise
        except Exception as error:  # noqa: BLE001  (a failing contender must not stop the others)
            log(contender.name, length, f"error: {type(error).__name__}: {error}")
            record.points[length], record.reasons[length] = "error", f"{type(error).__name__}: {error}"
            previous = (length, "error")
            continue
        record.points[length] = point
        previous = (length, point)
        log(contender.name, length, f"{fmt_time(point.seconds):>9s}  peak +{fmt_bytes(point.peak_bytes):>9s}  "
            f"({len(point.runs)} run{'s' if len(point.runs) > 1 else ''})")
    del model
    reset_peak()  # hand the model's memory back before the next contender
    return record


# --------------------------------------------------------------------------- reporting


def _point(records: dict[str, ContenderRecord], name: str, length: int) -> Point | None:
    point = records[name].points.get(length) if name in records else None
    return point if isinstance(point, Point) else None


def _cell(records: dict[str, ContenderRecord], name: str, length: int, attr: str) -> str:
    point = records[name].points.get(length, "–")
    if not isinstance(point, Point):
        return point
    return fmt_time(point.seconds) if attr == "seconds" else fmt_bytes(point.peak_bytes)


def _ratio(num: Point | None, den: Point | None, attr: str = "seconds") -> float | None:
    if num is None or den is None or getattr(den, attr) <= 0:
        return None
    return getattr(num, attr) / getattr(den, attr)


def bars(records: dict[str, ContenderRecord]) -> list[Bar]:
    return [
        Bar(f"{SUBJECT} peak memory: peak(131072) / peak(32768) (linear = 4)",
            _ratio(_point(records, SUBJECT, 131072), _point(records, SUBJECT, 32768), "peak_bytes"), 4.6, False),
        Bar(f"T=65536, end to end: {BASELINE} time / {SUBJECT} time",
            _ratio(_point(records, BASELINE, 65536), _point(records, SUBJECT, 65536)), 4, True),
    ]


def tables(records: dict[str, ContenderRecord], lengths: list[int]) -> str:
    names = list(records)
    head = "| T | " + " | ".join(names) + " |\n|---:|" + "---:|" * len(names)
    out = []
    for title, attr in (("Time per forward (median of 3 below T=16384, one run from 16384)", "seconds"),
                        ("Peak memory (resident-set growth over the weights and inputs)", "peak_bytes")):
        rows = [f"| {t} | " + " | ".join(_cell(records, n, t, attr) for n in names) + " |" for t in lengths]
        out += [f"## {title}", "", head, *rows, ""]
    others = [n for n in (BASELINE, *names) if n in records and n != SUBJECT]
    others = list(dict.fromkeys(others))
    if SUBJECT in records and others:
        out += [f"## Time ratios: other's time / {SUBJECT}'s time", "",
                "| T | " + " | ".join(f"{o} / {SUBJECT}" for o in others) + " |", "|---:|" + "---:|" * len(others)]
        for t in lengths:
            ratios = [_ratio(_point(records, o, t), _point(records, SUBJECT, t)) for o in others]
            out.append(f"| {t} | " + " | ".join("–" if r is None else f"{r:.2f}×" for r in ratios) + " |")
        out.append("")
    return "\n".join(out)


def layers_section(records: dict[str, ContenderRecord]) -> str:
    out = ["## What each contender's layers ran (checked)", "",
           "Modes: the `hf_sliced_attn_mode` mark of the global / local layers (– = no mark: stock transformers). "
           "Calls: counted in the warm-up forward (plugin's SDPA path, plugin's banded windowed softmax, "
           "the mechanism).", "",
           "| contender | global layers | local layers | plugin modules | calls: sdpa / windowed softmax / mechanism |",
           "|---|---|---|---|---|"]
    for name, record in records.items():
        modes = {kind: sorted({str(l["mode"]) if l["mode"] else "–" for l in record.layers if l["type"] == kind})
                 for kind in ("full_attention", "sliding_attention")}
        modules = sorted({m for l in record.layers for m in l["plugin_modules"]}) or ["none"]
        calls = record.calls
        calls_text = (f"{calls['sdpa_attention_forward']} / {calls['windowed_softmax']} / {calls['mechanism']}"
                      if calls else "not run")
        out.append(f"| {name} | {', '.join(modes['full_attention']) or '–'} | "
                   f"{', '.join(modes['sliding_attention']) or '–'} | {', '.join(modules)} | {calls_text} |")
    return "\n".join(out) + "\n"


def notes(records: dict[str, ContenderRecord], sanity: str | None) -> str:
    out = []
    if sanity:
        out.append(f"- {sanity}")
    for name, record in records.items():
        for length, reason in record.reasons.items():
            out.append(f"- {name} T={length}: {record.points[length]} ({reason})")
    return ("## Notes\n\n" + "\n".join(out) + "\n") if out else ""


def plot(records: dict[str, ContenderRecord], lengths: list[int], path: Path, title: str) -> None:
    """Two log-log panels: time vs T and peak memory vs T, one line per contender."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for ax, attr, scale, unit in ((axes[0], "seconds", 1.0, "s per forward"), (axes[1], "peak_bytes", 2**-20, "MiB peak")):
        for name in records:
            xs = [t for t in lengths if _point(records, name, t)]
            if xs:
                ax.plot(xs, [getattr(_point(records, name, t), attr) * scale for t in xs], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    axes[0].set_title("time per forward")
    axes[1].set_title("peak memory")
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def _int_list(text: str) -> list[int]:
    return sorted({int(part) for part in text.split(",") if part.strip()})


def _contender_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown contenders {unknown}; choose from {', '.join(BY_NAME)}")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=_int_list, default=list(LENGTHS), help="comma-separated T (default 4096..131072)")
    parser.add_argument("--contenders", type=_contender_list, default=list(BY_NAME),
                        help=f"comma-separated subset of {', '.join(BY_NAME)}")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT_S, help="skip a point predicted above this (s)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results directory (default benchmarks/results)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: every core)")
    parser.add_argument("--layers", type=int, default=22, help="encoder layers (ModernBERT-base: 22)")
    parser.add_argument("--hidden-size", type=int, default=768, help="(tests) hidden size")
    parser.add_argument("--heads", type=int, default=12, help="(tests) attention heads")
    parser.add_argument("--intermediate-size", type=int, default=1152, help="(tests) FFN size")
    return parser.parse_args(argv)


def sanity_line(warmups: dict[str, torch.Tensor], smallest: int) -> str | None:
    """sdpa_global and sdpa_stock have the same weights (seed 0, no plugin module): same output."""
    if BASELINE not in warmups or "sdpa_stock" not in warmups:
        return None
    diff = (warmups[BASELINE] - warmups["sdpa_stock"]).abs().max().item()
    return (f"Same computation check: at T={smallest}, max |{BASELINE} output − sdpa_stock output| = {diff:.2e} "
            "(same seed, same weights; the plugin's softmax path against transformers' own).")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    command = shlex.join(["python", "benchmarks/bench_long_context.py", *(sys.argv[1:] if argv is None else argv)])
    environment = (
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
        f"({torch.get_num_threads()} torch thread{'s' if torch.get_num_threads() > 1 else ''}), "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM, "
        f"Python {platform.python_version()}; {source_state()}"
    )
    load_start = os.getloadavg()[0]
    print(f"`{command}` — {environment}; load average {load_start:.1f}", flush=True)
    lengths = args.lengths
    inputs = {t: torch.randint(0, VOCAB_SIZE, (1, t), generator=torch.Generator().manual_seed(t)) for t in lengths}
    started = time.perf_counter()
    records: dict[str, ContenderRecord] = {}
    warmups: dict[str, torch.Tensor] = {}
    for name in args.contenders:
        print(f"\n# {name}", flush=True)
        records[name] = run_contender(BY_NAME[name], args, inputs, warmups)
    total = time.perf_counter() - started
    load_end = os.getloadavg()[0]
    sanity = sanity_line(warmups, lengths[0])
    shape = (f"{args.layers} layers ({sum(t == 'full_attention' for t in encoder_config(args, 1).layer_types)} global, "
             f"window 128 on the others), hidden {args.hidden_size}, {args.heads} heads, FFN {args.intermediate_size}, "
             f"vocab {VOCAB_SIZE}")
    bar_list = bars(records)
    report = "\n".join([
        "# Long-context encoder benchmark (CPU inference)",
        "",
        f"`{command}` — {environment}. Total {total:.0f} s; 1-min load average {load_start:.1f} at the start, "
        f"{load_end:.1f} at the end (above the core count, other processes shared the cores and times are inflated). "
        f"Encoder: ModernBERT architecture, random weights, {shape}; float32, batch 1, one forward under "
        "torch.inference_mode(), all-ones attention mask. Method: see the script's docstring (one warm-up at the "
        "smallest T; peak memory = kernel VmHWM growth, reset before every run).",
        "",
        "## Bars",
        "",
        "| bar | measured | required | verdict |",
        "|---|---:|---:|---|",
        *[b.row() for b in bar_list],
        "",
        tables(records, lengths),
        layers_section(records),
        notes(records, sanity),
    ])
    print("\n" + report)
    (args.output / f"{STEM}.md").write_text(report)
    raw = {
        "command": command, "environment": environment, "total_seconds": total,
        "load_average": {"start": load_start, "end": load_end}, "encoder": shape, "lengths": lengths,
        "contenders": {
            name: {"layers": r.layers, "calls": r.calls, "expected_calls": r.expected_calls,
                   "build_seconds": r.build_seconds, "time_exp": BY_NAME[name].time_exp,
                   "memory_exp": BY_NAME[name].memory_exp}
            for name, r in records.items()
        },
        "points": [
            {"contender": name, "T": t, **(asdict(p) if isinstance(p, Point) else {"status": p, "reason": r.reasons[t]})}
            for name, r in records.items() for t, p in r.points.items()
        ],
        "bars": [{"bar": b.description, "value": b.value, "threshold": b.threshold,
                  "at_least": b.at_least, "verdict": b.verdict} for b in bar_list],
        "sanity": sanity,
    }
    (args.output / f"{STEM}.json").write_text(json.dumps(raw, indent=1) + "\n")
    plot(records, lengths, args.output / f"{STEM}.png",
         f"ModernBERT encoder, {args.layers} layers, hidden {args.hidden_size}: CPU inference, float32, batch 1")
    print(f"wrote {args.output}/{STEM}.md, {STEM}.json and {STEM}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
