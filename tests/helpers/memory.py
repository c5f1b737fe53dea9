"""What an op allocates: the largest tensor any aten op outputs while it runs (a T x T intermediate shows here)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LargestTensor(TorchDispatchMode):
    """Records the largest numel among the outputs of every aten op run under it (``largest``), and how many
    ops ran (``calls``)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls += 1
        for x in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(x, torch.Tensor):
                self.largest = max(self.largest, x.numel())
        return out
