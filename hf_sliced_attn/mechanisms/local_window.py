"""A local softmax window beside a mechanism's global attention: its two options and its per-head weights.

As LoLCATs (arXiv 2410.10254) and RAttention (arXiv 2506.15545) pair a sliding softmax window with a
linear attention, a mechanism that takes :class:`WindowedConfig`'s options lets each head of a global
layer also attend with the checkpoint's own softmax to the keys within ``local_window`` of each query,
and combines the two per head (``window_combine``) with the weights of :class:`LocalWindowGate` or
:class:`LocalWindowShare`. The maths is :mod:`hf_sliced_attn.ops.local_window`; each mechanism keeps
these modules under its own attribute names (:func:`window_attributes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import initialization as init

from ..ops.local_window import WINDOW_COMBINES
from .base import MechanismConfig, PluginModule


@dataclass
class WindowedConfig(MechanismConfig):
    """The options of a mechanism that can add a local softmax window to its global layers."""

    local_window: int = field(
        default=0,
        metadata={
            "help": (
                "w > 0: each head also attends with the checkpoint's own softmax (its scaled q.k scores) to the "
                "keys with |i - j| <= w, and combines that with the mechanism's attention to the whole sequence "
                "by learned per-head weights (window_combine), as LoLCATs (arXiv 2410.10254) and RAttention "
                "(arXiv 2506.15545) pair a sliding softmax window with a linear attention. Costs O(T*w) more. "
                "Applies on global layers; ModernBERT's local (sliding-window) layers keep the mechanism's "
                "windowed kernel. 0: no window, the paper's formula."
            )
        },
    )
    window_combine: str = field(
        default="shared",
        metadata={
            "help": (
                "How a local_window's softmax and the mechanism's attention combine, per head h. 'gate': "
                "g_h * softmax + (1 - g_h) * attention, g_h = sigmoid(theta_h), theta from 0 (g = 1/2). 'shared': "
                "LoLCATs' shared normaliser (arXiv 2410.10254), (sum_window exp(a_ij) v_j + gamma_h N_i) / "
                "(sum_window exp(a_ij) + gamma_h D_i), N_i the attention's unnormalised output and D_i its "
                "normaliser (sliced_relu: N_i / D_i its output after any gain and mean value, D_i = "
                "sum_l |s_i - t_l|, or n for the bump kernel; rela: N_i / D_i its output after its gated RMSNorm, "
                "D_i = sum_j ReLU(a_ij); the norm never rescales the window's softmax), gamma_h = softplus(rho_h) "
                "from 1: each query's share follows its softmax mass. 'shared' is the default: converting "
                "all-MiniLM-L6-v2 with every layer converted to sliced_relu, it kept more accuracy and fidelity "
                "than the gate (benchmarks/README.md, \"Every layer converted\"). Only with local_window > 0."
            ),
            "choices": WINDOW_COMBINES,
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.local_window, int) or isinstance(self.local_window, bool) or self.local_window < 0:
            raise ValueError(
                f"local_window={self.local_window!r} is not valid: it must be an integer >= 0 (0: no window; "
                "w > 0: softmax over the keys with |i - j| <= w)."
            )
        if self.local_window == 0 and self.window_combine != "shared":
            raise ValueError(
                f"window_combine={self.window_combine!r} needs a local window: set local_window to a positive "
                "number of tokens (e.g. local_window=64), or leave window_combine out (with local_window=0 there "
                "is no softmax window to combine)."
            )

    def to_dict(self) -> dict[str, Any]:
        """As :meth:`MechanismConfig.to_dict`, without ``local_window`` and ``window_combine`` when there is no
        window (``local_window=0``): the saved options are then those of a checkpoint saved before these
        options existed, which earlier versions of the plugin load (they refuse options they do not know)."""
        saved = super().to_dict()
        if self.local_window == 0:
            del saved["local_window"], saved["window_combine"]
        return saved

    def describe_window(self) -> list[str]:
        """The model card's phrase for the window, if there is one."""
        if not self.local_window:
            return []
        how = "a learned gate per head" if self.window_combine == "gate" else "a shared normaliser (LoLCATs)"
        return [f"softmax within {self.local_window} tokens of each query, combined by {how}"]


