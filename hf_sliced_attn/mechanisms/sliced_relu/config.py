"""The options of sliced ReLU attention, as saved in config.json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..local_window import WindowedConfig


@dataclass
class SlicedReluConfig(WindowedConfig):
    """Sliced ReLU attention (Boufadène & Vialard, arXiv 2512.11411).

    Each head projects its queries and keys to scalars, s_i = <w, q_i> and t_j = <w, k_j>
    (or with the authors' MLP), and attends with the kernel ReLU(s_i - t_j) / sum_l |s_i - t_l|
    to the centred values (``kernel="relu"``), or with the authors' bump kernel
    max(0, 1 - |s_i - t_j| / b_h) / n (``kernel="bump"``); sorting makes both exact in
    O(n log n). ``affine_output`` adds a learned gain and mean value per head. ``local_window``
    w > 0 adds softmax attention to the keys within w of each query, combined per head with the
    sliced attention (``window_combine``: a learned gate, or LoLCATs' shared normaliser;
    :class:`~hf_sliced_attn.mechanisms.local_window.WindowedConfig`).
    """

    mechanism: ClassVar[str] = "sliced_relu"

    kernel: str = field(
        default="relu",
        metadata={
            "help": (
                "The kernel on the projected scalars. 'relu': ReLU(s_i - t_j) / sum_l |s_i - t_l| on the centred "
                "values (the paper's formula). 'bump': the second kernel of the authors' code, "
                "max(0, 1 - |s_i - t_j| / b) / n on the values, local in the projected space, with a learned "
                "bandwidth b = softplus(theta) + 1e-4 per head and slice (theta from 0)."
            ),
            "choices": ("relu", "bump"),
        },
    )
    num_slices: int = field(
        default=1,
        metadata={"help": "M, the number of projection directions per head; their M kernels are averaged."},
    )
    projection: str = field(
        default="linear",
        metadata={
            "help": (
                "How queries and keys become scalars. 'linear': M learned directions w per head, "
                "s = <w, q> and t = <w, k> (the paper's formula). 'mlp': the projection of the authors' "
                "code (SiwanB/Sliced_ReLU_Attention), one MLP over all heads' concatenated queries "
                "(keys), Linear(H*D, W) -> GELU -> Linear(W, H*M) (W = H*D there; mlp_ratio sets it); it "
                "orders the keys by a nonlinear function of every head, and converts softmax checkpoints more "
                "faithfully."
            ),
            "choices": ("linear", "mlp"),
        },
    )
    mlp_ratio: float = field(
        default=1.0,
        metadata={
            "help": (
                "With projection='mlp', the width of the MLP's hidden layer as a fraction of H*D: "
                "Linear(H*D, W) -> GELU -> Linear(W, H*M), W = max(1, round(mlp_ratio * H*D)), as timm's "
                "mlp_ratio. 1.0: the authors' code. A narrower MLP costs less per token: its first layer is "
                "most of a converted layer's extra cost over softmax's at short lengths. convert's default, 0.25, "
                "keeps the fidelity of 1.0 within 0.005 (benchmarks/results/mlp_width/README.md)."
            ),
            "parse": float,
        },
    )
    affine_output: bool = field(
        default=False,
        metadata={
            "help": (
                "Per head, output gain_h * SlicedReLU(...) + mean_weight_h * mean(v), both learned "
                "(gain starts at 2, the constant of the authors' code; mean_weight at 1). The kernel's "
                "weights add up to at most 1 and act on centred values; softmax keeps the mean value "
                "and full weight, so converting a softmax checkpoint needs both back. False: the "
                "paper's formula alone."
            )
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.num_slices, int) or isinstance(self.num_slices, bool) or self.num_slices < 1:
            raise ValueError(f"num_slices={self.num_slices!r} is not valid: it must be an integer >= 1.")
        if not isinstance(self.mlp_ratio, (int, float)) or isinstance(self.mlp_ratio, bool) or not self.mlp_ratio > 0:
            raise ValueError(f"mlp_ratio={self.mlp_ratio!r} is not valid: it must be a number > 0 (1.0: the MLP's "
                             "hidden layer as wide as H*D, as in the authors' code).")
        if self.mlp_ratio != 1.0 and self.projection != "mlp":
            raise ValueError(f"mlp_ratio={self.mlp_ratio} applies to projection='mlp' only, not "
                             f"projection={self.projection!r}: drop mlp_ratio or set projection='mlp'.")
        if not isinstance(self.affine_output, bool):
            raise ValueError(f"affine_output={self.affine_output!r} is not valid: it must be True or False.")

    @classmethod
    def over_defaults(cls, defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
        """As :meth:`MechanismConfig.over_defaults`; a default ``mlp_ratio`` goes where the options end with the linear
        projection (a user who asks a transfer for ``projection="linear"`` gets it, not an error about the MLP's
        width they did not give)."""
        options = super().over_defaults(defaults, given)
        if "mlp_ratio" not in given and options.get("projection", cls.projection) != "mlp":
            options.pop("mlp_ratio", None)
        return options

    def to_dict(self) -> dict[str, Any]:
        """As the window's :meth:`~WindowedConfig.to_dict`, without ``mlp_ratio`` at its default (1.0): checkpoints
        of the authors' MLP width save the options that earlier versions of the plugin load."""
        saved = super().to_dict()
        if self.mlp_ratio == 1.0:
            del saved["mlp_ratio"]
        return saved

    def mlp_hidden_width(self, num_heads: int, head_dim: int) -> int:
        """W, the MLP's hidden width for heads of ``head_dim``: max(1, round(mlp_ratio * H*D))."""
        return max(1, round(self.mlp_ratio * num_heads * head_dim))

    def describe(self) -> list[str]:
        width = "" if self.mlp_ratio == 1.0 else f" (hidden width {self.mlp_ratio:g} x H*D)"
        phrases = [f"{self.kernel} kernel", f"{self.num_slices} slice(s) per head",
                   f"{self.projection} projection{width}"]
        if self.affine_output:
            phrases.append("learned output gain and mean value")
        return phrases + self.describe_window()
