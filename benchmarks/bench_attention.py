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
2. ``rela`` (this package's op, ReLU(Q K^T / sqrt(D)) V; on CPU its C++ tile kernel) against ``sdpa``
   and ``eager``, T = 128 ... 16384 (their softmax points are shared with group 1).
3. A RoBERTa encoder (hidden 768, 12 heads, 2 layers, FFN 3072, dropout 0) built with
   ``attn_implementation`` sliced_relu / rela / sdpa / eager, on input_ids (1, T), and
   ``sliced_relu_converted``: sliced_relu with the options conversions use (4 slices, the
   MLP projection, the learned gain and mean value).
4. ``sliced_relu_window64``: what a converted global layer with a local softmax window runs,
   ``sliced_relu(..., return_denominator=True)`` then ``local_window_attention`` with
   ``combine="shared"`` over the keys within ``WINDOW`` = 64 (on CPU the window's C++ kernel),
   against ``sliced_relu`` alone and ``sdpa``, T = 1024 ... 65536.
5. ``window_variants``: the same op with windows of 4, 16 and 64 tokens (``sliced_relu_window{4,16,64}``),
   and with the gate instead of the shared normaliser (``..._gate``, g = 1/2 per head), against ``sliced_relu``
   alone and ``sdpa``, T = 128, 512, 16384 and 65536: the time columns of the README's table of every-layer
   variants.
6. ``small/*``: issue #24's small shape, B = 32, T = 128, H = 12, D = 32, a window of 4: the same
   three contenders (``small/sliced_relu_window4``, ``small/sliced_relu``, ``small/sdpa``).

Modes: ``fwd`` is the forward pass under ``torch.no_grad()``; ``fwd+bwd`` is the forward
pass with autograd plus ``out.backward(g)`` for a fixed random g (inputs q, k, v, or the
encoder's parameters, require grad; their ``.grad`` is reset before every run). ``floor`` is
measured in ``fwd`` only (its fwd+bwd cells read "–").

Timing (``benchmarks/_harness.py``): one warm-up run, then the median of r timed runs
(``time.perf_counter``), r = 7, 5, 3 or 2 for runs under 0.1 s, 1 s, 15 s or longer. A point is
skipped (and recorded as "skipped", with the reason) when its extrapolation from the
contender's previous point, time ~ T^a and memory ~ T^b with a, b the contender's ``Growth``,
predicts more than ``BUDGET.seconds`` per run or more than ``BUDGET.memory_fraction`` of the
currently available RAM; larger T are then skipped too.

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

Results: the tables are printed and written to ``<output>/attention.md`` (opening with the
command, commit, versions, CPU, threads, date, total time and load; the raw numbers and the
same environment in ``attention.json``) next to ``*_time.png`` (time vs T, log-log) and
``*_memory.png`` (peak memory vs T, log-log); ``<output>`` is ``benchmarks/results``, or
``benchmarks/results/quick`` with ``--quick``. A "bars" summary checks the acceptance bars.

``--lengths T[,T...]`` measures every selected group at these T instead of its own: ``python
benchmarks/bench_attention.py --contenders rela,sdpa,eager --lengths 512,2048,8192 --output
benchmarks/results/rela_kernel`` is the ReLA kernel's check against SDPA and eager.

``--interleaved T[,T...]`` replaces the groups' T-by-T points with a side-by-side check, fwd+bwd
only: at each T the selected contenders (default ``sliced_relu``, ``sliced_relu_bump``, ``sdpa``)
take turns, one warm-up run each, then ``--rounds`` rounds of one timed run of each
(``_harness.interleaved``), so that a slow period of a shared machine slows them alike, then as
many rounds in the reverse order (a run right after a long softmax run is slower, so no contender
always follows the same one); each point is the median of its 2 × ``--rounds`` runs (no peak memory). The bars that these points measure and the
fwd+bwd time table go to ``<output>/attention.md`` and ``.json`` (``benchmarks/results/interleaved``
unless ``--output`` is given): ``python benchmarks/bench_attention.py --interleaved 16384
--output benchmarks/results/bump_kernel`` is the bump kernel's check against the ReLU kernel and SDPA.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import AutoModel, RobertaConfig  # noqa: E402

import hf_sliced_attn  # noqa: E402
from benchmarks._harness import (  # noqa: E402
    RESULTS,
    Bar,
    Budget,
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
    interleaved,
    measure_point,
    plot_loglog,
    point_ratio,
    write_results,
)
from hf_sliced_attn.ops import local_window_attention, rela, sliced_relu, sliced_relu_bump  # noqa: E402
from hf_sliced_attn.ops.naive import (  # noqa: E402
    rela_reference,
    sliced_relu_bump_reference,
    sliced_relu_reference,
)

HEADS, HEAD_DIM = 12, 64
BUDGET = Budget(seconds=90.0, memory_fraction=0.75)
MODES = ("fwd", "fwd+bwd")


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


def _qkv(length: int, batch: int = 1, dim: int = HEAD_DIM) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(length)
    return [torch.randn(batch, HEADS, length, dim, generator=gen).requires_grad_() for _ in range(3)]


def _directions(dim: int) -> torch.Tensor:
    """One fixed unit direction per head, (H, dim): the sliced contenders' projection."""
    return torch.nn.functional.normalize(torch.randn(HEADS, dim, generator=torch.Generator().manual_seed(0)), dim=-1)


_DIRECTIONS = _directions(HEAD_DIM)


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


def _qkv_builder(op: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor], batch: int = 1,
                 dim: int = HEAD_DIM) -> Builder:
    def build(length: int) -> tuple[Forward, list[torch.Tensor]]:
        q, k, v = _qkv(length, batch, dim)
        return (lambda: op(q, k, v)), [q, k, v]

    return build


def _window_builder(window: int | None, batch: int = 1, dim: int = HEAD_DIM, combine: str = "shared") -> Builder:
    """sliced_relu with its denominator, then (with a ``window``) local_window_attention over the keys within
    ``window``, combined by ``combine`` ("shared": gamma = 1 per head; "gate": g = 1/2, the modules' initial
    weights), as a converted global layer runs them; q, k and v (batch, H, T, dim), projected as in
    :func:`_sliced_builder`. Without a window, sliced_relu alone."""
    directions = _directions(dim)
    mix = torch.full((HEADS,), 1.0 if combine == "shared" else 0.5)

    def build(length: int) -> tuple[Forward, list[torch.Tensor]]:
        q, k, v = _qkv(length, batch, dim)

        def forward() -> torch.Tensor:
            s = torch.einsum("bhtd,hd->bht", q, directions)
            t = torch.einsum("bhtd,hd->bht", k, directions)
            if window is None:
                return sliced_relu(s, t, v)
            sliced, denominator = sliced_relu(s, t, v, return_denominator=True)
            return local_window_attention(q, k, v, sliced, mix, window=window, combine=combine,
                                          denominator=denominator)

        return forward, [q, k, v]

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
    """A contender, how its cost grows with T (to predict skips), and the modes it is measured in."""

    name: str
    build: Builder
    growth: Growth
    modes: tuple[str, ...] = MODES


N_LOG_N = Growth(time=1.1, memory=1.0)
QUADRATIC_TIME = Growth(time=2.0, memory=1.0)
QUADRATIC = Growth(time=2.0, memory=2.0)

SLICED_GROUP = [
    Contender("sliced_relu", _sliced_builder(sliced_relu), N_LOG_N),
    Contender("authors", _sliced_builder(authors_sliced_relu), N_LOG_N),
    Contender("sdpa", _qkv_builder(F.scaled_dot_product_attention), QUADRATIC_TIME),
    Contender("eager", _qkv_builder(eager_softmax), QUADRATIC),
    Contender("sliced_relu_bump", _sliced_builder(bump), N_LOG_N),
    Contender("floor", _sliced_builder(floor), N_LOG_N, modes=("fwd",)),
]
RELA_GROUP = [
    Contender("rela", _qkv_builder(rela), QUADRATIC_TIME),
    SLICED_GROUP[2],
    SLICED_GROUP[3],
]
ENCODER_GROUP = [
    Contender(f"encoder/{name}", _encoder_builder(name), growth)
    for name, growth in (("sliced_relu", N_LOG_N), ("rela", QUADRATIC_TIME), ("sdpa", QUADRATIC_TIME),
                         ("eager", QUADRATIC))
]
# What `hf-sliced-attn convert` builds (README, "Conversion fidelity"): 4 slices, MLP projection, affine output.
ENCODER_GROUP.append(Contender("encoder/sliced_relu_converted", _encoder_builder(
    "sliced_relu", num_slices=4, projection="mlp", affine_output=True), N_LOG_N))
WINDOW = 64
"""The local softmax window (|i - j| <= WINDOW) of the window contenders at B = 1, D = 64."""
WINDOW_GROUP = [
    Contender(f"sliced_relu_window{WINDOW}", _window_builder(WINDOW), N_LOG_N),
    SLICED_GROUP[0],
    SLICED_GROUP[2],
]
# The window's sizes and combinations (issue #24's table of every-layer variants), at B = 1, D = 64.
WINDOW_SIZES = (4, 16, 64)


def _window_contender(size: int, combine: str) -> Contender:
    """``sliced_relu_window<size>`` (the shared normaliser) or ``sliced_relu_window<size>_gate``; the window group's
    own contender for its size and combination (one contender per name)."""
    name = f"sliced_relu_window{size}" + ("" if combine == "shared" else "_gate")
    return WINDOW_GROUP[0] if name == WINDOW_GROUP[0].name else Contender(name, _window_builder(size, combine=combine),
                                                                          N_LOG_N)


WINDOW_VARIANTS_GROUP = [
    *(_window_contender(size, combine) for combine in ("shared", "gate") for size in WINDOW_SIZES),
    SLICED_GROUP[0],
    SLICED_GROUP[2],
]
# Issue #24's small shape: B = 32 sequences of T = 128, H = 12, D = 32, a window of 4.
SMALL_BATCH, SMALL_DIM, SMALL_WINDOW = 32, 32, 4
SMALL_GROUP = [
    Contender(f"small/sliced_relu_window{SMALL_WINDOW}", _window_builder(SMALL_WINDOW, SMALL_BATCH, SMALL_DIM),
              N_LOG_N),
    Contender("small/sliced_relu", _window_builder(None, SMALL_BATCH, SMALL_DIM), N_LOG_N),
    Contender("small/sdpa", _qkv_builder(F.scaled_dot_product_attention, SMALL_BATCH, SMALL_DIM), QUADRATIC_TIME),
]
CONTENDER_NAMES = list(dict.fromkeys(
    c.name for c in (*SLICED_GROUP, *RELA_GROUP, *ENCODER_GROUP, *WINDOW_GROUP, *WINDOW_VARIANTS_GROUP,
                     *SMALL_GROUP)))
INTERLEAVED_DEFAULT = ("sliced_relu", "sliced_relu_bump", "sdpa")
"""What ``--interleaved`` compares unless ``--contenders`` is given: the bump kernel's bars."""


@dataclass(frozen=True)
class Group:
    """Contenders measured and reported together: the plots' file stem, the tables' title, the T."""

    stem: str
    title: str
    contenders: list[Contender]
    lengths: list[int]

    @property
    def labels(self) -> list[str]:
        return [c.name.split("/")[-1] for c in self.contenders]  # "encoder/sdpa" -> "sdpa"


# --------------------------------------------------------------------------- measuring


def reps_for(first_seconds: float) -> int:
    """Timed runs per point from the first one's time: 7, 5, 3 or 2 under 0.1 s, 1 s, 15 s or longer."""
    return 2 if first_seconds >= 15 else 3 if first_seconds >= 1 else 5 if first_seconds >= 0.1 else 7


class Bench:
    """The measurements of one run: a :class:`Series` per (contender, mode)."""

    def __init__(self, max_reps: int) -> None:
        self.max_reps = max_reps
        self.series: dict[tuple[str, str], Series] = {}

    def series_of(self, name: str, mode: str) -> Series:
        return self.series.get((name, mode), Series())

    def get(self, name: str, mode: str, length: int) -> Point | None:
        return self.series_of(name, mode).get(length)

    def measure(self, contender: Contender, mode: str, length: int) -> None:
        """The point, unless it was tried already (groups share contenders) or is predicted over ``BUDGET``."""
        series = self.series.setdefault((contender.name, mode), Series())
        if length not in series.points:
            attempt(series, length, lambda: self._point(contender, mode, length), contender.growth, BUDGET,
                    f"{contender.name:22s} {mode:8s}")

    def _point(self, contender: Contender, mode: str, length: int) -> Point:
        run, reset_grads = runner(contender, mode, length)
        return measure_point(run, lambda first: min(reps_for(first), self.max_reps), prepare=reset_grads)


def runner(contender: Contender, mode: str, length: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """One run of ``contender`` in ``mode`` at T = ``length``, on inputs built now, and the reset of
    the gradients of its leaves (to call before every run)."""
    forward, leaves = contender.build(length)
    gradient: list[torch.Tensor] = []

    def run() -> None:
        if mode == "fwd":
            with torch.no_grad():
                forward()
            return
        out = forward()
        if not gradient:  # made in the warm-up, before any memory baseline
            gradient.append(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
        out.backward(gradient[0])

    def reset_grads() -> None:
        for leaf in leaves:
            leaf.grad = None

    return run, reset_grads


def measure_groups(bench: Bench, groups: list[Group]) -> None:
    """Every group, T by T: all modes and contenders of a T before the next T."""
    for group in groups:
        print(f"\n# {group.title}", flush=True)
        for length in group.lengths:
            for mode in MODES:
                for contender in group.contenders:
                    if mode in contender.modes:
                        bench.measure(contender, mode, length)


def interleaved_groups(measured: list[Group], lengths: list[int]) -> list[Group]:
    """The groups at ``lengths``, each contender in the group holding the most of the selected ones (the
    first of those; softmax is in several), so that the contenders a bar compares take turns with each
    other, and measured in fwd+bwd; groups left empty are dropped."""
    seen: set[str] = set()
    kept = []
    for group in sorted(measured, key=lambda g: -len(g.contenders)):
        contenders = [c for c in group.contenders if "fwd+bwd" in c.modes and c.name not in seen]
        seen.update(c.name for c in contenders)
        if contenders:
            kept.append(Group(group.stem, group.title, contenders, lengths))
    return kept


def measure_interleaved(bench: Bench, measured: list[Group], rounds: int) -> None:
    """fwd+bwd, at every T of every group: its contenders side by side (:func:`interleaved`), a
    warm-up run each, then ``rounds`` rounds of one timed run of each, in the group's order, then
    the same again in the reverse order: a run right after a long one (softmax at 16k) is measurably
    slower, so no contender always follows the same one. A point is the median of its 2 ``rounds``
    timed runs."""
    for group in measured:
        print(f"\n# {group.title}: contenders interleaved", flush=True)
        for length in group.lengths:
            runs = {}
            for contender in group.contenders:
                run, reset_grads = runner(contender, "fwd+bwd", length)
                runs[contender.name] = lambda run=run, reset_grads=reset_grads: (reset_grads(), run())
            in_order = interleaved(runs, rounds, f"T={length}")
            reversed_order = interleaved(dict(reversed(runs.items())), rounds, f"T={length} (reversed)")
            for name in runs:
                times = in_order[name].runs + reversed_order[name].runs
                bench.series.setdefault((name, "fwd+bwd"), Series()).points[length] = Point(statistics.median(times),
                                                                                            times)


# --------------------------------------------------------------------------- reporting


def time_table(bench: Bench, group: Group, mode: str) -> list[str]:
    """Markdown rows: the time per run of each contender, then its speed-up over the group's first."""
    names, (subject, *others) = [c.name for c in group.contenders], group.labels
    lines = [f"### {mode}: time per run (median) and speed-up of `{subject}` (other's time / {subject}'s time)", "",
             "| T | " + " | ".join([*group.labels, *(f"{o} / {subject}" for o in others)]) + " |",
             "|---:|" + "---:|" * (2 * len(names) - 1)]
    for length in group.lengths:
        cells = [bench.series_of(n, mode).cell(length, lambda p: fmt_time(p.seconds)) for n in names]
        base = bench.get(names[0], mode, length)
        ratios = [fmt_ratio(point_ratio(bench.get(n, mode, length), base)) for n in names[1:]]
        lines.append(f"| {length} | " + " | ".join(cells + ratios) + " |")
    return lines + [""]


def memory_table(bench: Bench, group: Group) -> list[str]:
    """Markdown rows: the peak memory of each contender in each mode, then the first's over the others'."""
    names, (subject, *others) = [c.name for c in group.contenders], group.labels
    lines = [f"### Peak memory (resident-set growth over the inputs); ratio = {subject} / other", "",
             "| T | " + " | ".join([*(f"{n} {m}" for m in MODES for n in group.labels),
                                    *(f"{subject} / {o} (fwd+bwd)" for o in others)]) + " |",
             "|---:|" + "---:|" * (len(names) * len(MODES) + len(others))]
    for length in group.lengths:
        cells = [bench.series_of(n, m).cell(length, lambda p: fmt_bytes(p.peak_bytes)) for m in MODES for n in names]
        base = bench.get(names[0], "fwd+bwd", length)
        ratios = [fmt_ratio(point_ratio(base, bench.get(n, "fwd+bwd", length), "peak_bytes")) for n in names[1:]]
        lines.append(f"| {length} | " + " | ".join(cells + ratios) + " |")
    return lines


def group_tables(bench: Bench, group: Group) -> str:
    """Markdown: per mode a time table with ratios against the group's first contender, then memory."""
    lines = [f"## {group.title}", ""]
    for mode in MODES:
        lines += time_table(bench, group, mode)
    return "\n".join(lines + memory_table(bench, group)) + "\n"


def plot_group(bench: Bench, group: Group, output: Path) -> None:
    """Two log-log PNGs, ``<stem>_time.png`` and ``<stem>_memory.png``, one panel per mode."""
    for kind, attr, unit in (("time", "seconds", "s per run"), ("memory", "peak_bytes", "MiB peak")):
        panels = [Panel(mode, unit, attr, {label: bench.series_of(c.name, mode).within(group.lengths)
                                           for label, c in zip(group.labels, group.contenders, strict=True)})
                  for mode in MODES]
        plot_loglog(output / f"{group.stem}_{kind}.png", f"{group.title}: {kind}", panels)


def bars(bench: Bench) -> list[Bar]:
    """The acceptance bars, from the points they compare (not measured where a point is missing)."""
    fb = "fwd+bwd"
    g = bench.get
    return [
        Bar("sliced_relu fwd+bwd T=16384: sdpa time / sliced_relu time",
            point_ratio(g("sdpa", fb, 16384), g("sliced_relu", fb, 16384)), 20, True),
        Bar("sliced_relu fwd+bwd T=16384: authors' algorithm time / sliced_relu time",
            point_ratio(g("authors", fb, 16384), g("sliced_relu", fb, 16384)), 3, True),
        Bar("sliced_relu fwd T=16384: sliced_relu time / floor time (sort keys, read q, k, v, write out)",
            point_ratio(g("sliced_relu", "fwd", 16384), g("floor", "fwd", 16384)), 3, False),
        Bar("sliced_relu fwd+bwd: time(T=65536) / time(T=16384)",
            point_ratio(g("sliced_relu", fb, 65536), g("sliced_relu", fb, 16384)), 4.6, False),
        Bar("sliced_relu fwd+bwd peak memory linear in T: peak(65536) / peak(16384) (linear = 4)",
            point_ratio(g("sliced_relu", fb, 65536), g("sliced_relu", fb, 16384), "peak_bytes"), 4.6, False),
        Bar("sliced_relu_bump fwd+bwd T=16384: sdpa time / sliced_relu_bump time",
            point_ratio(g("sdpa", fb, 16384), g("sliced_relu_bump", fb, 16384)), 40, True),
        Bar("sliced_relu_bump fwd+bwd T=16384: sliced_relu_bump time / sliced_relu time",
            point_ratio(g("sliced_relu_bump", fb, 16384), g("sliced_relu", fb, 16384)), 1.25, False),
        Bar("sliced_relu_bump fwd+bwd peak memory linear in T: peak(65536) / peak(16384) (linear = 4)",
            point_ratio(g("sliced_relu_bump", fb, 65536), g("sliced_relu_bump", fb, 16384), "peak_bytes"), 4.6, False),
        Bar(f"sliced_relu_window{WINDOW} fwd+bwd T=16384: sdpa time / sliced_relu_window{WINDOW} time",
            point_ratio(g("sdpa", fb, 16384), g(f"sliced_relu_window{WINDOW}", fb, 16384)), 20, True),
        Bar(f"sliced_relu_window{WINDOW} fwd+bwd: time(T=65536) / time(T=16384)",
            point_ratio(g(f"sliced_relu_window{WINDOW}", fb, 65536), g(f"sliced_relu_window{WINDOW}", fb, 16384)),
            4.6, False),
        Bar("rela fwd+bwd T=512: speed relative to eager (eager time / rela time)",
            point_ratio(g("eager", fb, 512), g("rela", fb, 512)), 0.9, True),
        *(Bar(f"rela fwd+bwd T={length}: sdpa time / rela time (issue #26)",
              point_ratio(g("sdpa", fb, length), g("rela", fb, length)), 1.0, True) for length in (512, 2048, 8192)),
        Bar("rela fwd+bwd T=8192: peak memory rela / eager",
            point_ratio(g("rela", fb, 8192), g("eager", fb, 8192), "peak_bytes"), 0.25, False),
    ]


def memory_slope(bench: Bench, name: str) -> str:
    """Log-log slope of fwd+bwd peak memory over the two largest measured T (1 = linear)."""
    lengths, peaks = bench.series_of(name, "fwd+bwd").curve("peak_bytes")
    if len(lengths) < 2:
        return "n/a"
    slope = math.log(peaks[-1] / peaks[-2]) / math.log(lengths[-1] / lengths[-2])
    return f"{slope:.2f} (T={lengths[-2]}→{lengths[-1]})"


def report(run: Run, bench: Bench, groups: list[Group]) -> str:
    """The markdown results file: header, bars, memory slopes, then every group's tables."""
    sections = [
        "# Attention benchmark (CPU)", "",
        f"{run.header()} Shapes: B=1, H={HEADS}, D={HEAD_DIM}, float32. Method: see the script's docstring "
        "(median of runs after a warm-up; peak memory = kernel VmHWM growth over the inputs, reset before every run).",
        "", bars_table(bars(bench)),
        f"sliced_relu fwd+bwd peak-memory log-log slope: {memory_slope(bench, 'sliced_relu')}; "
        f"sliced_relu_bump: {memory_slope(bench, 'sliced_relu_bump')}; rela: {memory_slope(bench, 'rela')}.", "",
    ]
    return "\n".join(sections + [group_tables(bench, group) for group in groups])


def interleaved_report(run: Run, bench: Bench, groups: list[Group], rounds: int) -> str:
    """The markdown results file of ``--interleaved``: header, the bars these points measure, then
    each group's fwd+bwd time table."""
    sections = [
        "# Attention benchmark (CPU), contenders interleaved", "",
        (f"{run.header()} Shapes: B=1, H={HEADS}, D={HEAD_DIM}, float32, fwd+bwd. Method: at each T the contenders "
         f"take turns, one warm-up run each, then {rounds} rounds of one timed run of each, then the same in the "
         f"reverse order (no contender always follows the same one); a point is the median of its {2 * rounds} "
         "timed runs (every run's time is in the JSON file)."),
        "", bars_table([bar for bar in bars(bench) if bar.value is not None]),
    ]
    for group in groups:
        sections += [f"## {group.title}", "", *time_table(bench, group, "fwd+bwd")]
    return "\n".join(sections)


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
    print("sanity check: authors' port == float64 reference == sliced_relu op; sliced_relu_bump op == reference; "
          "rela op == reference; eager == sdpa; floor's output == v")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The arguments; ``output`` resolved (``benchmarks/results[/quick][/selected]`` unless given)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small subset (< 2 min)")
    parser.add_argument("--contenders", type=choice_list(CONTENDER_NAMES), help=(
        "comma-separated contenders to measure (e.g. sliced_relu,floor); default: all. Results then go to "
        "benchmarks/results/selected unless --output is given"))
    parser.add_argument("--output", type=Path, help="results directory (default: benchmarks/results[/quick])")
    parser.add_argument("--interleaved", type=int_list, metavar="T,...", help=(
        "instead of the groups' points: fwd+bwd at these T, the contenders (default: "
        f"{','.join(INTERLEAVED_DEFAULT)}) taking turns round by round. Results go to "
        "benchmarks/results/interleaved unless --output is given"))
    parser.add_argument("--lengths", type=int_list, metavar="T,...", help=(
        "the T of every selected group instead of its own (e.g. --contenders rela,sdpa,eager --lengths 512,2048,8192)"))
    parser.add_argument("--rounds", type=int, default=3, help=(
        "with --interleaved: timed rounds per T in each order, the group's and the reverse (default 3)"))
    args = parser.parse_args(argv)
    if args.interleaved:
        args.contenders = args.contenders or list(INTERLEAVED_DEFAULT)
        args.output = args.output or RESULTS / "interleaved"
    default_output = RESULTS / "quick" if args.quick else RESULTS
    args.output = args.output or (default_output / "selected" if args.contenders else default_output)
    return args


def groups(quick: bool, selected: list[str] | None, lengths: list[int] | None = None) -> list[Group]:
    """The groups to measure, with their T (a few with ``quick``; ``lengths`` for all when given), holding
    only the ``selected`` contenders."""
    every = [
        Group("sliced_relu", "sliced_relu and sliced_relu_bump vs softmax attention and the authors' algorithm",
              SLICED_GROUP, [256, 1024] if quick else [2**p for p in range(8, 17)]),
        Group("rela", "ReLA vs softmax attention", RELA_GROUP, [128, 512] if quick else [2**p for p in range(7, 15)]),
        Group("encoder", "RoBERTa encoder, 2 layers, hidden 768, 12 heads", ENCODER_GROUP,
              [256] if quick else [256, 1024, 4096]),
        Group("window", f"sliced_relu with a shared softmax window of {WINDOW} vs sliced_relu and softmax attention",
              WINDOW_GROUP, [1024] if quick else [1024, 4096, 16384, 65536]),
        Group("window_variants", f"sliced_relu with a softmax window of {', '.join(map(str, WINDOW_SIZES))} tokens, "
              "shared normaliser or gate, vs sliced_relu and softmax attention", WINDOW_VARIANTS_GROUP,
              [128] if quick else [128, 512, 16384, 65536]),
        Group("small", f"B={SMALL_BATCH}, D={SMALL_DIM}: sliced_relu with a shared softmax window of {SMALL_WINDOW} "
              "vs sliced_relu and softmax attention", SMALL_GROUP, [128]),
    ]
    chosen = [Group(g.stem, g.title, [c for c in g.contenders if selected is None or c.name in selected],
                    lengths or g.lengths) for g in every]
    return [group for group in chosen if group.contenders]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(os.cpu_count())
    run = Run(Path(__file__).name, argv)
    sanity_check()
    bench, measured = Bench(max_reps=3 if args.quick else 7), groups(args.quick, args.contenders, args.lengths)
    if args.interleaved:
        measured = interleaved_groups(measured, args.interleaved)
        measure_interleaved(bench, measured, args.rounds)
    else:
        measure_groups(bench, measured)
    run.finish()
    if args.interleaved:
        markdown = interleaved_report(run, bench, measured, args.rounds)
    else:
        markdown = report(run, bench, measured)
    print("\n" + markdown)
    args.output.mkdir(parents=True, exist_ok=True)
    for group in [] if args.interleaved else measured:
        plot_group(bench, group, args.output)
    points = [{"contender": name, "mode": mode, **record}
              for (name, mode), series in bench.series.items() for record in series.records()]
    write_results(args.output, "attention", markdown, {"environment": run.record(), "points": points})
    return 0


if __name__ == "__main__":
    sys.exit(main())
