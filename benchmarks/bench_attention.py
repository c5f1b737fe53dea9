"""CPU benchmark of sliced ReLU attention (both kernels) and ReLA against softmax attention.

Run ``python benchmarks/bench_attention.py`` (full: about 20-25 min on 2 otherwise idle
cores, much longer when other jobs share them) or ``--quick`` (a small subset, about a minute). Every contender of a group is measured in the same run, on the same
inputs: CPU, float32, B = 1, H = 12 heads, D = 64, ``torch.set_num_threads(os.cpu_count())``.

Groups (all contenders map q, k, v (1, 12, T, 64) to (1, 12, T, 64)):

1. ``sliced_relu`` (this package's op, O(T log T); on CPU its C++ sweep kernel) against
   ``sdpa`` (``F.scaled_dot_product_attention``), ``eager`` (transformers' eager softmax:
   softmax(Q K^T / sqrt(D)) V as matmul / softmax / matmul) and ``authors`` (a port of the
   algorithm of github.com/SiwanB/Sliced_ReLU_Attention, see :func:`authors_sliced_relu`),
   T = 256 ... 65536, and ``sliced_relu_bump`` (this package's bump-kernel op,
   O(T log T) with a hand-written backward; fixed bandwidth b = ln 2 per head, the
   authors' initial softplus(0)). The sliced contenders project q and k on one fixed
   direction per head, s = <w_h, q_i>, t = <w_h, k_j>, inside the timed region.
   ``floor`` (fwd only, see :func:`floor`) is the least work any algorithm of this kind
   does: the same projections, a sort of the keys, one read of v and one write of the output.
2. ``rela`` (this package's blocked op, ReLU(Q K^T / sqrt(D)) V) against ``sdpa`` and
   ``eager``, T = 128 ... 16384 (their softmax points are shared with group 1).
3. A RoBERTa encoder (hidden 768, 12 heads, 2 layers, FFN 3072, dropout 0) built with
   ``attn_implementation`` sliced_relu / rela / sdpa / eager, on input_ids (1, T), and
   ``sliced_relu_converted``: sliced_relu with the options conversions use (4 slices, the
   MLP projection, the learned gain and mean value).

Modes: ``fwd`` is the forward pass under ``torch.no_grad()``; ``fwd+bwd`` is the forward
pass with autograd plus ``out.backward(g)`` for a fixed random g (inputs q, k, v, or the
encoder's parameters, require grad; their ``.grad`` is reset before every run). ``floor`` is
measured in ``fwd`` only (its fwd+bwd cells read "–").

Timing: one warm-up run, then the median of r timed runs (``time.perf_counter``), r = 7,
5, 3 or 2 for runs under 0.1 s, 1 s, 15 s or longer. A point is skipped (and printed as
"skipped") when its extrapolation from the contender's previous point, time ~ T^a and
memory ~ T^b with a, b the contender's complexity exponents, predicts more than
``TIME_LIMIT_S`` per run or more than ``MEMORY_FRACTION`` of the currently available RAM;
larger T are then skipped too.

Peak memory: the kernel's own high-water mark of the process's resident set. Before each
timed run, Python garbage is collected, ``malloc_trim(0)`` hands freed heap pages back to
the kernel, and ``5`` is written to ``/proc/self/clear_refs``, which resets ``VmHWM`` to
the current ``VmRSS``; after the run the growth ``VmHWM - VmRSS_before`` is exactly the
largest extra resident memory at any instant of the run (the kernel updates the mark on
every page fault, so no sampling interval can miss a short peak). The inputs (and g)
exist before the baseline and are not counted; outputs, saved activations, temporaries
and the input gradients are. The reported value is the largest over the timed runs.
Torch's CPU allocator does not cache blocks, so freed tensors leave the RSS and the
measurement sees each run's true footprint.

Results: the tables are printed and written to ``<output>/attention.md`` (with the raw
numbers in ``attention.json``) next to ``*_time.png`` (time vs T, log-log) and
``*_memory.png`` (peak memory vs T, log-log); ``<output>`` is ``benchmarks/results``, or
``benchmarks/results/quick`` with ``--quick``. A "bars" summary checks the acceptance bars.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import psutil  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import AutoModel, RobertaConfig  # noqa: E402

import hf_sliced_attn  # noqa: E402
from benchmarks._report import Bar, fmt_bytes, fmt_time, reset_peak, source_state, status_kib  # noqa: E402
from hf_sliced_attn.ops import rela, sliced_relu, sliced_relu_bump  # noqa: E402
from hf_sliced_attn.ops.naive import (  # noqa: E402
    rela_reference,
    sliced_relu_bump_reference,
    sliced_relu_reference,
)

HEADS, HEAD_DIM = 12, 64
TIME_LIMIT_S = 90.0
MEMORY_FRACTION = 0.75
MODES = ("fwd", "fwd+bwd")
RESULTS = Path(__file__).resolve().parent / "results"

Forward = Callable[[], torch.Tensor]
Builder = Callable[[int], tuple[Forward, list[torch.Tensor]]]
"""T -> (forward closure over freshly allocated inputs, the tensors whose .grad to reset)."""


# --------------------------------------------------------------------------- contenders


def authors_sliced_relu(query_scalars: torch.Tensor, key_scalars: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Sliced ReLU attention by the authors' algorithm (SiwanB/Sliced_ReLU_Attention), autograd through it.

    Kernel as this package's op (no padding): out_i = sum_j ReLU(s_i - t_j) u_j / sum_l |s_i - t_l|
    with u = v - mean(v). The algorithm sorts keys and queries together:

        z = [t; s] (2T),  order = argsort(z),  inverse = argsort(order)
        U = [u; 0] (2T, D) gathered in sorted order (queries carry zero value)
        N_sorted[c] = z_c * cumsum(U)[c] - cumsum(z U)[c]  = sum_{e <= c} (z_c - z_e) U_e
        numerator = N_sorted[inverse][T:]  (the query rows)

    and the denominator the same way with weights 1 on keys and 0 on queries, using
    |r| = 2 ReLU(r) - r: den = 2 R - (s * T - sum_j t_j), R the ReLU sums; den is clamped
    at 1e-4 as in the authors' code. Every step is D-wide over 2T rows (the gathers and
    two cumsums of (B, H, 2T, D)), which is what this contender measures. Shapes:
    query_scalars, key_scalars (B, H, T); value (B, H, T, D) -> (B, H, T, D).
    """
    length, dim = value.shape[-2:]
    z = torch.cat((key_scalars, query_scalars), dim=-1)  # (B, H, 2T)
    z_sorted, order = torch.sort(z, dim=-1)
    inverse = torch.argsort(order, dim=-1)
    u = torch.cat((value - value.mean(-2, keepdim=True), torch.zeros_like(value)), dim=-2)  # (B, H, 2T, D)
    u_sorted = torch.gather(u, -2, order.unsqueeze(-1).expand(-1, -1, -1, dim))
    z_col = z_sorted.unsqueeze(-1)
    numerator_sorted = z_col * torch.cumsum(u_sorted, -2) - torch.cumsum(u_sorted * z_col, -2)
    numerator = torch.gather(numerator_sorted, -2, inverse.unsqueeze(-1).expand(-1, -1, -1, dim))[..., length:, :]
    is_key = torch.cat((torch.ones_like(key_scalars), torch.zeros_like(query_scalars)), dim=-1)
    ones_sorted = torch.gather(is_key, -1, order)
    relu_sorted = z_sorted * torch.cumsum(ones_sorted, -1) - torch.cumsum(ones_sorted * z_sorted, -1)
    abs_sorted = 2 * relu_sorted - (z_sorted * length - key_scalars.sum(-1, keepdim=True))
    denominator = torch.gather(abs_sorted, -1, inverse)[..., length:].clamp_min(1e-4)
    return numerator / denominator.unsqueeze(-1)


