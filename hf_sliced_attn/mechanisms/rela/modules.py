"""The module ReLA adds to a converted attention layer: ``rela_norm``."""

from __future__ import annotations

import torch
from torch import nn
from transformers import initialization as init

from ...ops import gated_rms_norm
from ..base import PluginModule


class GatedRMSNorm(PluginModule):
    """ReLA's gated RMSNorm over all heads together (arXiv 2104.07012, eq. 5).

    y = scale * x * rsqrt(mean(x^2) + eps) * sigmoid(gate * x), over the last dim of x
    (..., H*D). ``scale`` starts at ones; ``gate`` starts small and random (normal with
    the model's initializer_range), so the gate opens at about sigmoid(0) = 1/2 and learns
    per feature, as in the authors' code.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps
        self.scale = nn.Parameter(torch.empty(hidden_size))
        self.gate = nn.Parameter(torch.empty(hidden_size))

    def init_weights(self, initializer_range: float) -> None:
        init.ones_(self.scale)
        init.normal_(self.gate, mean=0.0, std=initializer_range)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, self.scale, self.gate, self.eps)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, eps={self.eps}"
