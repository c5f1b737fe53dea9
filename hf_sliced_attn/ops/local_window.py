"""A local softmax window combined, per head, with a global sliced kernel.

Sliced ReLU attention (arXiv 2512.11411) sees every key through one scalar per head and slice;
what it cannot express is the sharp, content-based attention of softmax to nearby tokens. As in
LoLCATs (arXiv 2410.10254) and RAttention (arXiv 2506.15545), each query also attends with
softmax to the keys within ``window`` w of it, and the two are combined per head. For a query
i of head h, with

    W(i)          the valid keys j with |i - j| <= w,
    a_ij          = scaling * q_i . k_j (the checkpoint's own scores, RoPE applied by the model),
    local_i       = sum_{j in W(i)} exp(a_ij) v_j / sum_{j in W(i)} exp(a_ij),
    lse_i         = log sum_{j in W(i)} exp(a_ij),
    S_i           the global sliced term (every valid key; any output affine already applied),
    D_i           the sliced kernel's normaliser (``denominator``; see below),

the two combinations (``combine``) are:

* ``"gate"``: out_i = g_h local_i + (1 - g_h) S_i, with g_h in (0, 1) (``mix``, (H,); the module
  that learns it takes g = sigmoid(theta)).
* ``"shared"``, LoLCATs' shared normalisation: both parts' unnormalised sums over one normaliser,

      out_i = (sum_{W(i)} exp(a_ij) v_j + gamma_h D_i S_i) / (sum_{W(i)} exp(a_ij) + gamma_h D_i),

  with gamma_h > 0 (``mix``, (H,); the module takes gamma = softplus(rho)). D_i S_i is the sliced
  kernel's unnormalised numerator N_i: for the ReLU kernel S_i = N_i / D_i with
  D_i = sum_l |s_i - t_l|; for the bump kernel D_i = n, the number of valid keys it divides by.
  With M slices, S_i is the mean of the slices' N_mi / D_mi and D_i the mean of their D_mi
  (for M = 1, exactly N_i / D_i). Dividing through by sum_{W(i)} exp(a_ij) = exp(lse_i), this is

      out_i = alpha_i local_i + (1 - alpha_i) S_i,   alpha_i = sigmoid(lse_i - log gamma_h - log D_i),

  which is how it is computed: no exponential of a score is formed outside the softmax, so it
  cannot overflow. A query without valid keys in its window (lse_i = -inf) gets S_i; one with
  D_i = 0 gets local_i; one with neither gets 0.

Shapes: query, key (B, H, T, Dk), value (B, H, T, D), sliced (B, H, T, D), mix (H,),
denominator (B, H, T) or (B, H, M, T), key_padding_mask (B, T) bool (True = real key)
-> (B, H, T, D) in sliced's dtype; float16 / bfloat16 are combined in float32. Self-attention
only (queries and keys share T).

Cost: the window's softmax is :func:`.banded.windowed_softmax` (its log-normaliser with
``return_lse``): O(T * w * D) time and O(T * (w + D)) memory per head, never a (T, T) tensor.
The sliced term and its D come from :func:`.sliced_relu.sliced_relu` or
:func:`.sliced_relu_bump.sliced_relu_bump` (``return_denominator``): O(T log T) per head.
Everything is differentiable in query, key, value, sliced, mix and denominator. On CPU, for a window of at most
:data:`.local_window_cpu.MAX_WINDOW` keys each side, the window and the combination are one C++ kernel
(:func:`.local_window_cpu.local_window_cpu`, the same function in one pass over the tokens).

ReLA (arXiv 2104.07012) takes the same window in :func:`rela_local_window_attention`. Its global term
is ReLA's output as a layer without a window gives it, after its gated RMSNorm over all heads:
G_i = norm(N)_i with N_i = sum_j ReLU(a_ij) v_j (:func:`.rela.rela` with ``return_denominator``, then
:func:`.norm.gated_rms_norm`), and its normaliser is ReLA's total weight D_i = sum_j ReLU(a_ij). So "gate" is
g_h local_i + (1 - g_h) G_i and "shared" is (sum_{W(i)} exp(a_ij) v_j + gamma_h D_i G_i) / (sum_{W(i)} exp(a_ij)
+ gamma_h D_i). The norm acts on ReLA's term only, never on the window's softmax: where the window holds the
mass, the output is the checkpoint's own softmax output, not rescaled per token (normalising after combining
made the window inexact and stalled the transfer). ReLA is quadratic already: the window adds O(T * w * D)
to its O(T^2 * D). On CPU, for a window of at most :data:`.local_window_cpu.MAX_WINDOW_NORMED` keys each side,
ReLA's kernel, the norm, the window and the combination are one autograd node
(:func:`.local_window_cpu.rela_local_window_cpu`): ReLA's kernel computes the window beside its own scores and, in
its backward, adds the window's score gradients into its own, so one pass gives both attentions' q, k, v
gradients; the norm and the combination are one pass over the tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import local_window_cpu, rela_cpu
from ._common import compute_dtype
from .banded import windowed_softmax
from .norm import gated_rms_norm
from .rela import rela

__all__ = ["WINDOW_COMBINES", "local_window_attention", "rela_local_window_attention"]

WINDOW_COMBINES = ("gate", "shared")
"""The ways :func:`local_window_attention` combines the window's softmax with the sliced term."""