class LocalWindowGate(PluginModule):
    """The gate between a layer's local softmax window and its global attention (``window_combine="gate"``):
    out = g_h * softmax_window + (1 - g_h) * attention, g_h = sigmoid(theta_h), one per head.

    ``theta`` is (H,) and starts at 0, g = 1/2: neither part dominates at first, and the sigmoid's
    slope is largest there (1/4), so each head's gate moves fastest towards whichever part the
    training pulls it. ``window`` w is the softmax's reach, |i - j| <= w. ``forward()`` returns g (H,).
    """

    combine = "gate"

    def __init__(self, num_heads: int, window: int) -> None:
        super().__init__()
        self.num_heads, self.window = num_heads, window
        self.theta = nn.Parameter(torch.empty(num_heads))

    def init_weights(self, initializer_range: float) -> None:
        init.zeros_(self.theta)

    def forward(self) -> torch.Tensor:
        return torch.sigmoid(self.theta)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, window={self.window}"


class LocalWindowShare(PluginModule):
    """The weight of the global attention in a shared normaliser with the local softmax window
    (``window_combine="shared"``, LoLCATs, arXiv 2410.10254):
    out_i = (sum_window exp(a_ij) v_j + gamma_h N_i) / (sum_window exp(a_ij) + gamma_h D_i),
    gamma_h = softplus(rho_h), one per head (N_i the attention's unnormalised output, D_i its normaliser).

    ``rho`` is (H,) and starts at log(e - 1), gamma = 1: the two unnormalised sums added as they
    are, the formula without a reweighting. The softplus keeps gamma positive. ``window`` w is the
    softmax's reach, |i - j| <= w. ``forward()`` returns gamma (H,).
    """

    combine = "shared"
    INITIAL_RHO = math.log(math.expm1(1.0))  # softplus(rho) = 1

    def __init__(self, num_heads: int, window: int) -> None:
        super().__init__()
        self.num_heads, self.window = num_heads, window
        self.rho = nn.Parameter(torch.empty(num_heads))

    def init_weights(self, initializer_range: float) -> None:
        init.constant_(self.rho, self.INITIAL_RHO)

    def forward(self) -> torch.Tensor:
        return nn.functional.softplus(self.rho)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, window={self.window}"


WINDOW_CLASSES: dict[str, type[LocalWindowGate] | type[LocalWindowShare]] = {
    "gate": LocalWindowGate,
    "shared": LocalWindowShare,
}
"""``window_combine`` -> the class of the module that holds its per-head weights."""


def window_attributes(prefix: str) -> dict[str, str]:
    """``window_combine`` -> the attribute a mechanism keeps that module under: ``<prefix>_window_gate`` or
    ``<prefix>_window_share`` (these names are the checkpoint's state-dict keys)."""
    return {"gate": f"{prefix}_window_gate", "shared": f"{prefix}_window_share"}


def build_window_module(options: WindowedConfig, num_heads: int, local: bool, prefix: str) -> dict[str, nn.Module]:
    """The window module of ``options`` under its attribute, on a global layer with ``local_window`` > 0;
    nothing on a ``local`` (sliding-window) layer or without a window."""
    if options.local_window == 0 or local:
        return {}
    combine = options.window_combine
    return {window_attributes(prefix)[combine]: WINDOW_CLASSES[combine](num_heads, options.local_window)}


def find_window_module(module: nn.Module, prefix: str) -> LocalWindowGate | LocalWindowShare | None:
    """The attention layer ``module``'s window module (kept under ``prefix``'s attributes), or None."""
    for name in window_attributes(prefix).values():
        window = getattr(module, name, None)
        if window is not None:
            return window
    return None
