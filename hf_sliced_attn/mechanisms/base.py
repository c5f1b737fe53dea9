"""What a mechanism is, and the registry that lists them.

A mechanism (``sliced_relu``, ``rela``, ...) is one :class:`Mechanism`, declared in its own
folder next to this file: its options (a :class:`MechanismConfig` dataclass whose fields carry
their help text), the modules it adds to each converted attention layer (each a
:class:`PluginModule` that initialises itself), its attention function and what its model
cards say about it. :data:`MECHANISMS` is the only list of mechanisms; everything else (the
transformers registration, conversion, cards, the CLI and the recipe flags) reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Union

import torch
from torch import nn

CONFIG_KEY = "hf_sliced_attn"
"""The key of a mechanism's options (:meth:`MechanismConfig.to_dict`) in a transformers config and its config.json."""

LayerSelection = Union[Literal["global", "all"], list[int]]


def parse_layers(value: str) -> str | list[int]:
    """The text form of ``layers`` (a CLI flag): "global", "all" or comma-separated indices like 0,2,4."""
    if value in ("global", "all"):
        return value
    try:
        return [int(part) for part in value.split(",")]
    except ValueError:
        raise ValueError(f"{value!r}: use 'global', 'all' or layer indices like 0,2,4") from None


@dataclass
class MechanismConfig:
    """Options every mechanism has. Subclasses add theirs as fields with ``metadata={"help": ...}``
    (and ``"choices"`` for a closed set of strings): the CLI and recipe flags are generated from them."""

    mechanism: ClassVar[str]

    layers: LayerSelection = field(
        default="global",
        metadata={
            "help": (
                "Which attention layers use the mechanism. 'all': every layer. 'global': the "
                "layers that attend to the whole sequence; on the BERT family (BERT, RoBERTa, XLM-R, "
                "CamemBERT, ELECTRA) and DistilBERT that is every layer, on ModernBERT the local "
                "(sliding-window) layers keep softmax attention, computed within the window. A list of "
                "layer indices selects those layers only; the others keep softmax attention."
            ),
            "parse": parse_layers,
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
        for option in dataclasses.fields(self):
            choices = option.metadata.get("choices")
            if choices is not None and getattr(self, option.name) not in choices:
                raise ValueError(
                    f"{option.name}={getattr(self, option.name)!r} is not valid: use one of {list(choices)}."
                )

    @classmethod
    def over_defaults(cls, defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
        """The options ``given`` by a user over a transfer's ``defaults`` (:meth:`Mechanism.conversion_options`).
        A mechanism whose defaults only hold beside other defaults drops them where ``given`` changes those."""
        return {**defaults, **given}

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form saved in config.json under :data:`CONFIG_KEY`."""
        return {"mechanism": self.mechanism, **dataclasses.asdict(self)}

    def describe(self) -> list[str]:
        """Short phrases for a model card, one per option that shapes the layers (e.g. "4 slices per head")."""
        return []

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


class PluginModule(nn.Module):
    """A module a mechanism adds to an attention layer. The model's ``_init_weights`` calls
    :meth:`init_weights`, which must use ``transformers.initialization`` (so that tensors
    loaded from a checkpoint are left alone)."""

    def init_weights(self, initializer_range: float) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Paper:
    """The paper a mechanism comes from, as model cards cite it."""

    arxiv_id: str
    authors: str
    title: str | None = None


AttendFunction = Callable[
    [nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None", "float | None", "int | None"],
    torch.Tensor,
]
"""``attend(module, query, key, value, key_padding_mask, scaling, sliding_window)``: (B, H, T, D)
inputs (RoPE applied), a (B, T) bool padding mask or None -> the (B, T, H, D) output. ``module`` is the
attention layer, holding the mechanism's modules under their names."""


@dataclass(frozen=True)
class Affine:
    """x -> ``F.linear(x, weight, bias)``, what a projection layer computes, read from its parameters
    (:func:`hf_sliced_attn.affine_layers.affine_of`): weight (out_features, in_features), bias (out_features,)
    or None."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]


@dataclass(frozen=True)
class InputAttention:
    """A mechanism's attention computed from the attention layer's input, on architectures where q and k
    are Linear layers of it with nothing in between (the BERT family; not RoPE models). A mechanism that
    only reads q and k through a projection can fold that projection into them and skip forming q and k.

    Attributes:
        applies: (module, query, key, num_tokens) -> whether ``attend`` costs less than the query and key
            layers followed by ``Mechanism.attend``, for a batch of ``num_tokens`` (B*T) tokens.
        attend: (module, hidden_states (B, T, C), query, key, value, key_padding_mask, scaling) -> (B, T, H, D):
            ``Mechanism.attend`` of q, k and v = query, key and value of hidden_states, viewed as (B, H, T, D),
            on a global layer, with the layer's softmax ``scaling`` (or None). ``query`` and ``key`` are the maps
            the layers apply (:class:`Affine`); ``value`` is its map too where its parameters say what it
            computes, else the value module, to be called.
    """

    applies: Callable[[nn.Module, Affine, Affine, int], bool]
    attend: Callable[[nn.Module, torch.Tensor, Affine, Affine, "Affine | nn.Module", "torch.Tensor | None",
                      "float | None"], torch.Tensor]


Purpose = Literal["convert", "finetune"]
"""What a transfer is for: ``hf-sliced-attn convert``, or the shorter transfer before fine-tuning in the recipe."""
PURPOSES: tuple[Purpose, ...] = ("convert", "finetune")


def check_purpose(purpose: str) -> None:
    """Raise a ValueError naming the valid purposes unless ``purpose`` is one."""
    if purpose not in PURPOSES:
        raise ValueError(f"Unknown transfer purpose {purpose!r}: the valid ones are {list(PURPOSES)}.")


@dataclass(frozen=True)
class Mechanism:
    """One attention mechanism, everything the package needs to know about it.

    Its name, the ``attn_implementation`` users pass to ``from_pretrained``, is its config's
    ``mechanism`` (defined there once).

    Attributes:
        config_class: its options (saved in config.json under ``hf_sliced_attn``).
        module_names: the attributes under which ``build_modules`` may put modules on an attention layer.
        build_modules: (options, num_heads, head_dim, local) -> {attribute name: new module}, uninitialised;
            ``local`` says whether the layer attends within a sliding window (ModernBERT's local layers).
        attend: the attention itself (:data:`AttendFunction`).
        input_attention: the same attention from the layer input (:class:`InputAttention`), or None.
        title: its name in prose ("Sliced ReLU attention").
        tag: its Hub tag.
        paper: the paper cards cite.
        description: one paragraph for model cards: the maths and the modules it adds.
        conversion_defaults: the options attention transfer uses unless told otherwise, per purpose as
            ``transfer_defaults`` (the measured best for converting a softmax checkpoint; the config's
            defaults stay the paper's); :meth:`conversion_options` reads them.
        transfer_defaults: the transfer settings that measure best for this mechanism, per purpose:
            ``"convert"`` (``hf-sliced-attn convert``) and ``"finetune"`` (the shorter transfer that
            precedes fine-tuning in the GLUE recipe, within its time budget). Each maps fields of
            :class:`hf_sliced_attn.conversion.settings.TransferConfig` to values;
            :func:`~hf_sliced_attn.conversion.settings.resolve_transfer_config` applies them.
    """

    config_class: type[MechanismConfig]
    module_names: tuple[str, ...]
    build_modules: Callable[[Any, int, int, bool], dict[str, PluginModule]]
    attend: AttendFunction
    title: str
    tag: str
    paper: Paper
    description: str
    input_attention: InputAttention | None = None
    conversion_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    transfer_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.config_class.mechanism

    def conversion_options(self, purpose: Purpose, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The options a transfer for ``purpose`` uses: those ``given`` over its ``conversion_defaults``
        (:meth:`MechanismConfig.over_defaults`)."""
        check_purpose(purpose)
        return self.config_class.over_defaults(self.conversion_defaults.get(purpose, {}), given or {})

    def make_config(self, **options: Any) -> MechanismConfig:
        """The options of this mechanism, raising a ValueError that lists the valid ones."""
        valid = {f.name for f in dataclasses.fields(self.config_class)}
        unknown = sorted(set(options) - valid)
        if unknown:
            raise ValueError(f"Unknown option(s) {unknown} for {self.name!r}: the valid ones are {sorted(valid)}.")
        return self.config_class(**options)


class MechanismRegistry(Mapping[str, Mechanism]):
    """The mechanisms by name. ``register`` adds one; listeners (the transformers glue) hear of each."""

    def __init__(self) -> None:
        self._mechanisms: dict[str, Mechanism] = {}
        self._listeners: list[Callable[[Mechanism], None]] = []

    def __getitem__(self, name: str) -> Mechanism:
        return self._mechanisms[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._mechanisms)

    def __len__(self) -> int:
        return len(self._mechanisms)

    def __repr__(self) -> str:
        return f"MechanismRegistry({list(self._mechanisms)})"

    def register(self, mechanism: Mechanism) -> Mechanism:
        """Add ``mechanism`` (a name already taken is an error) and tell the listeners."""
        if mechanism.name in self._mechanisms:
            raise ValueError(f"A mechanism named {mechanism.name!r} is already registered.")
        self._mechanisms[mechanism.name] = mechanism
        for listener in self._listeners:
            listener(mechanism)
        return mechanism

    def unregister(self, name: str) -> None:
        """Remove the mechanism ``name`` (its transformers registration stays, unused)."""
        self.get_mechanism(name)
        del self._mechanisms[name]

    def on_register(self, listener: Callable[[Mechanism], None]) -> None:
        """Call ``listener`` for every mechanism registered so far and from now on."""
        self._listeners.append(listener)
        for mechanism in list(self._mechanisms.values()):
            listener(mechanism)

    def get_mechanism(self, name: str) -> Mechanism:
        """The mechanism ``name``, or a ValueError that lists the valid ones."""
        if name not in self._mechanisms:
            raise ValueError(f"Unknown mechanism {name!r}: the valid ones are {list(self._mechanisms)}.")
        return self._mechanisms[name]

    def config_from_dict(self, saved: Mapping[str, Any]) -> MechanismConfig:
        """Rebuild options saved by :meth:`MechanismConfig.to_dict`."""
        if not isinstance(saved, Mapping) or "mechanism" not in saved:
            raise ValueError(f"The saved options {saved!r} are malformed: they need a 'mechanism' key.")
        options = dict(saved)
        return self.get_mechanism(options.pop("mechanism")).make_config(**options)

    def module_names(self) -> frozenset[str]:
        """Every attribute name under which some mechanism puts modules."""
        return frozenset(name for mechanism in self._mechanisms.values() for name in mechanism.module_names)


MECHANISMS = MechanismRegistry()
"""The registry: the one list of attention mechanisms this plugin provides."""
