"""Registration with transformers, and the construction-time hooks that add the new modules.

On :func:`register` (run by ``import hf_sliced_attn``):

* ``AttentionInterface`` gets the attention function of every registered mechanism and ``AttentionMaskInterface``
  gets :func:`padding_mask`, a 2D padding-mask builder, for each (never an O(T^2) mask).
* The self-attention classes of the supported architectures (:mod:`hf_sliced_attn.models`)
  gain the new module at construction when the config asks for a mechanism (where they are built
  without their layer index, DistilBERT's, from the layer stack that builds them), and their
  ``PreTrainedModel`` initialises it in ``_init_weights``; so the parameters exist before
  weights load, and converting a vanilla checkpoint initialises them properly.
* On the BERT family and DistilBERT, whose attention forward is only q, k, v = Linear layers of the input and
  the attention function (then DistilBERT's output layer), a converted layer whose mechanism can attend from the
  input (sliced ReLU folds its projection into the query and key layers) does so: the same function with fewer
  matrix products.
* Their configs save ``attn_implementation`` next to the plugin's options. Loading a
  converted checkpoint with the plugin selects the mechanism by itself; without the
  plugin transformers refuses the unknown implementation instead of running softmax.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel
from transformers import modeling_utils
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .affine_layers import affine_of
from .attention import LAYER_MODE_ATTR, SOFTMAX, attention_function, key_padding_mask_from, observing
from .mechanisms import CONFIG_KEY, MECHANISMS, Mechanism, MechanismConfig, PluginModule
from .models import ARCHITECTURES, SUPPORTED_MODEL_TYPES, ArchitectureSpec, spec_for


def mechanism_config_of(config: PretrainedConfig) -> MechanismConfig | None:
    """The mechanism ``config`` asks for, or None for a plain softmax model.

    A converted checkpoint (or a config given to :func:`prepare_config`) carries its options
    under ``CONFIG_KEY``, and asking it for another attention is an error. A plain config that
    only has ``attn_implementation`` set to a mechanism gets that mechanism's default options;
    they are not written into the config (the caller may build a softmax model from the same
    config object next), but ``config.to_dict()`` (so ``save_pretrained``) includes them.
    """
    requested = config._attn_implementation
    saved = getattr(config, CONFIG_KEY, None)
    if saved is not None:
        options = MECHANISMS.config_from_dict(saved)
        if requested != options.mechanism:
            raise ValueError(
                f"This model was converted to {options.mechanism!r} attention (config.{CONFIG_KEY}), but "
                f"attn_implementation={requested!r} was requested: its weights were trained for "
                f"{options.mechanism!r}. Load it with attn_implementation={options.mechanism!r} or without the argument."
            )
        return options
    if requested in MECHANISMS:
        return MECHANISMS[requested].make_config()
    return None


def prepare_config(config: PretrainedConfig, mechanism: str, **options: Any) -> PretrainedConfig:
    """Ask ``config`` for ``mechanism`` with ``options`` before building a model from it.

    ``options`` are the fields of the mechanism's config (:class:`~hf_sliced_attn.SlicedReluConfig`,
    :class:`~hf_sliced_attn.RelaConfig`; e.g. ``num_slices=4, layers="all"``). Use it as
    ``from_pretrained(path, config=prepare_config(AutoConfig.from_pretrained(path), "sliced_relu", num_slices=2))``.
    A checkpoint already converted to ``mechanism`` keeps its saved options (they shape its
    trained modules): an option that differs from them is an error.
    """
    spec_for(config.model_type)
    saved = getattr(config, CONFIG_KEY, None)
    if saved is not None and saved.get("mechanism") != mechanism:
        raise ValueError(
            f"This config was converted to {saved.get('mechanism')!r}; it cannot be prepared for {mechanism!r}. "
            "Start from the original softmax checkpoint to convert it to another mechanism."
        )
    chosen = MECHANISMS.get_mechanism(mechanism)
    requested = chosen.make_config(**options)
    if saved is not None:
        # A converted checkpoint: its options shape the modules its weights were trained for.
        converted = MECHANISMS.config_from_dict(saved)
        kept = {k: v for k, v in converted.to_dict().items() if k != "mechanism"}
        if chosen.make_config(**{**kept, **options}) != converted:
            changed = {k: getattr(requested, k) for k in options if getattr(requested, k) != getattr(converted, k)}
            raise ValueError(
                f"This checkpoint was converted with {kept}; it cannot take {changed}: these options "
                "shape the trained modules. Leave them out to keep the converted ones, or start from the original "
                "softmax checkpoint to convert with other options."
            )
        requested = converted
    setattr(config, CONFIG_KEY, requested.to_dict())
    config._attn_implementation = mechanism
    return config


def converts_layer(config: PretrainedConfig, layer_idx: int) -> bool:
    """Whether layer ``layer_idx`` of a model built from ``config`` runs ``config``'s mechanism."""
    options = mechanism_config_of(config)
    if options is None:
        return False
    spec = spec_for(config.model_type)
    return options.converts_layer(layer_idx, config.num_hidden_layers, spec.is_local_layer(config, layer_idx))


