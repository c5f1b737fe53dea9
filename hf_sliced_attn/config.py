"""The plugin's options, as saved in a model's ``config.json``.

One mechanism per model. Its options live under the config key :data:`CONFIG_KEY` as a
plain dict (``{"mechanism": "sliced_relu", "num_slices": 1, "layers": "global"}``), so
``save_pretrained`` writes them and ``from_pretrained`` gets them back: the config alone
rebuilds the model, there is no state elsewhere.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Union

CONFIG_KEY = "hf_sliced_attn"
"""The key of the plugin's options in a transformers config (and its config.json)."""

LayerSelection = Union[Literal["global", "all"], list[int]]


@dataclass
class _MechanismConfig:
    """Options shared by both mechanisms."""

    mechanism: ClassVar[str]

    layers: LayerSelection = field(
        default="global",
        metadata={
            "help": (
                "Which attention layers use the mechanism. 'all': every layer. 'global': the "
                "layers that attend to the whole sequence; on BERT, RoBERTa and XLM-R that is every "
                "layer, on ModernBERT the local (sliding-window) layers keep softmax attention, "
                "computed within the window. A list of layer indices selects those layers only; "
                "the others keep softmax attention."
            )
        },
    )

    def __post_init__(self) -> None:
        if isinstance(self.layers, str):
            if self.layers not in ("global", "all"):
                raise ValueError(
                    f"layers={self.layers!r} is not valid: use 'global', 'all' or a list of layer indices."
                )
        elif isinstance(self.layers, (list, tuple)) and all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.layers
        ):
            self.layers = sorted(set(self.layers))
        else:
            raise ValueError(
                f"layers={self.layers!r} is not valid: use 'global', 'all' or a list of non-negative layer indices."
            )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form saved under :data:`CONFIG_KEY`."""
        return {"mechanism": self.mechanism, **dataclasses.asdict(self)}

    def converts_layer(self, layer_idx: int, num_layers: int, is_local: bool) -> bool:
        """Whether layer ``layer_idx`` (of ``num_layers``; ``is_local``: sliding-window) uses the mechanism."""
        if self.layers == "all":
            return True
        if self.layers == "global":
            return not is_local
        out_of_range = [i for i in self.layers if i >= num_layers]
        if out_of_range:
            raise ValueError(
                f"layers={self.layers} names layers {out_of_range}, but the model has {num_layers} "
                f"layers (indices 0 to {num_layers - 1})."
            )
        return layer_idx in self.layers


@dataclass
class SlicedReluConfig(_MechanismConfig):
    """Sliced ReLU attention (Boufadène & Vialard, arXiv 2512.11411).

    Each head projects its queries and keys to scalars, s_i = <w, q_i> and t_j = <w, k_j>
    (or with the authors' MLP), and attends with the kernel ReLU(s_i - t_j) / sum_l |s_i - t_l|
    to the centred values; sorting makes it exact in O(n log n). ``affine_output`` adds a
    learned gain and mean value per head.
    """

    mechanism: ClassVar[str] = "sliced_relu"

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
            )
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

    PROJECTIONS: ClassVar[tuple[str, ...]] = ("linear", "mlp")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.num_slices, int) or isinstance(self.num_slices, bool) or self.num_slices < 1:
            raise ValueError(f"num_slices={self.num_slices!r} is not valid: it must be an integer >= 1.")
        if self.projection not in self.PROJECTIONS:
            raise ValueError(f"projection={self.projection!r} is not valid: use one of {list(self.PROJECTIONS)}.")
        if not isinstance(self.affine_output, bool):
            raise ValueError(f"affine_output={self.affine_output!r} is not valid: it must be True or False.")


@dataclass
class RelaConfig(_MechanismConfig):
    """Rectified linear attention, ReLA (Zhang, Titov & Sennrich, EMNLP 2021, arXiv 2104.07012).

    ReLU(Q K^T d^-1/2) V per head, then a gated RMSNorm over all heads together:
    scale * x * rsqrt(mean(x^2) + eps) * sigmoid(gate * x).
    """

    mechanism: ClassVar[str] = "rela"

    norm_eps: float = field(default=1e-6, metadata={"help": "eps of the gated RMSNorm."})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.norm_eps, (int, float)) or self.norm_eps <= 0:
            raise ValueError(f"norm_eps={self.norm_eps!r} is not valid: it must be a positive number.")


MECHANISM_CONFIGS: dict[str, type[_MechanismConfig]] = {
    SlicedReluConfig.mechanism: SlicedReluConfig,
    RelaConfig.mechanism: RelaConfig,
}
MECHANISMS: tuple[str, ...] = tuple(MECHANISM_CONFIGS)
"""The attention implementations this plugin registers with transformers."""

MechanismConfig = Union[SlicedReluConfig, RelaConfig]


def make_mechanism_config(mechanism: str, **options: Any) -> MechanismConfig:
    """Build the options of ``mechanism``, raising a ValueError that lists what is valid."""
    if mechanism not in MECHANISM_CONFIGS:
        raise ValueError(f"Unknown mechanism {mechanism!r}: the valid ones are {list(MECHANISMS)}.")
    cls = MECHANISM_CONFIGS[mechanism]
    valid = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - valid)
    if unknown:
        raise ValueError(f"Unknown option(s) {unknown} for {mechanism!r}: the valid ones are {sorted(valid)}.")
    return cls(**options)


def mechanism_config_from_dict(saved: dict[str, Any]) -> MechanismConfig:
    """Rebuild the options saved under :data:`CONFIG_KEY`."""
    if not isinstance(saved, dict) or "mechanism" not in saved:
        raise ValueError(f"The config's {CONFIG_KEY!r} entry {saved!r} is malformed: it needs a 'mechanism' key.")
    options = dict(saved)
    return make_mechanism_config(options.pop("mechanism"), **options)
