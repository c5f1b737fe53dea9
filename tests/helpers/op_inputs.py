"""Random inputs of the attention ops, drawn from one seeded generator, for every op test."""

from __future__ import annotations

import torch


def key_padding(
    batch: int, k_len: int, padded_fraction: float, *, seed: int = 0, generator: torch.Generator | None = None,
    real_first_row: bool = False, padded_last_row: bool = False,
) -> torch.Tensor:
    """A (B, Tk) key padding mask, True at a real key: each key padded with probability
    ``padded_fraction``, drawn from ``generator`` (else a new one seeded ``seed``). Then, as asked,
    the first row is made all real and the last one all padded (a row with no valid key)."""
    generator = generator or torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, k_len, generator=generator) > padded_fraction
    if real_first_row:
        mask[0] = True
    if padded_last_row:
        mask[-1] = False
    return mask


def attention_inputs(
    batch: int, heads: int, slices: int | None, q_len: int, k_len: int, dim: int, *,
    scalars: bool = True, bandwidth: bool = False, padded_fraction: float | None = None,
    real_first_row: bool = False, padded_last_row: bool = False, value_offset: float = 0.0,
    dtype: torch.dtype = torch.float32, seed: int = 0, device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, ...]:
    """Random inputs of an attention op, drawn in this order from one generator seeded ``seed``:

    - with ``scalars`` (the sliced ops; value_mean takes none), the query and key scalars s
      (B, H, Tq) and t (B, H, Tk), or (B, H, M, Tq) and (B, H, M, Tk) with M ``slices``, standard normal;
    - the value v (B, H, Tk, D), standard normal plus ``value_offset`` (real values have a mean far from 0);
    - with ``bandwidth``, the bump kernel's bandwidth, (H,) or (H, M), uniform in [0.3, 1.5): its
      windows hold a few to most keys;
    - with a ``padded_fraction``, a key padding mask (see :func:`key_padding`, which
      ``real_first_row`` and ``padded_last_row`` go to).

    Returns those drawn, in that order, the floating ones cast to ``dtype``, all on ``device``.
    """
    generator = torch.Generator().manual_seed(seed)
    lead = (batch, heads) if slices is None else (batch, heads, slices)
    drawn = []
    if scalars:
        drawn += [torch.randn(*lead, q_len, generator=generator), torch.randn(*lead, k_len, generator=generator)]
    drawn.append(torch.randn(batch, heads, k_len, dim, generator=generator) + value_offset)
    if bandwidth:
        drawn.append(0.3 + 1.2 * torch.rand(lead[1:], generator=generator))
    drawn = [x.to(device, dtype) for x in drawn]
    if padded_fraction is not None:
        drawn.append(key_padding(batch, k_len, padded_fraction, generator=generator, real_first_row=real_first_row,
                                 padded_last_row=padded_last_row).to(device))
    return tuple(drawn)


def rows_with_gradient(length: int, kind: str) -> torch.Tensor:
    """A bool (T,) of the tokens a loss reads (the other rows' output gradients 0): ``"first"`` the first alone (an
    encoder's last layer under a pooler that reads [CLS]); ``"scattered"`` tokens 0, 3 and 7 and, in a second tile
    of 256 queries, 280 (rows without a gradient before, between and after rows with one)."""
    rows = torch.zeros(length, dtype=torch.bool)
    rows[[i for i in ((0,) if kind == "first" else (0, 3, 7, 280)) if i < length]] = True
    return rows