def has_local_layers(config: PretrainedConfig) -> bool:
    """Whether a model built from ``config`` has sliding-window (local) attention layers, as ModernBERT has:
    an architecture built for long inputs, whose global layers must not fall back to softmax by default."""
    spec = spec_for(config.model_type)
    return any(spec.is_local_layer(config, i) for i in range(config.num_hidden_layers))


def converted_layer_indices(config: PretrainedConfig) -> list[int]:
    """The layers a model built from ``config`` runs its mechanism on (none for a softmax config).
    Raises ValueError for a ``layers`` list that names layers the model does not have."""
    return [i for i in range(config.num_hidden_layers) if converts_layer(config, i)]


def attach_modules(module: nn.Module, config: PretrainedConfig, spec: ArchitectureSpec) -> list[nn.Module]:
    """Give one attention module what ``config``'s mechanism needs, and mark its mode.

    Returns the modules it created (uninitialised: the model's ``_init_weights`` fills them).
    """
    options = mechanism_config_of(config)
    if options is None:
        return []
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        raise ValueError(
            f"{options.mechanism!r} is for encoders: this config has is_decoder/add_cross_attention set. "
            "Use it on encoder models only."
        )
    local = spec.is_local_layer(config, module.layer_idx)
    converts = options.converts_layer(module.layer_idx, config.num_hidden_layers, local)
    setattr(module, LAYER_MODE_ATTR, options.mechanism if converts else SOFTMAX)
    if not converts:
        return []
    num_heads, head_dim = spec.head_shape(module)
    new = MECHANISMS[options.mechanism].build_modules(options, num_heads, head_dim, local)
    for name, child in new.items():
        setattr(module, name, child)
    return list(new.values())


def _patch_attention_init(attention_class: type[nn.Module], spec: ArchitectureSpec) -> None:
    original = attention_class.__init__

    @functools.wraps(original)
    def __init__(self, config, *args, **kwargs):
        original(self, config, *args, **kwargs)
        attach_modules(self, config, spec)

    attention_class.__init__ = __init__


def _patch_layer_stack_init(spec: ArchitectureSpec) -> None:
    """Number the attention modules of ``spec.layer_stack`` as it builds them (``layer_idx``), then give each what
    the config's mechanism needs, as :func:`_patch_attention_init` does for modules built with their index."""
    stack_class, attention_modules_of = spec.layer_stack
    original = stack_class.__init__

    @functools.wraps(original)
    def __init__(self, config, *args, **kwargs):
        original(self, config, *args, **kwargs)
        for layer_idx, attention in enumerate(attention_modules_of(self)):
            attention.layer_idx = layer_idx
            attach_modules(attention, config, spec)

    stack_class.__init__ = __init__


def _attention_from_input(
    module: nn.Module, spec: ArchitectureSpec, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None,
    extra_args: tuple, kwargs: dict[str, Any],
) -> tuple[torch.Tensor, None] | None:
    """The forward of a converted layer computed by its mechanism's ``input_attention``, or None where that
    does not apply (then the layer runs its own forward). Same outputs, same errors."""
    mode = getattr(module, LAYER_MODE_ATTR, SOFTMAX)
    mechanism = MECHANISMS.get(mode)
    if (
        mechanism is None
        or mechanism.input_attention is None
        or module.config._attn_implementation != mode
        or extra_args
        or any(kwargs.get(name) is not None for name in ("cache", "past_key_values", "encoder_hidden_states"))
        or observing()
    ):
        return None
    query_layer, key_layer, value_layer = spec.input_projections(module)
    query, key = affine_of(query_layer), affine_of(key_layer)
    batch, length, _ = hidden_states.shape
    if query is None or key is None or not mechanism.input_attention.applies(module, query, key, batch * length):
        return None
    padding = key_padding_mask_from(attention_mask, batch, length)
    value = affine_of(value_layer) or value_layer
    scaling = getattr(module, "scaling", None)  # the softmax scaling of a local window; None: D^-1/2
    out = mechanism.input_attention.attend(module, hidden_states, query, key, value, padding, scaling)
    out = out.reshape(batch, length, -1).contiguous()
    return (out if spec.output_layer is None else spec.output_layer(module)(out)), None