def _check_window(query: Tensor, mix: Tensor, window: int, combine: str) -> None:
    """Raise ValueError for a window, combination or mix that the window's ops cannot take."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1 (the keys with |i - j| <= window), got {window!r}")
    if combine not in WINDOW_COMBINES:
        raise ValueError(f"combine={combine!r} is not valid: use one of {list(WINDOW_COMBINES)}")
    heads = query.shape[1]
    if tuple(mix.shape) != (heads,):
        raise ValueError(f"mix must have shape (H,) = {(heads,)}, got {tuple(mix.shape)}")


def _check(
    query: Tensor, value: Tensor, sliced: Tensor, mix: Tensor, denominator: Tensor | None, window: int, combine: str
) -> None:
    """Raise ValueError for a window, combination or shape :func:`local_window_attention` cannot take."""
    _check_window(query, mix, window, combine)
    if sliced.shape != value.shape:
        raise ValueError(
            f"sliced must have value's shape (B, H, T, D) = {tuple(value.shape)}, got {tuple(sliced.shape)}"
        )
    heads = query.shape[1]
    if combine == "shared":
        if denominator is None:
            raise ValueError("combine='shared' needs the sliced kernel's denominator D (B, H, T) or (B, H, M, T)")
        batch, length = query.shape[0], query.shape[2]
        lead, last = tuple(denominator.shape[:2]), denominator.shape[-1]
        if denominator.dim() not in (3, 4) or lead != (batch, heads) or last != length:
            raise ValueError(
                f"denominator must have shape (B, H, T) or (B, H, M, T) with (B, H, T) = {(batch, heads, length)}, "
                f"got {tuple(denominator.shape)}"
            )


def _kernel_path(query: Tensor, window: int, widest: int) -> bool:
    """Whether the C++ kernel of :mod:`.local_window_cpu` computes this window: CPU tensors, the kernel built, and
    a window no wider than ``widest`` (where its direct loops are measured faster)."""
    return query.device.type == "cpu" and window <= widest and local_window_cpu.available()


def _valid_keys(key_padding_mask: Tensor | None, query: Tensor) -> Tensor:
    """key_padding_mask, or every key valid: (B, T) bool."""
    if key_padding_mask is not None:
        return key_padding_mask
    return torch.ones(query.shape[0], query.shape[2], dtype=torch.bool, device=query.device)


def _shared_weight(lse: Tensor, denominator: Tensor, gamma: Tensor) -> Tensor:
    """alpha = sigmoid(lse - log gamma - log D), (B, H, T, 1): the window's share of the shared
    normaliser; 1 where D = 0 (no sliced mass), 0 where lse = -inf and D > 0 (no key in the window)."""
    if denominator.dim() == 4:
        denominator = denominator.mean(2)
    positive = denominator > 0
    log_d = torch.where(positive, denominator, 1.0).log()
    logit = lse - gamma.clamp_min(torch.finfo(gamma.dtype).tiny).log()[:, None] - log_d
    return torch.where(positive, torch.sigmoid(logit), 1.0).unsqueeze(-1)


def local_window_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    sliced: Tensor,
    mix: Tensor,
    key_padding_mask: Tensor | None = None,
    *,
    window: int,
    combine: str = "gate",
    denominator: Tensor | None = None,
    scaling: float | None = None,
) -> Tensor:
    """Softmax over the keys within ``window`` of each query, combined with the global ``sliced`` term
    by ``combine`` ("gate": g_h = ``mix``; "shared": gamma_h = ``mix`` and the sliced ``denominator``);
    see the module docstring for the maths, shapes and cost. ``scaling`` defaults to Dk^-1/2.
    """
    _check(query, value, sliced, mix, denominator, window, combine)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if _kernel_path(query, window, local_window_cpu.MAX_WINDOW):
        if denominator is not None and denominator.dim() == 4:
            denominator = denominator.mean(2)
        return local_window_cpu.local_window_cpu(query, key, value, _valid_keys(key_padding_mask, query), sliced,
                                                 denominator, mix, window=window, combine=combine, scaling=scaling)
    work = compute_dtype(sliced.dtype)
    length = query.shape[2]
    # |i - j| <= w is windowed_softmax's sliding_window w + 1; beyond T - 1 every key is in it,
    # and a smaller band is the same function at less cost.
    sliding_window = min(window, max(length - 1, 0)) + 1
    attended = windowed_softmax(query, key, value, key_padding_mask, scaling=scaling, sliding_window=sliding_window,
                                return_lse=combine == "shared")
    mix = mix.to(work)
    if combine == "gate":
        local, weight = attended, mix[:, None, None]
    else:
        local, lse = attended
        weight = _shared_weight(lse.to(work), denominator.to(work), mix)
    return torch.lerp(sliced.to(work), local.to(work), weight).to(sliced.dtype)


def rela_local_window_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mix: Tensor,
    key_padding_mask: Tensor | None = None,
    *,
    norm_scale: Tensor,
    norm_gate: Tensor,
    norm_eps: float = 1e-6,
    window: int,
    combine: str = "gate",
    scaling: float | None = None,
) -> Tensor:
    """Softmax over the keys within ``window`` of each query, combined with global ReLA after its gated RMSNorm by
    ``combine``: "gate", g_h = ``mix``; "shared", gamma_h = ``mix`` and ReLA's total weight D in the shared
    normaliser (module docstring). The norm, y = norm_scale * x * rsqrt(mean(x^2) + norm_eps) *
    sigmoid(norm_gate * x), runs over the H*D features of a token's heads together (``norm_scale``,
    ``norm_gate`` (H*D,)). query, key, value (B, H, T, D) -> (B, H, T, D) in value's dtype; ``scaling``
    (default D^-1/2) scales the scores of both parts.
    """
    _check_window(query, mix, window, combine)
    features = query.shape[1] * value.shape[-1]
    for name, param in (("norm_scale", norm_scale), ("norm_gate", norm_gate)):
        if tuple(param.shape) != (features,):
            raise ValueError(f"{name} must have shape (H*D,) = ({features},), got {tuple(param.shape)}")
    if _kernel_path(query, window, local_window_cpu.MAX_WINDOW_NORMED) and rela_cpu.available():
        return local_window_cpu.rela_local_window_cpu(
            query, key, value, _valid_keys(key_padding_mask, query), mix, window=window, combine=combine,
            scaling=query.shape[-1] ** -0.5 if scaling is None else scaling, norm_scale=norm_scale,
            norm_gate=norm_gate, norm_eps=norm_eps,
        )
    numerator, denominator = rela(query, key, value, key_padding_mask, scaling=scaling, return_denominator=True)
    batch, heads, length, dim = numerator.shape
    tokens = numerator.transpose(1, 2).reshape(batch, length, heads * dim)
    normalised = gated_rms_norm(tokens, norm_scale, norm_gate, norm_eps).view(batch, length, heads, dim)
    return local_window_attention(query, key, value, normalised.transpose(1, 2), mix, key_padding_mask,
                                  window=window, combine=combine, denominator=denominator, scaling=scaling)
