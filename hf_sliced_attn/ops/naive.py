"""Quadratic float64 references for every op in :mod:`hf_sliced_attn.ops`.

They materialise the full (Tq, Tk) interaction matrix, so they are only for tests and
small inputs. Each fast op in this package is checked against its reference here,
values and gradients.

Conventions shared by all ops:

* ``key_padding_mask`` is a (B, Tk) bool tensor, True for a real token. Masked keys take
  part in no sum.
* ``sliding_window`` w keeps the pairs with |i - j| <= w - 1 (query i and key j indexed
  from 0 in their own sequences), which is what ModernBERT's local layers pass.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._common import pair_mask

PairKernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def sliced_kernel_reference(
    kernel: PairKernel,
    query_scalars: torch.Tensor,
    key_scalars: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    sliding_window: int | None = None,
    *,
    centre_values: bool = False,
) -> torch.Tensor:
    """A sliced kernel attention, computed pair by pair in float64.

    For one head and one slice, with s = query scalars and t = key scalars,

        out_i = sum_j W_ij v_j                   (centre_values=False)
        out_i = sum_j W_ij (v_j - vbar_i)        (centre_values=True)

    where W = kernel(d, mask), d_ij = s_i - t_j (B, H, M, Tq, Tk) and mask (B, 1, 1, Tq, Tk)
    float64, 1 where query i may see key j (valid, and inside the window if any); W is
    taken as 0 outside the mask. The kernel does its own normalisation over the keys each
    query sees (``mask.sum(-1)`` counts them). vbar_i is the mean value of those keys. With
    M slices the M outputs are averaged.

    Shapes: query_scalars (B, H, Tq) or (B, H, M, Tq); key_scalars (B, H, Tk) or
    (B, H, M, Tk); value (B, H, Tk, D) -> (B, H, Tq, D) in value's dtype.
    """
    if query_scalars.dim() == 3:
        query_scalars, key_scalars = query_scalars.unsqueeze(2), key_scalars.unsqueeze(2)
    s = query_scalars.double()  # (B, H, M, Tq)
    t = key_scalars.double()  # (B, H, M, Tk)
    v = value.double().unsqueeze(2)  # (B, H, 1, Tk, D)
    batch, _, _, q_len = s.shape
    k_len = t.shape[-1]
    mask = pair_mask(batch, q_len, k_len, key_padding_mask, sliding_window, s.device).unsqueeze(2).double()
    weights = kernel(s[..., :, None] - t[..., None, :], mask) * mask  # (B, H, M, Tq, Tk)
    out = weights @ v  # (B, H, M, Tq, D)
    if centre_values:
        vbar = (mask @ v) / mask.sum(-1, keepdim=True).clamp_min(1)  # (B, H, 1, Tq, D)
        out = out - weights.sum(-1, keepdim=True) * vbar
    return out.mean(2).to(value.dtype)


def _relu_kernel(diff: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ReLU(s_i - t_j) / sum_l |s_i - t_l| over the keys i sees; a row with denominator 0 is 0."""
    denominator = (diff.abs() * mask).sum(-1, keepdim=True)
    positive = denominator > 0
    return torch.relu(diff) * torch.where(positive, 1 / torch.where(positive, denominator, 1.0), 0.0)


