"""transformers' attention-function signature around each mechanism's ``attend``.

Each function has the signature ``fn(module, query, key, value, attention_mask, *, scaling,
dropout, **kwargs) -> (output, None)`` with query/key/value (B, H, T, D) and the output
(B, T, H, D). ``attention_mask`` is what the mask builder registered next to it gives: a
(B, T) bool padding mask (True = real token) or None. ModernBERT's local layers pass
``sliding_window`` w (pairs with |i - j| <= w - 1).

A layer the user chose to keep on softmax (see ``layers`` in
:class:`hf_sliced_attn.mechanisms.MechanismConfig`) is marked so at construction and runs
softmax here, within its window if it has one. A layer with neither mark was built
without the plugin's modules, and gets an error rather than any other attention.

Attention-probability dropout has no counterpart: these mechanisms never form the
attention matrix, so ``dropout`` is not applied (the residual dropouts still are).
No attention weights are returned; :mod:`hf_sliced_attn.mechanisms.rela.analysis` measures ReLA's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .mechanisms import Mechanism
from .ops import windowed_softmax

LAYER_MODE_ATTR = "hf_sliced_attn_mode"
"""Set on every patched attention module: the mechanism's name, or "softmax" for a kept layer."""

SOFTMAX = "softmax"

AttentionObserver = Callable[..., None]
_observers: list[AttentionObserver] = []


@contextmanager
def observe_attention(observer: AttentionObserver) -> Iterator[None]:
    """Within the block, call ``observer(module=, mechanism=, query=, key=, value=,
    key_padding_mask=, scaling=, sliding_window=)`` on every converted layer's inputs,
    before the attention runs (used by the ReLA sparsity analysis)."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)


def observing() -> bool:
    """Whether an :func:`observe_attention` block is open (converted layers must then form q and k)."""
    return bool(_observers)


def key_padding_mask_from(attention_mask: torch.Tensor | None, batch: int, key_length: int) -> torch.Tensor | None:
    """Check the mask given by the registered builder: a (B, Tk) bool or None."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2 or attention_mask.shape != (batch, key_length):
        raise ValueError(
            f"hf_sliced_attn expects a (batch, key_length) = {(batch, key_length)} padding mask, "
            f"got shape {tuple(attention_mask.shape)}. 4D or custom masks are not supported by the plugin's "
            "attention: pass the usual 2D attention_mask of 0/1 to the model."
        )
    return attention_mask.bool()


def _layer_mode(module: nn.Module, mechanism: str) -> str:
    mode = getattr(module, LAYER_MODE_ATTR, None)
    if mode is None:
        raise RuntimeError(
            f"{type(module).__name__} was built without the modules {mechanism!r} needs. Load the model with "
            f"`from_pretrained(..., attn_implementation={mechanism!r})` (with `import hf_sliced_attn` first), or "
            f"call `model.set_attn_implementation({mechanism!r})` on a supported model to attach new ones."
        )
    if mode not in (mechanism, SOFTMAX):
        raise RuntimeError(
            f"This layer was built for {mode!r} but the model now asks for {mechanism!r}: reload the model "
            f"with attn_implementation={mode!r}."
        )
    return mode


def _softmax_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    key_padding_mask: torch.Tensor | None, scaling: float | None, dropout: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """Softmax attention for a layer kept on softmax: (B, H, T, D) inputs -> (B, T, H, D)."""
    if sliding_window is not None:
        out = windowed_softmax(query, key, value, key_padding_mask, scaling=scaling, sliding_window=sliding_window)
        return out.transpose(1, 2)
    mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
    out, _ = sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling, is_causal=False)
    # A fully padded row has no key to attend to; give it 0 as the other mechanisms do.
    return out.nan_to_num(0.0)


def attention_function(mechanism: Mechanism) -> Callable[..., tuple[torch.Tensor, None]]:
    """The function registered with transformers' ``AttentionInterface`` for ``mechanism``."""

    def attention_forward(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *,
        scaling: float | None = None,
        dropout: float = 0.0,
        sliding_window: int | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        padding = key_padding_mask_from(attention_mask, key.shape[0], key.shape[2])
        if _layer_mode(module, mechanism.name) == SOFTMAX:
            return _softmax_attention(module, query, key, value, padding, scaling, dropout, sliding_window), None
        for observer in _observers:
            observer(module=module, mechanism=mechanism.name, query=query, key=key, value=value,
                     key_padding_mask=padding, scaling=scaling, sliding_window=sliding_window)
        return mechanism.attend(module, query, key, value, padding, scaling, sliding_window), None

    attention_forward.__name__ = attention_forward.__qualname__ = f"{mechanism.name}_attention_forward"
    return attention_forward
