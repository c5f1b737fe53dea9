"""The modules sliced ReLU attention adds to a converted attention layer.

``sliced_projection`` turns queries and keys into scalars (:class:`SlicedProjection`, the
paper's, or :class:`SlicedMLPProjection`, the authors' code's); ``sliced_bandwidth``
(:class:`SlicedBandwidth`, with ``kernel="bump"``) holds the bump kernel's bandwidths;
``sliced_output`` (:class:`SlicedOutputAffine`, with ``affine_output=True``) puts back a gain
and the mean value. With ``local_window`` w > 0, ``sliced_window_gate`` or ``sliced_window_share``
(:mod:`..local_window`) holds the per-head weights that combine softmax within the window with the
sliced attention.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch import nn
from transformers import initialization as init

from ..base import Affine, PluginModule

LayerMap = nn.Linear | Affine
"""A layer's map x -> x W^T + b, read through its ``weight`` and ``bias``."""


def _tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, D) -> (B, T, H*D): every token's heads side by side (a view when x is a
    (B, T, H, D) buffer seen as (B, H, T, D), as attention layers hold q and k)."""
    batch, heads, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * head_dim)


def _per_head(scalars: torch.Tensor, heads: int, slices: int) -> torch.Tensor:
    """(B, T, H*M) -> (B, H, M, T)."""
    batch, length, _ = scalars.shape
    return scalars.view(batch, length, heads, slices).permute(0, 2, 3, 1)


def _query_and_key(scalars: torch.Tensor, heads: int, slices: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, 2*H*M), the queries' scalars then the keys', -> s and t, each (B, H, M, T)."""
    query_scalars, key_scalars = scalars.chunk(2, dim=-1)
    return _per_head(query_scalars, heads, slices), _per_head(key_scalars, heads, slices)