def sliced_relu_reference(
    query_scalars: torch.Tensor,
    key_scalars: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Sliced ReLU attention (arXiv 2512.11411), computed pair by pair in float64.

    For one head and one slice, with s = query scalars and t = key scalars:

        out_i = sum_j ReLU(s_i - t_j) (v_j - vbar_i) / sum_l |s_i - t_l|

    where j and l run over the keys query i may see (valid, and inside the window if
    any) and vbar_i is the mean of those keys' values. A query whose denominator is 0
    gets 0. With M slices the M kernels' outputs are averaged.

    Shapes: query_scalars (B, H, Tq) or (B, H, M, Tq); key_scalars (B, H, Tk) or
    (B, H, M, Tk); value (B, H, Tk, D) -> (B, H, Tq, D) in value's dtype.
    """
    return sliced_kernel_reference(
        _relu_kernel, query_scalars, key_scalars, value, key_padding_mask, sliding_window, centre_values=True
    )


def sliced_relu_bump_reference(
    query_scalars: torch.Tensor,
    key_scalars: torch.Tensor,
    value: torch.Tensor,
    bandwidth: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Sliced ReLU bump attention (the authors' second kernel), computed pair by pair in float64.

    For one head and one slice, with s = query scalars, t = key scalars and b > 0 the
    head's (and slice's) bandwidth:

        out_i = (1 / n_i) sum_j max(0, 1 - |s_i - t_j| / b) v_j

    where j runs over the n_i keys query i may see (valid, and inside the window if any);
    a query that sees no key gets 0. With M slices the M outputs are averaged.

    Shapes: query_scalars (B, H, Tq) with bandwidth (H,), or (B, H, M, Tq) with bandwidth
    (H, M); key_scalars (B, H, Tk) or (B, H, M, Tk); value (B, H, Tk, D)
    -> (B, H, Tq, D) in value's dtype.
    """
    b = bandwidth.double().reshape(1, bandwidth.shape[0], -1, 1, 1)  # (1, H, M, 1, 1)

    def bump(diff: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.relu(1 - diff.abs() / b) / mask.sum(-1, keepdim=True).clamp_min(1)

    return sliced_kernel_reference(bump, query_scalars, key_scalars, value, key_padding_mask, sliding_window)


def value_mean_reference(
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Mean of the values of the keys each query may see, in float64; 0 where it sees none.

    value (B, H, T, D) -> (B, H, T, D) in value's dtype (one row per query, with or
    without a window).
    """
    batch, _, length, _ = value.shape
    mask = pair_mask(batch, length, length, key_padding_mask, sliding_window, value.device).double()
    return ((mask @ value.double()) / mask.sum(-1, keepdim=True).clamp_min(1)).to(value.dtype)


def rela_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    *,
    scaling: float | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Rectified linear attention (arXiv 2104.07012) before its norm, in float64.

        out = ReLU(Q K^T * scaling) V,   scaling defaults to D^-1/2,

    with masked pairs contributing exactly 0. Shapes: query (B, H, Tq, D), key and
    value (B, H, Tk, D) -> (B, H, Tq, D) in query's dtype.
    """
    weights = rela_weights_reference(query, key, key_padding_mask, scaling=scaling, sliding_window=sliding_window)
    return (weights @ value.double()).to(query.dtype)


def rela_weights_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    *,
    scaling: float | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """The full ReLA weight matrix ReLU(Q K^T * scaling), masked pairs 0: (B, H, Tq, Tk), float64."""
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    mask = pair_mask(query.shape[0], query.shape[2], key.shape[2], key_padding_mask, sliding_window, query.device)
    return (query.double() @ key.double().transpose(-1, -2) * scaling).clamp_min(0) * mask


def gated_rms_norm_reference(
    x: torch.Tensor, scale: torch.Tensor, gate: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """y = scale * x * rsqrt(mean(x^2) + eps) * sigmoid(gate * x) over the last dim, float64."""
    x64 = x.double()
    rms = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return (scale.double() * x64 * rms * torch.sigmoid(gate.double() * x64)).to(x.dtype)


def windowed_softmax_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    *,
    scaling: float | None = None,
    sliding_window: int | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention over the allowed pairs, in float64; a query with no allowed key gets 0.

    Shapes as :func:`rela_reference`. With ``return_lse``, also the log-normaliser
    lse_i = log sum_j exp(scaling q_i . k_j) over the allowed keys of query i, (B, H, Tq) in float64,
    -inf for a query with none.
    """
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    q, k, v = query.double(), key.double(), value.double()
    mask = pair_mask(q.shape[0], q.shape[2], k.shape[2], key_padding_mask, sliding_window, q.device)
    scores = (q @ k.transpose(-1, -2) * scaling).masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    out = (weights @ v).to(query.dtype)
    return (out, torch.logsumexp(scores, dim=-1)) if return_lse else out


def local_window_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    query_scalars: torch.Tensor,
    key_scalars: torch.Tensor,
    mix: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    *,
    window: int,
    combine: str = "gate",
    scaling: float | None = None,
    bandwidth: torch.Tensor | None = None,
    gain: torch.Tensor | None = None,
    mean_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax within |i - j| <= ``window`` combined with global sliced attention, pair by pair in float64.

    The sliced term S is :func:`sliced_relu_reference` (or :func:`sliced_relu_bump_reference` with a
    ``bandwidth``) over every valid key, then, given ``gain`` and ``mean_weight`` (H,),
    gain_h S + mean_weight_h vbar (vbar the mean valid value). With a_ij = scaling q_i . k_j and W(i)
    the valid keys within the window:

    * ``combine="gate"``: out_i = g_h softmax_W(a_i) v + (1 - g_h) S_i, g = ``mix`` (H,);
    * ``combine="shared"``: out_i = (sum_W exp(a_ij) v_j + gamma_h D_i S_i) / (sum_W exp(a_ij) + gamma_h D_i),
      gamma = ``mix`` (H,), D_i the mean over slices of sum_l |s_i - t_l| (ReLU kernel) or the number
      of valid keys (bump kernel); written as is (each row's largest score factored out of both
      sums), 0 where both sums are 0.

    Shapes: query, key (B, H, T, Dk), value (B, H, T, D), scalars (B, H, T) or (B, H, M, T)
    -> (B, H, T, D) in value's dtype.
    """
    q, k, v = query.double(), key.double(), value.double()
    batch, heads, length, _ = v.shape
    s, t = query_scalars.double(), key_scalars.double()
    if bandwidth is None:
        sliced = sliced_relu_reference(s, t, v, key_padding_mask)
    else:
        sliced = sliced_relu_bump_reference(s, t, v, bandwidth.double(), key_padding_mask)
    if gain is not None:
        per_head = gain.double()[:, None, None], mean_weight.double()[:, None, None]
        sliced = per_head[0] * sliced + per_head[1] * value_mean_reference(v, key_padding_mask)
    if s.dim() == 3:
        s, t = s.unsqueeze(2), t.unsqueeze(2)
    everywhere = pair_mask(batch, length, length, key_padding_mask, None, v.device).unsqueeze(2)  # (B, 1, 1, T, T)
    if bandwidth is None:
        denominator = ((s[..., :, None] - t[..., None, :]).abs() * everywhere).sum(-1).mean(2)  # (B, H, T)
    else:
        denominator = everywhere.sum(-1).double().expand(batch, heads, 1, length).mean(2)
    return _window_combination_reference(q, k, v, sliced, denominator, mix, key_padding_mask, window=window,
                                         combine=combine, scaling=scaling).to(value.dtype)


def rela_local_window_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mix: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    *,
    norm_scale: torch.Tensor,
    norm_gate: torch.Tensor,
    norm_eps: float = 1e-6,
    window: int,
    combine: str = "gate",
    scaling: float | None = None,
) -> torch.Tensor:
    """Softmax within |i - j| <= ``window`` combined with global ReLA after its gated RMSNorm, in float64.

    With A = :func:`rela_weights_reference` over every valid key, N_i = sum_j A_ij v_j, D_i = sum_j A_ij and
    G = :func:`gated_rms_norm_reference` of N over each token's H*D features (``norm_scale``, ``norm_gate``):

    * ``combine="gate"``: out_i = g_h softmax_W(a_i) v + (1 - g_h) G_i, g = ``mix`` (H,);
    * ``combine="shared"``: out_i = (sum_W exp(a_ij) v_j + gamma_h D_i G_i) / (sum_W exp(a_ij) + gamma_h D_i),
      gamma = ``mix`` (H,), 0 where both sums are 0.

    Shapes: query, key, value (B, H, T, D) -> (B, H, T, D) in value's dtype.
    """
    q, k, v = query.double(), key.double(), value.double()
    batch, heads, length, dim = v.shape
    weights = rela_weights_reference(q, k, key_padding_mask, scaling=scaling)
    numerator, denominator = weights @ v, weights.sum(-1)
    tokens = numerator.transpose(1, 2).reshape(batch, length, heads * dim)
    normalised = gated_rms_norm_reference(tokens, norm_scale, norm_gate, norm_eps)
    global_term = normalised.view(batch, length, heads, dim).transpose(1, 2)
    return _window_combination_reference(q, k, v, global_term, denominator, mix, key_padding_mask, window=window,
                                         combine=combine, scaling=scaling).to(value.dtype)


def _window_combination_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    global_term: torch.Tensor,
    denominator: torch.Tensor,
    mix: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    *,
    window: int,
    combine: str,
    scaling: float | None,
) -> torch.Tensor:
    """Softmax within |i - j| <= ``window`` (a_ij = scaling q_i . k_j) combined with a global term S (B, H, T, D),
    float64 in and out. ``"gate"``: g_h local_i + (1 - g_h) S_i, g = ``mix``. ``"shared"``:
    (sum_W exp(a_ij) v_j + gamma_h D_i S_i) / (sum_W exp(a_ij) + gamma_h D_i), gamma = ``mix`` and D
    (B, H, T) the global term's normaliser, written as is (each row's largest score factored out of
    both sums), 0 where both sums are 0; the gate does not read D."""
    batch, _, length, _ = v.shape
    mix = mix.double()[:, None, None]
    if combine == "gate":
        local = windowed_softmax_reference(q, k, v, key_padding_mask, scaling=scaling, sliding_window=window + 1)
        return mix * local + (1 - mix) * global_term
    scaling = q.shape[-1] ** -0.5 if scaling is None else scaling
    in_window = pair_mask(batch, length, length, key_padding_mask, window + 1, v.device)
    scores = (q @ k.transpose(-1, -2) * scaling).masked_fill(~in_window, float("-inf"))
    # Each row's largest score, factored out of both sums (the ratio does not depend on it).
    top = scores.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0).detach()  # (B, H, T, 1)
    weights = torch.exp(scores - top)  # 0 outside the window
    global_weight = mix * torch.exp(-top) * denominator.unsqueeze(-1)
    numerator = weights @ v + global_weight * global_term
    total = weights.sum(-1, keepdim=True) + global_weight
    return torch.where(total > 0, numerator / torch.where(total > 0, total, 1.0), 0.0)
