"""The options of sliced ReLU attention, as saved in config.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...ops.local_window import WINDOW_COMBINES
from ..base import MechanismConfig


@dataclass
class SlicedReluConfig(MechanismConfig):
    """Sliced ReLU attention (Boufadène & Vialard, arXiv 2512.11411).

    Each head projects its queries and keys to scalars, s_i = <w, q_i> and t_j = <w, k_j>
    (or with the authors' MLP), and attends with the kernel ReLU(s_i - t_j) / sum_l |s_i - t_l|
    to the centred values (``kernel="relu"``), or with the authors' bump kernel
    max(0, 1 - |s_i - t_j| / b_h) / n (``kernel="bump"``); sorting makes both exact in
    O(n log n). ``affine_output`` adds a learned gain and mean value per head. ``local_window``
    w > 0 adds softmax attention to the keys within w of each query, combined per head with the
    sliced attention (``window_combine``: a learned gate, or LoLCATs' shared normaliser).
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
                "(keys), Linear(H*D, H*D) -> GELU -> Linear(H*D, H*M); it orders the keys by a "
                "nonlinear function of every head, and converts softmax checkpoints more faithfully."
            ),
            "choices": ("linear", "mlp"),
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

    local_window: int = field(
        default=0,
        metadata={
            "help": (
                "w > 0: each head also attends with the checkpoint's own softmax (its scaled q.k scores) to the "
                "keys with |i - j| <= w, and combines that with sliced attention to the whole sequence by learned "
                "per-head weights (window_combine), as LoLCATs (arXiv 2410.10254) and RAttention "
                "(arXiv 2506.15545) pair a sliding softmax window with a linear attention. Costs O(T*w) on top of "
                "O(T log T). Applies on global layers; ModernBERT's local (sliding-window) layers keep the "
                "windowed sliced kernel. 0: no window, the paper's formula."
            )
        },
    )
    window_combine: str = field(
        default="shared",
        metadata={
            "help": (
                "How a local_window's softmax and the sliced attention combine, per head h. 'gate': "
                "g_h * softmax + (1 - g_h) * sliced, g_h = sigmoid(theta_h), theta from 0 (g = 1/2). 'shared': "
                "LoLCATs' shared normaliser (arXiv 2410.10254), (sum_window exp(a_ij) v_j + gamma_h N_i) / "
                "(sum_window exp(a_ij) + gamma_h D_i), N_i / D_i the sliced output (with affine_output, after "
                "its gain and mean value) and D_i its normaliser (sum_l |s_i - t_l|, or n for the bump kernel), "
                "gamma_h = softplus(rho_h) from 1: each query's share follows its softmax mass. 'shared' is the "
                "default: converting all-MiniLM-L6-v2 with every layer converted, it kept more accuracy and "
                "fidelity than the gate (benchmarks/README.md, \"Every layer converted\"). Only with "
                "local_window > 0."
            ),
            "choices": WINDOW_COMBINES,
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.num_slices, int) or isinstance(self.num_slices, bool) or self.num_slices < 1:
            raise ValueError(f"num_slices={self.num_slices!r} is not valid: it must be an integer >= 1.")
        if not isinstance(self.affine_output, bool):
            raise ValueError(f"affine_output={self.affine_output!r} is not valid: it must be True or False.")
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

    def describe(self) -> list[str]:
        phrases = [f"{self.kernel} kernel", f"{self.num_slices} slice(s) per head", f"{self.projection} projection"]
        if self.affine_output:
            phrases.append("learned output gain and mean value")
        if self.local_window:
            how = "a learned gate per head" if self.window_combine == "gate" else "a shared normaliser (LoLCATs)"
            phrases.append(f"softmax within {self.local_window} tokens of each query, combined by {how}")
        return phrases