def _patch_attention_forward(attention_class: type[nn.Module], spec: ArchitectureSpec) -> None:
    original = attention_class.forward

    @functools.wraps(original)
    def forward(self, hidden_states, attention_mask=None, *args, **kwargs):
        output = _attention_from_input(self, spec, hidden_states, attention_mask, args, kwargs)
        return output if output is not None else original(self, hidden_states, attention_mask, *args, **kwargs)

    attention_class.forward = forward


def _patch_init_weights(pretrained_class: type[PreTrainedModel]) -> None:
    original = pretrained_class._init_weights

    @functools.wraps(original)
    def _init_weights(self, module):
        original(self, module)
        if isinstance(module, PluginModule):
            module.init_weights(getattr(self.config, "initializer_range", 0.02))

    pretrained_class._init_weights = _init_weights


def _patch_config_to_dict(config_class: type[PretrainedConfig]) -> None:
    original = config_class.to_dict

    @functools.wraps(original)
    def to_dict(self) -> dict[str, Any]:
        output = original(self)
        if CONFIG_KEY not in output and self._attn_implementation in MECHANISMS:
            output[CONFIG_KEY] = MECHANISMS[self._attn_implementation].make_config().to_dict()
        if CONFIG_KEY in output:
            output["attn_implementation"] = output[CONFIG_KEY]["mechanism"]
        return output

    config_class.to_dict = to_dict


def _built_mechanism(model: PreTrainedModel, spec: ArchitectureSpec) -> str | None:
    """The mechanism ``model``'s attention layers were built for (saved in its config, or marked on
    its layers at construction), or None for a softmax model."""
    saved = getattr(model.config, CONFIG_KEY, None)
    if saved is not None:
        return saved["mechanism"]
    modes = {getattr(m, LAYER_MODE_ATTR, SOFTMAX) for m in model.modules() if isinstance(m, spec.attention_classes)}
    return next(iter(modes - {SOFTMAX}), None)


def _patch_set_attn_implementation(pretrained_class: type[PreTrainedModel], spec: ArchitectureSpec) -> None:
    original = pretrained_class.set_attn_implementation

    @functools.wraps(original)
    def set_attn_implementation(self, attn_implementation, *args, **kwargs):
        requested = attn_implementation if isinstance(attn_implementation, str) else attn_implementation.get("")
        converted_to = _built_mechanism(self, spec)
        if converted_to is not None and requested != converted_to:
            raise ValueError(
                f"This model was converted to {converted_to!r} attention; switching it to {requested!r} "
                f"would run its {converted_to!r} layers with another attention. Load the original "
                "checkpoint for that."
            )
        original(self, attn_implementation, *args, **kwargs)
        if converted_to is None and requested in MECHANISMS:
            # A model built for softmax: attach freshly initialised modules, never run without them.
            for attention in self.modules():
                if isinstance(attention, spec.attention_classes):
                    reference = next(attention.parameters())
                    for new in attach_modules(attention, self.config, spec):
                        new.to(device=reference.device, dtype=reference.dtype)
                        new.apply(self._init_weights)

    pretrained_class.set_attn_implementation = set_attn_implementation