def floor(query_scalars: torch.Tensor, key_scalars: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The floor: the work every sliced attention forward must do, and nothing else.

    Called, like the sliced contenders, on s = <w_h, q_i> and t = <w_h, k_j> computed inside
    the timed region by :func:`_sliced_builder` (the same fixed directions ``_DIRECTIONS``), so
    a timed run of this contender contains exactly:

    1. one read of q and one of k: the two projections to scalars (B, H, T), one
       (T, D) x (D,) product per head each;
    2. ``torch.sort(t, dim=-1)``: sorting each head's T key scalars (values and indices);
    3. ``value.clone()``: one read of v and one write of an output (B, H, T, D).

    ``query_scalars`` is only read by the caller's projection; it and the sort's result are
    not used further (eager torch runs every op regardless). Why it is a lower bound for the
    algorithms of this kind (sliced_relu and its bump kernel, the authors' algorithm: sort the
    projected keys, then prefix sums over them): each of them projects q and k to the same
    scalars (step 1, shared code), sorts the keys or a superset of them (the authors sort keys
    and queries together), so at least step 2, and must read all of v and write the whole
    output (B, H, T, D), each at least once (every output row depends on every v_j), so at
    least step 3, whose clone is the cheapest such pass (a memory copy). Everything else they
    do (placing the queries among the sorted keys, the prefix sums of v in sorted order, the
    gathers, the normalisation) is left out, so none of them can be faster than the floor, and
    their time / the floor's time measures that extra work.
    Shapes: query_scalars, key_scalars (B, H, T); value (B, H, T, D) -> (B, H, T, D).
    """
    torch.sort(key_scalars, dim=-1)
    return value.clone()


def eager_softmax(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """transformers' eager attention: softmax(Q K^T * D^-1/2) V, materialising (T, T) per head."""
    weights = torch.matmul(query, key.transpose(-1, -2)) * query.shape[-1] ** -0.5
    return torch.matmul(torch.softmax(weights, dim=-1), value)


def _qkv(length: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(length)
    return [torch.randn(1, HEADS, length, HEAD_DIM, generator=gen).requires_grad_() for _ in range(3)]


_DIRECTIONS = torch.nn.functional.normalize(torch.randn(HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(0)), dim=-1)


_BANDWIDTH = torch.full((HEADS,), math.log(2.0))


def bump(query_scalars: torch.Tensor, key_scalars: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """This package's sliced_relu_bump at the fixed bandwidth ``_BANDWIDTH`` (H,)."""
    return sliced_relu_bump(query_scalars, key_scalars, value, _BANDWIDTH.to(value.dtype))


def _sliced_builder(op: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> Builder:
    def build(length: int) -> tuple[Forward, list[torch.Tensor]]:
        q, k, v = _qkv(length)

        def forward() -> torch.Tensor:
            s = torch.einsum("bhtd,hd->bht", q, _DIRECTIONS)
            t = torch.einsum("bhtd,hd->bht", k, _DIRECTIONS)
            return op(s, t, v)

        return forward, [q, k, v]

    return build


def _qkv_builder(op: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> Builder:
    def build(length: int) -> tuple[Forward, list[torch.Tensor]]:
        q, k, v = _qkv(length)
        return (lambda: op(q, k, v)), [q, k, v]

    return build


def _encoder_builder(implementation: str, **options: Any) -> Builder:
    """An encoder with ``attn_implementation``; ``options`` go to ``hf_sliced_attn.prepare_config``."""

    def build(length: int) -> tuple[Forward, list[torch.Tensor]]:
        torch.manual_seed(0)
        config = RobertaConfig(
            hidden_size=768, num_attention_heads=HEADS, num_hidden_layers=2, intermediate_size=3072,
            vocab_size=1000, max_position_embeddings=length + 2, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        if implementation in hf_sliced_attn.MECHANISMS:
            config = hf_sliced_attn.prepare_config(config, implementation, **options)
            model = AutoModel.from_config(config, add_pooling_layer=False)
        else:
            model = AutoModel.from_config(config, attn_implementation=implementation, add_pooling_layer=False)
        model.train()
        input_ids = torch.randint(3, 1000, (1, length), generator=torch.Generator().manual_seed(length))
        mask = torch.ones_like(input_ids)
        return (lambda: model(input_ids=input_ids, attention_mask=mask).last_hidden_state), list(model.parameters())

    return build


@dataclass(frozen=True)
class Contender:
    """A contender, its complexity exponents (time ~ T^time_exp, memory ~ T^memory_exp) for skipping,
    and the modes it is measured in."""

    name: str
    build: Builder
    time_exp: float
    memory_exp: float
    modes: tuple[str, ...] = MODES


SLICED_GROUP = [
    Contender("sliced_relu", _sliced_builder(sliced_relu), 1.1, 1.0),
    Contender("authors", _sliced_builder(authors_sliced_relu), 1.1, 1.0),
    Contender("sdpa", _qkv_builder(F.scaled_dot_product_attention), 2.0, 1.0),
    Contender("eager", _qkv_builder(eager_softmax), 2.0, 2.0),
    Contender("sliced_relu_bump", _sliced_builder(bump), 1.1, 1.0),
    Contender("floor", _sliced_builder(floor), 1.1, 1.0, modes=("fwd",)),
]
RELA_GROUP = [
    Contender("rela", _qkv_builder(rela), 2.0, 1.0),
    SLICED_GROUP[2],
    SLICED_GROUP[3],
]
ENCODER_GROUP = [
    Contender(f"encoder/{name}", _encoder_builder(name), exp, mem)
    for name, exp, mem in (("sliced_relu", 1.1, 1.0), ("rela", 2.0, 1.0), ("sdpa", 2.0, 1.0), ("eager", 2.0, 2.0))
]
# What `hf-sliced-attn convert` builds (README, "Conversion fidelity"): 4 slices, MLP projection, affine output.
ENCODER_GROUP.append(Contender("encoder/sliced_relu_converted", _encoder_builder(
    "sliced_relu", num_slices=4, projection="mlp", affine_output=True), 1.1, 1.0))


# --------------------------------------------------------------------------- measuring

@dataclass
class Point:
    """One measurement: median seconds per run and peak resident-memory growth in bytes."""

    seconds: float
    peak_bytes: int
    reps: int


class Bench:
    """Runs and remembers the measurements, keyed by (contender, mode, T).

    A key maps to its Point, or to "skipped" / "error" when it was not measured.
    """

    def __init__(self, max_reps: int) -> None:
        self.max_reps = max_reps
        self.points: dict[tuple[str, str, int], Point | str] = {}

    def get(self, name: str, mode: str, length: int) -> Point | None:
        point = self.points.get((name, mode, length))
        return point if isinstance(point, Point) else None

    def cell(self, name: str, mode: str, length: int, formatter: Callable[[Point], str]) -> str:
        point = self.points.get((name, mode, length), "–")
        return formatter(point) if isinstance(point, Point) else point

    def _previous(self, name: str, mode: str, length: int) -> tuple[int, Point | str] | None:
        tried = [(t, p) for (n, m, t), p in self.points.items() if n == name and m == mode and t < length]
        return max(tried, key=lambda item: item[0]) if tried else None

    def measure(self, contender: Contender, mode: str, length: int) -> Point | None:
        key = (contender.name, mode, length)
        if key in self.points:
            return self.points[key]
        previous = self._previous(contender.name, mode, length)
        reason = None
        if previous is not None and previous[1] == "skipped":
            reason = "a smaller T was skipped"
        elif previous is not None and isinstance(previous[1], Point):
            ratio = length / previous[0]
            seconds = previous[1].seconds * ratio**contender.time_exp
            memory = previous[1].peak_bytes * ratio**contender.memory_exp
            available = psutil.virtual_memory().available
            if seconds > TIME_LIMIT_S:
                reason = f"predicted {seconds:.0f} s per run > {TIME_LIMIT_S:.0f} s"
            elif memory > MEMORY_FRACTION * available:
                reason = f"predicted {memory / 2**30:.1f} GiB > {MEMORY_FRACTION:.0%} of {available / 2**30:.1f} GiB free"
        if reason is not None:
            print(f"  {contender.name:22s} {mode:8s} T={length:6d}  skipped ({reason})", flush=True)
            self.points[key] = "skipped"
            return None
        try:
            point = self._run(contender, mode, length)
        except Exception as error:  # noqa: BLE001  (a failing contender must not stop the others)
            print(f"  {contender.name:22s} {mode:8s} T={length:6d}  error: {type(error).__name__}: {error}", flush=True)
            self.points[key] = "error"
            return None
        self.points[key] = point
        print(f"  {contender.name:22s} {mode:8s} T={length:6d}  {fmt_time(point.seconds):>9s}  "
              f"peak +{fmt_bytes(point.peak_bytes):>9s}  ({point.reps} reps)", flush=True)
        return point

    def _run(self, contender: Contender, mode: str, length: int) -> Point:
        forward, leaves = contender.build(length)
        grad: list[torch.Tensor] = []

        def once() -> None:
            for leaf in leaves:
                leaf.grad = None
            if mode == "fwd":
                with torch.no_grad():
                    forward()
                return
            out = forward()
            if not grad:
                grad.append(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
            out.backward(grad[0])

        def timed() -> tuple[float, int]:
            for leaf in leaves:
                leaf.grad = None
            baseline = reset_peak()
            start = time.perf_counter()
            once()
            seconds = time.perf_counter() - start
            return seconds, max(0, status_kib("VmHWM") * 1024 - baseline)

        once()  # warm-up (and g allocated before any baseline)
        first = timed()
        reps = 2 if first[0] >= 15 else 3 if first[0] >= 1 else 5 if first[0] >= 0.1 else 7
        runs = [first] + [timed() for _ in range(min(reps, self.max_reps) - 1)]
        del forward, leaves, grad
        return Point(statistics.median(s for s, _ in runs), max(m for _, m in runs), len(runs))


# --------------------------------------------------------------------------- reporting


def fmt_ratio(num: Point | None, den: Point | None, attr: str = "seconds") -> str:
    if num is None or den is None or getattr(den, attr) == 0:
        return "–"
    return f"{getattr(num, attr) / getattr(den, attr):.2f}×"


def group_tables(bench: Bench, title: str, contenders: list[Contender], lengths: list[int]) -> str:
    """Markdown: per mode a time table with ratios against the group's first contender, then memory."""
    names = [c.name for c in contenders]
    labels = [n.split("/")[-1] for n in names]  # "encoder/sdpa" -> "sdpa"
    subject, others = labels[0], labels[1:]
    out = [f"## {title}", ""]
    for mode in MODES:
        out += [
            f"### {mode}: time per run (median) and speed-up of `{subject}` (other's time / {subject}'s time)",
            "",
            "| T | " + " | ".join(labels) + " | " + " | ".join(f"{o} / {subject}" for o in others) + " |",
            "|---:|" + "---:|" * (2 * len(names) - 1),
        ]
        for length in lengths:
            points = [bench.get(n, mode, length) for n in names]
            base = points[0]
            out.append(
                f"| {length} | " + " | ".join(bench.cell(n, mode, length, lambda p: fmt_time(p.seconds)) for n in names)
                + " | "
                + " | ".join(fmt_ratio(p, base) for p in points[1:]) + " |"
            )
        out.append("")
    out += [
        f"### Peak memory (resident-set growth over the inputs); ratio = {subject} / other",
        "",
        "| T | " + " | ".join(f"{n} {m}" for m in MODES for n in labels)
        + " | " + " | ".join(f"{subject} / {o} (fwd+bwd)" for o in others) + " |",
        "|---:|" + "---:|" * (len(names) * len(MODES) + len(others)),
    ]
    for length in lengths:
        cells = [bench.cell(n, m, length, lambda p: fmt_bytes(p.peak_bytes)) for m in MODES for n in names]
        base = bench.get(names[0], "fwd+bwd", length)
        ratios = [fmt_ratio(base, bench.get(o, "fwd+bwd", length), "peak_bytes") for o in names[1:]]
        out.append(f"| {length} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return "\n".join(out) + "\n"


def plot_group(bench: Bench, stem: str, title: str, contenders: list[Contender], lengths: list[int],
               output: Path) -> list[Path]:
    """Two log-log PNGs: time vs T and peak memory vs T, one panel per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for kind, attr, scale, unit in (("time", "seconds", 1.0, "s per run"), ("memory", "peak_bytes", 2**-20, "MiB peak")):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
        for ax, mode in zip(axes, MODES):
            for contender in contenders:
                xs = [t for t in lengths if bench.get(contender.name, mode, t)]
                ys = [getattr(bench.get(contender.name, mode, t), attr) * scale for t in xs]
                if xs:
                    ax.plot(xs, ys, marker="o", label=contender.name.split("/")[-1])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length T")
            ax.set_ylabel(unit)
            ax.set_title(mode)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.suptitle(f"{title}: {kind}")
        path = output / f"{stem}_{kind}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _ratio(num: Point | None, den: Point | None, attr: str = "seconds") -> float | None:
    if num is None or den is None or getattr(den, attr) == 0:
        return None
    return getattr(num, attr) / getattr(den, attr)


def bars(bench: Bench) -> list[Bar]:
    fb = "fwd+bwd"
    g = bench.get
    return [
        Bar("sliced_relu fwd+bwd T=16384: sdpa time / sliced_relu time",
            _ratio(g("sdpa", fb, 16384), g("sliced_relu", fb, 16384)), 20, True),
        Bar("sliced_relu fwd+bwd T=16384: authors' algorithm time / sliced_relu time",
            _ratio(g("authors", fb, 16384), g("sliced_relu", fb, 16384)), 3, True),
        Bar("sliced_relu fwd T=16384: sliced_relu time / floor time (sort keys, read q, k, v, write out)",
            _ratio(g("sliced_relu", "fwd", 16384), g("floor", "fwd", 16384)), 3, False),
        Bar("sliced_relu fwd+bwd: time(T=65536) / time(T=16384)",
            _ratio(g("sliced_relu", fb, 65536), g("sliced_relu", fb, 16384)), 4.6, False),
        Bar("sliced_relu fwd+bwd peak memory linear in T: peak(65536) / peak(16384) (linear = 4)",
            _ratio(g("sliced_relu", fb, 65536), g("sliced_relu", fb, 16384), "peak_bytes"), 4.6, False),
        Bar("sliced_relu_bump fwd+bwd T=16384: sdpa time / sliced_relu_bump time",
            _ratio(g("sdpa", fb, 16384), g("sliced_relu_bump", fb, 16384)), 20, True),
        Bar("sliced_relu_bump fwd+bwd peak memory linear in T: peak(65536) / peak(16384) (linear = 4)",
            _ratio(g("sliced_relu_bump", fb, 65536), g("sliced_relu_bump", fb, 16384), "peak_bytes"), 4.6, False),
        Bar("rela fwd+bwd T=512: speed relative to eager (eager time / rela time)",
            _ratio(g("eager", fb, 512), g("rela", fb, 512)), 0.9, True),
        Bar("rela fwd+bwd T=8192: peak memory rela / eager",
            _ratio(g("rela", fb, 8192), g("eager", fb, 8192), "peak_bytes"), 0.25, False),
    ]


def bars_table(items: list[Bar]) -> str:
    lines = ["## Bars", "", "| bar | measured | required | verdict |", "|---|---:|---:|---|"]
    return "\n".join(lines + [b.row() for b in items]) + "\n"


def memory_slope(bench: Bench, name: str, lengths: list[int]) -> str:
    """Log-log slope of fwd+bwd peak memory over the two largest measured T (1 = linear)."""
    measured = [(t, bench.get(name, "fwd+bwd", t)) for t in lengths if bench.get(name, "fwd+bwd", t)]
    if len(measured) < 2:
        return "n/a"
    (t0, p0), (t1, p1) = measured[-2:]
    return f"{math.log(p1.peak_bytes / p0.peak_bytes) / math.log(t1 / t0):.2f} (T={t0}→{t1})"


# --------------------------------------------------------------------------- main


def sanity_check() -> None:
    """The contenders compute what they claim, at T = 64, before anything is timed."""
    q, k, v = (x.detach().double() for x in _qkv(64))
    s, t = (torch.einsum("bhtd,hd->bht", x, _DIRECTIONS.double()) for x in (q, k))
    expected = sliced_relu_reference(s, t, v)
    torch.testing.assert_close(authors_sliced_relu(s, t, v), expected, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(sliced_relu(s.float(), t.float(), v.float()), expected.float(), rtol=1e-3, atol=1e-4)
    expected = sliced_relu_bump_reference(s, t, v, _BANDWIDTH)
    torch.testing.assert_close(bump(s.float(), t.float(), v.float()), expected.float(), rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(rela(q.float(), k.float(), v.float()), rela_reference(q, k, v).float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(eager_softmax(q, k, v), F.scaled_dot_product_attention(q, k, v))
    torch.testing.assert_close(floor(s, t, v), v)


def _selected_contenders(parser: argparse.ArgumentParser, text: str | None) -> set[str] | None:
    """The names given to --contenders (None: all), each checked against the contenders."""
    if text is None:
        return None
    known = [c.name for c in (*SLICED_GROUP, *RELA_GROUP, *ENCODER_GROUP)]
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = sorted(names - set(known))
    if unknown or not names:
        parser.error(f"--contenders: unknown {unknown or 'empty list'}; choose from {', '.join(dict.fromkeys(known))}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small subset (< 2 min)")
    parser.add_argument("--contenders", help=(
        "comma-separated contenders to measure (e.g. sliced_relu,floor); default: all. Results then go to "
        "benchmarks/results/selected unless --output is given"))
    parser.add_argument("--output", type=Path, help="results directory (default: benchmarks/results[/quick])")
    args = parser.parse_args(argv)
    selected = _selected_contenders(parser, args.contenders)
    default_output = RESULTS / "quick" if args.quick else RESULTS
    output = args.output or (default_output / "selected" if selected is not None else default_output)
    output.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(os.cpu_count())
    if args.quick:
        sliced_lengths, rela_lengths, encoder_lengths, max_reps = [256, 1024], [128, 512], [256], 3
    else:
        sliced_lengths = [2**p for p in range(8, 17)]
        rela_lengths = [2**p for p in range(7, 15)]
        encoder_lengths = [256, 1024, 4096]
        max_reps = 7
    environment = (
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
        f"({torch.get_num_threads()} torch threads), {psutil.virtual_memory().total / 2**30:.0f} GiB RAM, "
        f"Python {platform.python_version()}; B=1, H={HEADS}, D={HEAD_DIM}, float32; {source_state()}"
    )
    load_start = os.getloadavg()[0]
    print(environment, f"load average {load_start:.1f}", flush=True)
    sanity_check()
    print("sanity check: authors' port == float64 reference == sliced_relu op; sliced_relu_bump op == reference; "
          "rela op == reference; eager == sdpa; floor's output == v")

    bench = Bench(max_reps)
    started = time.perf_counter()
    groups = [
        ("sliced_relu", "sliced_relu and sliced_relu_bump vs softmax attention and the authors' algorithm",
         SLICED_GROUP, sliced_lengths),
        ("rela", "ReLA vs softmax attention", RELA_GROUP, rela_lengths),
        ("encoder", "RoBERTa encoder, 2 layers, hidden 768, 12 heads", ENCODER_GROUP, encoder_lengths),
    ]
    if selected is not None:
        groups = [(stem, title, [c for c in contenders if c.name in selected], lengths)
                  for stem, title, contenders, lengths in groups]
        groups = [group for group in groups if group[2]]
    for _, title, contenders, lengths in groups:
        print(f"\n# {title}", flush=True)
        for length in lengths:
            for mode in MODES:
                for contender in contenders:
                    if mode in contender.modes:
                        bench.measure(contender, mode, length)

    sections = [
        "# Attention benchmark (CPU)",
        "",
        f"`python benchmarks/bench_attention.py{' '.join(['', *(argv if argv is not None else sys.argv[1:])])}` — "
        f"{environment}. "
        f"Total {time.perf_counter() - started:.0f} s; 1-min load average {load_start:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end (a load above the core count means other processes shared the "
        "cores and times are inflated). Method: see the script's docstring (median of runs after a "
        "warm-up; peak memory = kernel VmHWM growth over the inputs, reset before every run).",
        "",
        bars_table(bars(bench)),
        f"sliced_relu fwd+bwd peak-memory log-log slope: {memory_slope(bench, 'sliced_relu', sliced_lengths)}; "
        f"sliced_relu_bump: {memory_slope(bench, 'sliced_relu_bump', sliced_lengths)}; "
        f"rela: {memory_slope(bench, 'rela', rela_lengths)}.",
        "",
    ]
    for stem, title, contenders, lengths in groups:
        sections.append(group_tables(bench, title, contenders, lengths))
        plot_group(bench, stem, title, contenders, lengths, output)
    report = "\n".join(sections)
    print("\n" + report)
    (output / "attention.md").write_text(report)
    raw = {
        "environment": environment,
        "points": [
            {"contender": n, "mode": m, "T": t, **(p.__dict__ if isinstance(p, Point) else {"status": p})}
            for (n, m, t), p in bench.points.items()
        ],
    }
    (output / "attention.json").write_text(json.dumps(raw, indent=1) + "\n")
    print(f"wrote {output}/attention.md, attention.json and *_time.png / *_memory.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
