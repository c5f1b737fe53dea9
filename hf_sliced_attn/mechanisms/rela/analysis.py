"""Sparsity analysis of ReLA attention (Zhang, Titov & Sennrich, EMNLP 2021, arXiv 2104.07012).

ReLA never forms its attention matrix in the forward pass, so this module recomputes the
weights from the queries and keys each layer receives (via
:func:`hf_sliced_attn.attention.observe_attention`) and counts, block by block of queries:

Per layer l and head h, with A = ReLU(Q K^T * scaling) the head's (T, T) weights and P the
set of valid pairs (i, j): query i and key j are real tokens and, on a sliding-window layer
of window w, |i - j| <= w - 1:

* sparsity rate  = #{(i, j) in P : A_ij = 0} / |P|
* null rate      = #{valid i : A_ij = 0 for every (i, j) in P} / #{valid i}
  (the head "switches off" for query i, which softmax cannot do)
* head diversity (per layer, between its heads) = the generalised Jensen-Shannon
  divergence of Correia et al. (2019), which the ReLA paper uses: for a valid query i let
  N_i be the heads whose row is not null and p_h = A_h,i / sum_j A_h,ij their row-normalised
  weights over P; then

      JS_i = H( (1/|N_i|) sum_{h in N_i} p_h ) - (1/|N_i|) sum_{h in N_i} H(p_h),

  H the Shannon entropy in nats (0 <= JS_i <= ln |N_i|), and the diversity is the mean of
  JS_i over the valid queries with |N_i| >= 2 (null rows are left out because they are not
  distributions; a layer with no such query has diversity NaN).

All counts are pooled over every sentence of every batch (rates are ratios of totals, not
means of per-sentence rates). The scores are recomputed in float64, so the sign of a
borderline score does not depend on rounding; the model itself runs unchanged.

Memory: for each observed layer call, queries are taken ``block_size`` at a time and only a
(B, H, block_size, Tk) slab of weights exists at once (on a window layer, only the keys
the block can reach); nothing of size (T, T) is ever kept.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...attention import observe_attention
from ...integration import mechanism_config_of
from ..base import CONFIG_KEY
from . import RELA
from ...ops._common import band_mask, key_range

__all__ = ["RelaAnalysis", "analyze_rela", "check_rela_config"]


@dataclass
class _LayerCounts:
    """Running totals of one layer; per-head tensors have shape (H,), float64 on the CPU."""

    num_heads: int
    sliding_window: int | None = None
    zero_pairs: torch.Tensor = field(init=False)
    null_queries: torch.Tensor = field(init=False)
    valid_pairs: int = 0
    valid_queries: int = 0
    js_sum: float = 0.0
    js_queries: int = 0

    def __post_init__(self) -> None:
        self.zero_pairs = torch.zeros(self.num_heads, dtype=torch.float64)
        self.null_queries = torch.zeros(self.num_heads, dtype=torch.float64)


@dataclass
class RelaAnalysis:
    """Per-layer, per-head ReLA statistics (see the module docstring for the definitions).

    Attributes:
        layers: indices of the analysed (ReLA) layers, ascending; layers kept on softmax are absent.
        sliding_windows: per analysed layer, its window w (pairs |i - j| <= w - 1) or None.
        sparsity: (L, H) fraction of exactly-zero weights over valid pairs.
        null_rate: (L, H) fraction of valid queries whose weights are all zero.
        head_diversity: (L,) mean generalised JS divergence between the heads, in nats.
        valid_pairs, valid_queries: (L,) the totals the rates divide by (per head).
        num_texts: how many texts were analysed.
    """

    layers: list[int]
    sliding_windows: list[int | None]
    sparsity: list[list[float]]
    null_rate: list[list[float]]
    head_diversity: list[float]
    valid_pairs: list[int]
    valid_queries: list[int]
    num_texts: int

    @property
    def num_heads(self) -> int:
        return len(self.sparsity[0]) if self.sparsity else 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; NaN diversities become null."""
        out = dict(self.__dict__)
        out["head_diversity"] = [None if math.isnan(x) else x for x in self.head_diversity]
        out["mean_sparsity"] = _mean([x for row in self.sparsity for x in row])
        out["mean_null_rate"] = _mean([x for row in self.null_rate for x in row])
        return out

    def to_json(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` to ``path`` (indented JSON); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def to_markdown(self) -> str:
        """A per-layer summary table, then sparsity and null rate (in %) per layer × head."""
        heads = range(self.num_heads)
        lines = [
            f"ReLA attention over {self.num_texts} texts (rates over valid query-key pairs / queries).",
            "",
            "| layer | window | mean sparsity | min / max head sparsity | mean null rate | head diversity (JS, nats) |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for i, layer in enumerate(self.layers):
            window = "global" if self.sliding_windows[i] is None else str(self.sliding_windows[i])
            row = self.sparsity[i]
            diversity = "n/a" if math.isnan(self.head_diversity[i]) else f"{self.head_diversity[i]:.4f}"
            lines.append(
                f"| {layer} | {window} | {100 * _mean(row):.2f}% | {100 * min(row):.2f}% / {100 * max(row):.2f}% "
                f"| {100 * _mean(self.null_rate[i]):.2f}% | {diversity} |"
            )
        for title, values in (("Sparsity (%)", self.sparsity), ("Null-attention rate (%)", self.null_rate)):
            lines += [
                "",
                f"{title}, layer × head:",
                "",
                "| layer | " + " | ".join(f"h{h}" for h in heads) + " |",
                "|---:|" + "---:|" * self.num_heads,
            ]
            lines += [
                f"| {layer} | " + " | ".join(f"{100 * x:.1f}" for x in values[i]) + " |"
                for i, layer in enumerate(self.layers)
            ]
        return "\n".join(lines) + "\n"

    def plot_heatmap(self, path: str | Path) -> Path:
        """Save a PNG with two layers × heads heatmaps: sparsity and null rate (both in [0, 1])."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        n_layers, n_heads = len(self.layers), self.num_heads
        fig, axes = plt.subplots(
            1, 2, figsize=(2 * (2 + 0.5 * n_heads), 1.5 + 0.45 * n_layers), constrained_layout=True
        )
        for ax, (title, values) in zip(axes, (("sparsity rate", self.sparsity), ("null-attention rate", self.null_rate))):
            image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
            ax.set_title(title)
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_xticks(range(n_heads))
            ax.set_yticks(range(n_layers), [str(layer) for layer in self.layers])
            if n_layers * n_heads <= 400:
                for i in range(n_layers):
                    for h in range(n_heads):
                        ax.text(h, i, f"{values[i][h]:.2f}", ha="center", va="center", fontsize=7,
                                color="white" if values[i][h] < 0.5 else "black")
            fig.colorbar(image, ax=ax, shrink=0.8)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def check_rela_config(config: Any) -> None:
    """Raise a ValueError unless ``config`` (a transformers config) was converted to ReLA."""
    options = mechanism_config_of(config)
    mechanism = None if options is None else options.mechanism
    if mechanism != RELA.name:
        raise ValueError(
            f"The ReLA analysis needs a ReLA model (config.{CONFIG_KEY}['mechanism'] == 'rela'), but this "
            f"model's mechanism is {mechanism!r}. Convert it first: `import hf_sliced_attn` and "
            "`from_pretrained(path, attn_implementation='rela')`."
        )


def _count_block(
    counts: _LayerCounts, q_block: torch.Tensor, key: torch.Tensor, query_valid: torch.Tensor,
    pair_valid: torch.Tensor,
) -> None:
    """Add one query block's statistics to ``counts``.

    Shapes: q_block (B, H, b, D) float64, already multiplied by the scaling; key
    (B, H, k, D) float64, the keys the block may reach; query_valid (B, b) bool;
    pair_valid (B, b, k) bool (already False for invalid queries).
    """
    weights = torch.matmul(q_block, key.transpose(-1, -2)).clamp_min_(0.0)  # (B, H, b, k)
    weights.mul_(pair_valid[:, None])
    positive = weights > 0
    n_pairs = int(pair_valid.sum())
    counts.valid_pairs += n_pairs
    counts.valid_queries += int(query_valid.sum())
    counts.zero_pairs += n_pairs - positive.sum(dim=(0, 2, 3), dtype=torch.float64).cpu()
    row_sum = weights.sum(-1, keepdim=True)  # (B, H, b, 1)
    live = (row_sum > 0).squeeze(-1) & query_valid[:, None]  # (B, H, b) not-null valid rows
    counts.null_queries += (query_valid[:, None] & ~live).sum(dim=(0, 2), dtype=torch.float64).cpu()
    # Generalised JS divergence over each query's non-null heads.
    probs = weights.div_(torch.where(row_sum > 0, row_sum, 1.0))  # null rows stay all-zero
    n_live = live.sum(1, dtype=torch.float64)  # (B, b)
    head_entropy = -torch.special.xlogy(probs, probs).sum(-1)  # (B, H, b); 0 on null rows
    mixture = probs.sum(1) / n_live.clamp_min(1)[..., None]  # (B, b, k)
    js = -torch.special.xlogy(mixture, mixture).sum(-1) - head_entropy.sum(1) / n_live.clamp_min(1)
    counted = n_live >= 2
    counts.js_sum += float(js[counted].sum())
    counts.js_queries += int(counted.sum())


def _observe_layer(
    counts: _LayerCounts, query: torch.Tensor, key: torch.Tensor, key_padding_mask: torch.Tensor | None,
    scaling: float | None, sliding_window: int | None, block_size: int,
) -> None:
    """Count one layer call, ``block_size`` queries at a time. query, key: (B, H, T, D)."""
    batch, _, length, dim = query.shape
    scaling = dim**-0.5 if scaling is None else scaling
    valid = (
        torch.ones(batch, length, dtype=torch.bool, device=query.device)
        if key_padding_mask is None else key_padding_mask.bool()
    )
    for start in range(0, length, block_size):
        end = min(start + block_size, length)
        lo, hi = key_range(start, end, length, sliding_window)
        query_valid = valid[:, start:end]
        pair_valid = query_valid[:, :, None] & valid[:, None, lo:hi]
        band = band_mask(start, end, lo, hi, sliding_window, query.device)
        if band is not None:
            pair_valid &= band
        _count_block(
            counts, query[:, :, start:end].double() * scaling, key[:, :, lo:hi].double(), query_valid, pair_valid
        )


def analyze_rela(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    batch_size: int = 8,
    max_length: int = 512,
    block_size: int = 64,
) -> RelaAnalysis:
    """Run a ReLA ``model`` over ``texts`` and measure each layer's and head's sparsity.

    Args:
        model: a transformers model converted to ReLA (``config.hf_sliced_attn["mechanism"] == "rela"``).
        tokenizer: its tokenizer (called with padding and truncation to ``max_length``).
        texts: the texts; they are batched ``batch_size`` at a time, padded within a batch
            (padded positions count neither as queries nor as keys).
        block_size: queries per block when recomputing the weights; at most a
            (B, H, block_size, T) float64 slab exists at a time.

    Returns:
        A :class:`RelaAnalysis` with sparsity and null rates per (layer, head) and head
        diversity per layer, over the layers that run ReLA.

    Raises:
        ValueError: the model is not a ReLA model, ``texts`` is empty, or no layer ran ReLA.
    """
    check_rela_config(getattr(model, "config", None))
    if not texts:
        raise ValueError("analyze_rela needs at least one text.")
    if batch_size < 1 or block_size < 1:
        raise ValueError(f"batch_size and block_size must be >= 1, got {batch_size} and {block_size}.")
    counts: dict[int, _LayerCounts] = {}

    def observer(*, module: nn.Module, mechanism: str, query: torch.Tensor, key: torch.Tensor,
                 key_padding_mask: torch.Tensor | None, scaling: float | None, sliding_window: int | None,
                 **_: Any) -> None:
        if mechanism != RELA.name:
            return
        entry = counts.setdefault(module.layer_idx, _LayerCounts(query.shape[1], sliding_window))
        _observe_layer(entry, query, key, key_padding_mask, scaling, sliding_window, block_size)

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), observe_attention(observer):
            for start in range(0, len(texts), batch_size):
                batch = tokenizer(
                    list(texts[start:start + batch_size]), padding=True, truncation=True,
                    max_length=max_length, return_tensors="pt",
                )
                model(**{name: tensor.to(device) for name, tensor in batch.items()})
    finally:
        model.train(was_training)
    if not counts:
        raise ValueError(
            "No layer of this model ran ReLA on the texts (every layer is kept on softmax?): nothing to analyse."
        )
    layers = sorted(counts)
    entries = [counts[layer] for layer in layers]
    return RelaAnalysis(
        layers=layers,
        sliding_windows=[e.sliding_window for e in entries],
        sparsity=[(e.zero_pairs / max(e.valid_pairs, 1)).tolist() for e in entries],
        null_rate=[(e.null_queries / max(e.valid_queries, 1)).tolist() for e in entries],
        head_diversity=[e.js_sum / e.js_queries if e.js_queries else float("nan") for e in entries],
        valid_pairs=[e.valid_pairs for e in entries],
        valid_queries=[e.valid_queries for e in entries],
        num_texts=len(texts),
    )
