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
   ``sliced_relu_global_window``: the same with ``local_window=64``: each global layer's heads also attend
   with softmax to the keys within 64 tokens, combined with the sliced term by the default ``window_combine``
   (issue #24).
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

Time (``benchmarks/_harness.py``): ``time.perf_counter()`` around one forward. One warm-up forward
per contender, at the smallest length only (a 128k forward takes minutes: no warm-up at long
lengths); then the median of 3 runs for T < 16384, a single run from T = 16384 on. Each model is built once per contender
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

Results: the tables are printed and written to ``<output>/long_context.md`` (command, commit, date,
versions, CPU, threads, total time, load average at the start and end; bars; time and peak memory
per T and contender; time ratios against sliced_relu_global; what each contender's layers ran), the
raw numbers and the same environment to ``long_context.json`` and a log-log plot (time vs T, peak memory vs T) to
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
import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402
from transformers import AutoModel, ModernBertConfig  # noqa: E402

import hf_sliced_attn  # noqa: E402
import hf_sliced_attn.attention as plugin_attention  # noqa: E402
from benchmarks._harness import (  # noqa: E402
    RESULTS,
    Bar,
    Budget,
    CheckFailed,
    Growth,
    Panel,
    Point,
    Run,
    Series,
    attempt,
    bars_table,
    choice_list,
    fmt_bytes,
    fmt_ratio,
    fmt_time,
    int_list,
    measure_point,
    plot_loglog,
    point_ratio,
    timed,
    write_results,
)
from hf_sliced_attn.attention import LAYER_MODE_ATTR, SOFTMAX, observe_attention  # noqa: E402

LENGTHS = (4096, 16384, 32768, 65536, 131072)
SINGLE_RUN_FROM = 16384
"""From this T on, one timed run; below it the median of ``REPS``."""
REPS = 3
MEMORY_FRACTION = 0.8
TIME_LIMIT_S = 1800.0
STEM = "long_context"
VOCAB_SIZE = 50368
SUBJECT, BASELINE = "sliced_relu_global", "sdpa_global"
WINDOWED = "sliced_relu_global_window"
"""The global layers with a local softmax window of ``WINDOW`` beside sliced ReLU (issue #24's bars)."""
WINDOW = 64


@dataclass(frozen=True)
class Contender:
    """An encoder variant. ``mechanism`` None is stock transformers with ``attn_implementation="sdpa"``;
    ``growth`` predicts the next point for skipping."""

    name: str
    mechanism: str | None
    options: dict[str, Any]
    growth: Growth
    global_mode: str | None  # the expected hf_sliced_attn_mode of the global / local layers (None: no mark)
    local_mode: str | None


N_LOG_N = Growth(time=1.1, memory=1.0)
QUADRATIC_TIME = Growth(time=2.0, memory=1.0)
CONTENDERS = [
    Contender("sliced_relu_global", "sliced_relu", {}, N_LOG_N, "sliced_relu", SOFTMAX),
    Contender(WINDOWED, "sliced_relu", {"local_window": WINDOW}, N_LOG_N, "sliced_relu", SOFTMAX),
    Contender("rela_global", "rela", {}, QUADRATIC_TIME, "rela", SOFTMAX),
    Contender("sliced_relu_all", "sliced_relu", {"layers": "all"}, N_LOG_N, "sliced_relu", "sliced_relu"),
    Contender("sdpa_global", "sliced_relu", {"layers": []}, QUADRATIC_TIME, SOFTMAX, SOFTMAX),
    Contender("sdpa_stock", None, {}, Growth(time=2.0, memory=2.0), None, None),
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

    def counting(name: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
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
    """One inference forward on ``input_ids`` (1, T) with an all-ones mask; the last hidden state."""
    with torch.inference_mode():
        return model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).last_hidden_state


@dataclass
class ContenderRecord:
    """What one contender's model was and did: its layers, the calls counted in the warm-up, its points."""

    layers: list[dict[str, Any]] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    expected_calls: dict[str, int] = field(default_factory=dict)
    build_seconds: float = 0.0
    series: Series = field(default_factory=Series)


def warm_up(contender: Contender, record: ContenderRecord, model: torch.nn.Module, input_ids: torch.Tensor
            ) -> torch.Tensor:
    """The one warm-up forward, its attention calls counted and checked; returns its output."""
    with count_attention_calls() as calls:
        output = forward(model, input_ids)
    record.calls = dict(calls)
    if record.calls != record.expected_calls:
        raise CheckFailed(f"{contender.name}: attention calls {record.calls}, expected {record.expected_calls}")
    return output


def run_contender(contender: Contender, args: argparse.Namespace, inputs: dict[int, torch.Tensor],
                  warmups: dict[str, torch.Tensor]) -> ContenderRecord:
    """Build the model once, check its layers, warm up at the smallest T, then measure every T."""
    record = ContenderRecord()
    model, record.build_seconds = timed(lambda: build_model(contender, args, max(inputs)))
    record.layers = describe_layers(model)
    check_layers(contender, record.layers)
    record.expected_calls = expected_calls(contender, record.layers)
    budget = Budget(seconds=args.time_limit, memory_fraction=MEMORY_FRACTION)

    def measure(length: int) -> Point:
        if length == min(inputs):
            warmups[contender.name] = warm_up(contender, record, model, inputs[length])
        return measure_point(lambda: forward(model, inputs[length]), 1 if length >= SINGLE_RUN_FROM else REPS,
                             warm_up=False)

    for length in sorted(inputs):
        attempt(record.series, length, functools.partial(measure, length), contender.growth, budget,
                f"{contender.name:20s}")
    return record  # the model is freed here, and its memory handed back by the next run's reset_peak


def run_all(args: argparse.Namespace) -> tuple[dict[str, ContenderRecord], dict[str, torch.Tensor]]:
    """Every contender on the same inputs (seeded by T); their records and warm-up outputs."""
    inputs = {t: torch.randint(0, VOCAB_SIZE, (1, t), generator=torch.Generator().manual_seed(t))
              for t in args.lengths}
    records: dict[str, ContenderRecord] = {}
    warmups: dict[str, torch.Tensor] = {}
    for name in args.contenders:
        print(f"\n# {name}", flush=True)
        records[name] = run_contender(BY_NAME[name], args, inputs, warmups)
    return records, warmups


# --------------------------------------------------------------------------- reporting


def _point(records: dict[str, ContenderRecord], name: str, length: int) -> Point | None:
    """The contender's measured point at ``length``; None where it was not run or not measured."""
    return records[name].series.get(length) if name in records else None


def bars(records: dict[str, ContenderRecord]) -> list[Bar]:
    """The acceptance bars, for sliced_relu_global and its windowed variant: linear memory to 128k, and the 64k
    end-to-end speed-up over sdpa_global."""
    return [bar for subject in (SUBJECT, WINDOWED) for bar in (
        Bar(f"{subject} peak memory: peak(131072) / peak(32768) (linear = 4)",
            point_ratio(_point(records, subject, 131072), _point(records, subject, 32768), "peak_bytes"), 4.6, False),
        Bar(f"T=65536, end to end: {BASELINE} time / {subject} time",
            point_ratio(_point(records, BASELINE, 65536), _point(records, subject, 65536)), 4, True),
    )]


def tables(records: dict[str, ContenderRecord], lengths: list[int]) -> str:
    """Markdown: time and peak memory per T and contender, then time ratios against ``SUBJECT``."""
    names = list(records)
    head = "| T | " + " | ".join(names) + " |\n|---:|" + "---:|" * len(names)
    out = []
    for title, formatter in (
            ("Time per forward (median of 3 below T=16384, one run from 16384)", lambda p: fmt_time(p.seconds)),
            ("Peak memory (resident-set growth over the weights and inputs)", lambda p: fmt_bytes(p.peak_bytes))):
        rows = [f"| {t} | " + " | ".join(records[n].series.cell(t, formatter) for n in names) + " |" for t in lengths]
        out += [f"## {title}", "", head, *rows, ""]
    others = list(dict.fromkeys(n for n in (BASELINE, *names) if n in records and n != SUBJECT))
    if SUBJECT in records and others:
        out += [f"## Time ratios: other's time / {SUBJECT}'s time", "",
                "| T | " + " | ".join(f"{o} / {SUBJECT}" for o in others) + " |", "|---:|" + "---:|" * len(others)]
        for t in lengths:
            ratios = [fmt_ratio(point_ratio(_point(records, o, t), _point(records, SUBJECT, t))) for o in others]
            out.append(f"| {t} | " + " | ".join(ratios) + " |")
        out.append("")
    return "\n".join(out)


def layers_section(records: dict[str, ContenderRecord]) -> str:
    """Markdown: what each contender's global and local layers ran, and the calls counted in its warm-up."""
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
    """Markdown: the same-computation check and why each point without a time has none."""
    out = [f"- {sanity}"] if sanity else []
    for name, record in records.items():
        for length, reason in record.series.reasons.items():
            out.append(f"- {name} T={length}: {record.series.points[length]} ({reason})")
    return ("## Notes\n\n" + "\n".join(out) + "\n") if out else ""


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int_list, default=list(LENGTHS), help="comma-separated T (default 4096..131072)")
    parser.add_argument("--contenders", type=choice_list(BY_NAME), default=list(BY_NAME),
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


def encoder_shape(args: argparse.Namespace) -> str:
    """The encoder's shape in words."""
    global_layers = sum(t == "full_attention" for t in encoder_config(args, 1).layer_types)
    return (f"{args.layers} layers ({global_layers} global, window 128 on the others), hidden {args.hidden_size}, "
            f"{args.heads} heads, FFN {args.intermediate_size}, vocab {VOCAB_SIZE}")


def report(run: Run, args: argparse.Namespace, records: dict[str, ContenderRecord], sanity: str | None) -> str:
    """The markdown results file."""
    return "\n".join([
        "# Long-context encoder benchmark (CPU inference)",
        "",
        f"{run.header()} Encoder: ModernBERT architecture, random weights, {encoder_shape(args)}; float32, batch 1, "
        "one forward under torch.inference_mode(), all-ones attention mask. Method: see the script's docstring (one "
        "warm-up at the smallest T; peak memory = kernel VmHWM growth, reset before every run).",
        "",
        bars_table(bars(records)),
        tables(records, args.lengths),
        layers_section(records),
        notes(records, sanity),
    ])


def raw_results(run: Run, args: argparse.Namespace, records: dict[str, ContenderRecord], sanity: str | None
                ) -> dict[str, object]:
    """What the JSON file holds: the environment, each contender's model, every point, the bars."""
    return {
        "environment": run.record(), "encoder": encoder_shape(args), "lengths": args.lengths,
        "contenders": {
            name: {"layers": r.layers, "calls": r.calls, "expected_calls": r.expected_calls,
                   "build_seconds": r.build_seconds, "growth": asdict(BY_NAME[name].growth)}
            for name, r in records.items()
        },
        "points": [{"contender": name, **point} for name, r in records.items() for point in r.series.records()],
        "bars": [bar.record() for bar in bars(records)],
        "sanity": sanity,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    run = Run(Path(__file__).name, argv)
    records, warmups = run_all(args)
    run.finish()
    sanity = sanity_line(warmups, args.lengths[0])
    markdown = report(run, args, records, sanity)
    print("\n" + markdown)
    write_results(args.output, STEM, markdown, raw_results(run, args, records, sanity))
    time_panel = Panel("time per forward", "s per forward", "seconds", {n: r.series for n, r in records.items()})
    memory_panel = Panel("peak memory", "MiB peak", "peak_bytes", {n: r.series for n, r in records.items()})
    plot_loglog(args.output / f"{STEM}.png", f"ModernBERT encoder, {args.layers} layers, hidden {args.hidden_size}: "
                "CPU inference, float32, batch 1", [time_panel, memory_panel])
    return 0


if __name__ == "__main__":
    sys.exit(main())