def _after(linear: LayerMap, weight: torch.Tensor, bias: torch.Tensor | None
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight and bias of ``x -> F.linear(linear(x), weight, bias)``: one affine map, (out, in_features)."""
    folded_bias = None if linear.bias is None else linear.bias @ weight.T
    if bias is not None:
        folded_bias = bias if folded_bias is None else folded_bias + bias
    return weight @ linear.weight, folded_bias


def _side_by_side(*maps: tuple[torch.Tensor, torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Affine maps (weight (out_k, in_features), bias or None) of the same input as one: their outputs side by
    side, from one product (a missing bias is zeros, unless every one is missing)."""
    weights, biases = zip(*maps)
    if all(bias is None for bias in biases):
        return torch.cat(weights), None
    return torch.cat(weights), torch.cat([w.new_zeros(w.shape[0]) if b is None else b for w, b in maps])


def side_by_side_products(hidden_states: torch.Tensor, maps: Sequence[LayerMap]) -> list[torch.Tensor]:
    """Each map of ``hidden_states`` (..., in_features) -> (..., out_features), all from one product."""
    weight, bias = _side_by_side(*((m.weight, m.bias) for m in maps))
    return list(nn.functional.linear(hidden_states, weight, bias).split([m.out_features for m in maps], dim=-1))


def _after_query_and_key(query: LayerMap, key: LayerMap, weight: torch.Tensor, bias: torch.Tensor | None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`_after` of ``query`` and of ``key`` side by side: the weight (2*out, in_features) and bias of
    ``x -> [F.linear(query(x), weight, bias), F.linear(key(x), weight, bias)]``, one product for both."""
    return _side_by_side(_after(query, weight, bias), _after(key, weight, bias))


class SlicedProjection(PluginModule):
    """The learned directions of sliced ReLU attention: M per head.

    ``directions`` is (H, M, D). For queries (B, H, Tq, D) and keys (B, H, Tk, D) it gives
    the scalars s = <w_hm, q_i> (B, H, M, Tq) and t = <w_hm, k_j> (B, H, M, Tk); queries
    and keys share the same directions. Initialised normal with std D^-1/2 (unit norm in
    expectation; the kernel is invariant to their scale).

    Computed as one product of the tokens (B, T, H*D) with the block-diagonal (H*D, H*M)
    matrix of the directions: it reads q and k in the layout attention layers hold them, and
    its backward writes dL/dq in that layout, with no transposed copies.

    :meth:`project_input` gives the same scalars from the layer input x when q = W_q x + b_q:
    s = (W_q^T P) x + P^T b_q, P the block-diagonal matrix, an (H*M)-wide product instead of
    the (H*D)-wide q; s and t come out of one (2*H*M)-wide product.
    """

    def __init__(self, num_heads: int, head_dim: int, num_slices: int = 1) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.num_slices = num_heads, head_dim, num_slices
        self.directions = nn.Parameter(torch.empty(num_heads, num_slices, head_dim))

    def init_weights(self, initializer_range: float) -> None:
        init.normal_(self.directions, mean=0.0, std=self.head_dim**-0.5)

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, token_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``token_mask`` is unused: projecting every token costs less than selecting the real ones."""
        weight = self._block_diagonal(query.dtype)
        return tuple(_per_head(_tokens(x) @ weight, self.num_heads, self.num_slices) for x in (query, key))

    def _block_diagonal(self, dtype: torch.dtype) -> torch.Tensor:
        """The directions as one (H*D, H*M) block-diagonal matrix."""
        return torch.block_diag(*self.directions.to(dtype).transpose(1, 2))

    def folds(self, num_tokens: int, in_features: int) -> bool:
        """Whether :meth:`project_input` costs less than the query and key layers plus :meth:`forward`
        for ``num_tokens`` tokens of ``in_features`` (folding costs (H*D) x in_features x (H*M) once)."""
        return num_tokens >= self.num_heads * self.num_slices

    def project_input(
        self, hidden_states: torch.Tensor, query: LayerMap, key: LayerMap, token_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` of q = ``query(hidden_states)`` and k = ``key(hidden_states)`` viewed as (B, H, T, D),
        from the layer input (B, T, C) without forming q and k. ``token_mask`` is unused, as in ``forward``."""
        _, query_scalars, key_scalars = self.project_input_beside(hidden_states, query, key, [])
        return query_scalars, key_scalars

    def project_input_beside(
        self, hidden_states: torch.Tensor, query: LayerMap, key: LayerMap, beside: Sequence[LayerMap]
    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Each map of ``beside`` applied to ``hidden_states`` (B, T, out_features each) and :meth:`project_input`'s
        scalars, from one product: their rows beside the folded query and key rows (2*H*M more outputs)."""
        weight = self._block_diagonal(query.weight.dtype).T  # (H*M, H*D)
        *outputs, scalars = side_by_side_products(hidden_states, [*beside, Affine(*_after_query_and_key(query, key,
                                                                                                       weight, None))])
        return outputs, *_query_and_key(scalars, self.num_heads, self.num_slices)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, num_slices={self.num_slices}"


class SlicedMLPProjection(PluginModule):
    """The projection of the authors' code (SiwanB/Sliced_ReLU_Attention): one MLP over all heads.

    The queries of a token, concatenated over heads (H*D), go through
    ``hidden`` Linear(H*D, W) -> GELU -> ``to_scalars`` Linear(W, H*M), which gives the M
    scalars of every head; keys go through the same MLP. The width W is H*D in the authors' code
    (``width=None``); a narrower one costs W/(H*D) of the first layer's products. For queries (B, H, Tq, D) and keys
    (B, H, Tk, D) it returns s (B, H, M, Tq) and t (B, H, M, Tk), like :class:`SlicedProjection`.
    The order it induces on the keys is a nonlinear function of all heads' keys. Weights are
    initialised normal with the model's ``initializer_range``, biases at zero.

    With a ``token_mask`` (B, T) of self-attention (True = real token; queries and keys are the
    same T tokens), padded tokens get the scalar 0 and the MLP runs on the real tokens only: its
    matrix products are most of a converted layer's cost at GLUE lengths, and dynamically
    padded batches are often half padding. A padded key is masked out of the attention anyway;
    the output at a padded query is not used (as with transformers' FlashAttention-2 path, which
    leaves zeros there). Under ``torch.compile`` the MLP runs on every token and the padded
    scalars are set to 0 (the same function, with no data-dependent shape).

    :meth:`project_input` gives the same scalars from the layer input x when q = W_q x + b_q:
    ``hidden`` (A, c) after the query layer is one affine map, GELU((A W_q) x + A b_q + c), so
    the tokens go through one (W x C) product instead of the (H*D x C) and (W x H*D) ones; folding
    A W_q costs a (W x H*D x C) product once (:meth:`folds`). Queries and keys share the input
    there: its real tokens are selected once and go through one (2W x C) product, then
    ``to_scalars`` on both halves at once.
    """

    def __init__(self, num_heads: int, head_dim: int, num_slices: int = 1, width: int | None = None) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.num_slices = num_heads, head_dim, num_slices
        features = num_heads * head_dim
        self.width = features if width is None else width
        self.hidden = nn.Linear(features, self.width)
        self.activation = nn.GELU()
        self.to_scalars = nn.Linear(self.width, num_heads * num_slices)

    def init_weights(self, initializer_range: float) -> None:
        for linear in (self.hidden, self.to_scalars):
            init.normal_(linear.weight, mean=0.0, std=initializer_range)
            init.zeros_(linear.bias)

    def _scalars(
        self, tokens: torch.Tensor, first_layer: Callable[[torch.Tensor], torch.Tensor],
        token_mask: torch.Tensor | None, parts: int = 1,
    ) -> torch.Tensor:
        """(B, T, F) tokens, the map of F-wide rows to ``parts`` of ``hidden``'s pre-activations side by side
        (parts * W), and a (B, T) bool mask or None -> (B, T, parts * H*M), each part's scalars side by side, 0
        at padded tokens."""

        def mlp(rows: torch.Tensor) -> torch.Tensor:  # (..., F) -> (..., parts * H*M)
            hidden = self.activation(first_layer(rows)).unflatten(-1, (parts, self.width))
            return self.to_scalars(hidden).flatten(-2)

        if token_mask is not None and torch.compiler.is_compiling():
            scalars = torch.where(token_mask.unsqueeze(-1), mlp(tokens), 0.0)
        elif token_mask is None or bool(token_mask.all()):
            scalars = mlp(tokens)
        else:
            real = token_mask.reshape(-1).nonzero().squeeze(1)
            flat = tokens.reshape(-1, tokens.shape[-1])
            selected = mlp(flat.index_select(0, real))
            scalars = selected.new_zeros(flat.shape[0], selected.shape[-1]).index_copy(0, real, selected)
        return scalars.view(*tokens.shape[:2], -1)

    @staticmethod
    def _check_token_mask(token_mask: torch.Tensor | None, tokens: tuple[int, ...], same_tokens: bool, inputs: str) -> None:
        if token_mask is not None and (tuple(token_mask.shape) != tokens or not same_tokens):
            raise ValueError(
                f"token_mask is for self-attention: it must be (B, T) with queries and keys of the same T tokens, "
                f"got {tuple(token_mask.shape)} for {inputs}."
            )

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, token_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_token_mask(token_mask, (query.shape[0], query.shape[2]), key.shape == query.shape,
                               f"queries {tuple(query.shape)} and keys {tuple(key.shape)}")
        return tuple(_per_head(self._scalars(_tokens(x), self.hidden, token_mask), self.num_heads, self.num_slices)
                     for x in (query, key))

    def folds(self, num_tokens: int, in_features: int) -> bool:
        """Whether :meth:`project_input` costs less than the query and key layers plus :meth:`forward`
        for ``num_tokens`` tokens of ``in_features`` C: folding costs W*F*C multiply-adds once (F = H*D) and saves
        F*C + F*W - W*C per token (from W tokens on where F = C, as in BERT-style layers)."""
        features = self.num_heads * self.head_dim
        return num_tokens * (features * in_features + features * self.width - self.width * in_features) \
            >= self.width * features * in_features

    def project_input(
        self, hidden_states: torch.Tensor, query: LayerMap, key: LayerMap, token_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` of q = ``query(hidden_states)`` and k = ``key(hidden_states)`` viewed as (B, H, T, D),
        from the layer input (B, T, C) with ``hidden`` folded into ``query`` and ``key``."""
        self._check_token_mask(token_mask, tuple(hidden_states.shape[:2]), True, f"an input {tuple(hidden_states.shape)}")
        weight, bias = _after_query_and_key(query, key, self.hidden.weight, self.hidden.bias)
        first_layer = functools.partial(nn.functional.linear, weight=weight, bias=bias)
        return _query_and_key(self._scalars(hidden_states, first_layer, token_mask, parts=2), self.num_heads,
                              self.num_slices)

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, head_dim={self.head_dim}, num_slices={self.num_slices}, "
                f"width={self.width}")


class SlicedBandwidth(PluginModule):
    """The bump kernel's learned bandwidths: b_hm = softplus(theta_hm) + 1e-4, one per head and slice.

    ``theta`` is (H, M) and starts at 0 (b = log 2 + 1e-4 ≈ 0.69), as in the authors' code;
    the softplus keeps b positive whatever the optimizer does. ``forward()`` returns b (H, M).
    """

    MIN_BANDWIDTH = 1e-4

    def __init__(self, num_heads: int, num_slices: int = 1) -> None:
        super().__init__()
        self.num_heads, self.num_slices = num_heads, num_slices
        self.theta = nn.Parameter(torch.empty(num_heads, num_slices))

    def init_weights(self, initializer_range: float) -> None:
        init.zeros_(self.theta)

    def forward(self) -> torch.Tensor:
        return nn.functional.softplus(self.theta) + self.MIN_BANDWIDTH

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, num_slices={self.num_slices}"


class SlicedOutputAffine(PluginModule):
    """A learned per-head gain on the sliced ReLU output, plus a learned share of the mean value.

    out_h = gain_h * attention_h + mean_weight_h * vbar_h, with attention (B, H, T, D), vbar
    (B, H, T or 1, D) the mean value the query sees, and ``gain``, ``mean_weight`` (H,).
    The kernel weights ReLU(s_i - t_j) / sum_l |s_i - t_l| add up to at most 1 (1/2 for a
    median query) and act on centred values, while softmax weights add up to 1 and keep
    the mean value: ``gain`` starts at 2, the constant of the authors' code, and
    ``mean_weight`` at 1, so a converted layer starts from the full mean value.
    """

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.gain = nn.Parameter(torch.empty(num_heads))
        self.mean_weight = nn.Parameter(torch.empty(num_heads))

    def init_weights(self, initializer_range: float) -> None:
        init.constant_(self.gain, 2.0)
        init.ones_(self.mean_weight)

    def forward(self, attention: torch.Tensor, value_mean: torch.Tensor) -> torch.Tensor:
        gain = self.gain.to(attention.dtype)[:, None, None]
        mean_weight = self.mean_weight.to(attention.dtype)[:, None, None]
        return torch.addcmul(mean_weight * value_mean, gain, attention)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"
