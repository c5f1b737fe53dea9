"""The options of ReLA, as saved in config.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..local_window import WindowedConfig


@dataclass
class RelaConfig(WindowedConfig):
    """Rectified linear attention, ReLA (Zhang, Titov & Sennrich, EMNLP 2021, arXiv 2104.07012).

    ReLU(Q K^T d^-1/2) V per head, then a gated RMSNorm over all heads together:
    scale * x * rsqrt(mean(x^2) + eps) * sigmoid(gate * x). ``local_window`` w > 0 combines, before the
    norm, softmax over the keys within w of each query with the ReLA output, per head
    (:class:`~hf_sliced_attn.mechanisms.local_window.WindowedConfig`).
    """

    mechanism: ClassVar[str] = "rela"

    norm_eps: float = field(default=1e-6, metadata={"help": "eps of the gated RMSNorm."})

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float)) or self.norm_eps <= 0:
            raise ValueError(f"norm_eps={self.norm_eps!r} is not valid: it must be a positive number.")

    def describe(self) -> list[str]:
        return self.describe_window()