def _valid_attentions() -> list[str]:
    """The ``attn_implementation`` values transformers accepts (as it checks them), the plugin's included."""
    return ["eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]


def unknown_attention_note(requested: str) -> str:
    """What transformers' error for an unknown ``attn_implementation`` leaves out: the plugin's mechanisms,
    and the closest valid name when ``requested`` looks like a typo of one."""
    mechanisms = ", ".join(f'"{name}"' for name in MECHANISMS)
    note = (f" hf_sliced_attn adds attn_implementation={mechanisms} (model types: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}).")
    close = difflib.get_close_matches(requested, _valid_attentions(), n=1, cutoff=0.6)
    return note + (f' Did you mean attn_implementation="{close[0]}"?' if close else "")


def _patch_attention_checks() -> None:
    """Models outside the supported list get a clear error when they ask for a mechanism, and an unknown
    ``attn_implementation`` gets transformers' error with the plugin's mechanisms (and a close match) added."""
    original = PreTrainedModel.get_correct_attn_implementation

    @functools.wraps(original)
    def get_correct_attn_implementation(self, requested_attention, *args, **kwargs):
        if requested_attention in MECHANISMS and self.config.model_type not in ARCHITECTURES:
            raise ValueError(
                f"attn_implementation={requested_attention!r} is not available for model_type "
                f"{self.config.model_type!r}. Supported architectures: {', '.join(SUPPORTED_MODEL_TYPES)}."
            )
        try:
            return original(self, requested_attention, *args, **kwargs)
        except ValueError as error:
            if isinstance(requested_attention, str) and requested_attention not in _valid_attentions():
                raise ValueError(f"{error}{unknown_attention_note(requested_attention)}") from None
            raise

    PreTrainedModel.get_correct_attn_implementation = get_correct_attn_implementation


def fresh_modules_note(model: nn.Module, missing: set[str]) -> tuple[set[str], str | None]:
    """The plugin's parameters among a load's ``missing`` keys when the checkpoint had none of them (a softmax
    checkpoint loaded with a mechanism: they are expected to be missing), and one line saying so; (empty, None)
    otherwise, so that a converted checkpoint lacking some of its trained modules keeps them in the report."""
    modules = {prefix: module for prefix, module in model.named_modules() if isinstance(module, PluginModule)}
    plugin = {f"{prefix}.{name}" for prefix, module in modules.items() for name, _ in module.named_parameters()}
    if not plugin or not plugin <= missing:
        return set(), None
    kinds = sorted({prefix.rpartition(".")[2] for prefix in modules})
    layers = {prefix.rpartition(".")[0] for prefix in modules}
    note = (f"hf_sliced_attn: the checkpoint has softmax attention, so the {model.config._attn_implementation} modules "
            f"({', '.join(kinds)}) of {len(layers)} attention layers were freshly initialised by the model's "
            "_init_weights: train them before use (attention transfer with `hf-sliced-attn convert` or "
            "recipes/glue.py, or fine-tuning).")
    return plugin, note


def _patch_load_report() -> None:
    """transformers' load report lists every parameter a checkpoint lacks as MISSING, in a table. Loaded with a
    mechanism, a softmax checkpoint lacks the plugin's modules by design: they leave the table for the one line of
    :func:`fresh_modules_note`, and other missing weights stay in it. ``output_loading_info`` still lists them all."""
    original = modeling_utils.log_state_dict_report

    @functools.wraps(original)
    def log_state_dict_report(model, pretrained_model_name_or_path, ignore_mismatched_sizes, loading_info, logger=None):
        fresh, note = fresh_modules_note(model, set(loading_info.missing_keys))
        if note is not None:
            (logger or modeling_utils.logger).warning(note)
            loading_info = dataclasses.replace(loading_info, missing_keys=set(loading_info.missing_keys) - fresh)
        return original(model, pretrained_model_name_or_path, ignore_mismatched_sizes, loading_info, logger)

    modeling_utils.log_state_dict_report = log_state_dict_report


def padding_mask(
    batch_size: int, q_length: int, kv_length: int, *, attention_mask: torch.Tensor | None = None, **kwargs: Any
) -> torch.Tensor | None:
    """The mask builder of every mechanism: the (B, Tk) bool padding mask (True = real token),
    the last ``kv_length`` columns of ``attention_mask``, never an O(T^2) mask.

    In eager mode a mask without padding becomes None, which lets the ops skip their masking.
    Under ``torch.compile`` the mask is kept as is: the check would be a data-dependent branch
    (a graph break), and an all-True mask gives the same outputs as None.
    """
    if attention_mask is None:
        return None
    attention_mask = attention_mask[:, -kv_length:]
    if torch.compiler.is_compiling() or attention_mask.shape[1] != kv_length:
        return attention_mask
    return None if bool(attention_mask.all()) else attention_mask


def _register_with_transformers(mechanism: Mechanism) -> None:
    AttentionInterface.register(mechanism.name, attention_function(mechanism))
    AttentionMaskInterface.register(mechanism.name, padding_mask)


_registered = False


def register() -> None:
    """Register every mechanism, present and future, with transformers, and patch the supported
    architectures (idempotent)."""
    global _registered
    if _registered:
        return
    MECHANISMS.on_register(_register_with_transformers)
    for spec in ARCHITECTURES.values():
        if spec.layer_stack is not None:
            _patch_layer_stack_init(spec)
        for attention_class in spec.attention_classes:
            if spec.layer_stack is None:
                _patch_attention_init(attention_class, spec)
            if spec.input_projections is not None:
                _patch_attention_forward(attention_class, spec)
        _patch_init_weights(spec.pretrained_class)
        _patch_set_attn_implementation(spec.pretrained_class, spec)
        _patch_config_to_dict(spec.config_class)
    _patch_attention_checks()
    _patch_load_report()
    _registered = True


def register_mechanism(mechanism: Mechanism) -> Mechanism:
    """Add a mechanism to the registry: ``from_pretrained(..., attn_implementation=mechanism.name)``,
    conversion, cards, the CLI and the recipe then offer it. Returns it."""
    register()
    return MECHANISMS.register(mechanism)


def modules_to_save(model: nn.Module) -> list[str]:
    """The names of the plugin's modules in ``model``, for peft ``LoraConfig(modules_to_save=...)``."""
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    return sorted(MECHANISMS.module_names() & present)


def lora_target_modules(model: PreTrainedModel) -> str:
    """peft ``target_modules`` for ``model``'s attention projections (a regex over module names)."""
    return spec_for(model.config.model_type).lora_target_modules
