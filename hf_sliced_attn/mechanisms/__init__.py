"""The attention mechanisms, one folder each, registered in :data:`MECHANISMS` at the end of this file.

A third mechanism is a new folder with its config, modules and attention function, ending with
a ``MECHANISMS.register`` call here (or, from outside the package,
``hf_sliced_attn.register_mechanism``): ``from_pretrained``, conversion, cards, the CLI and the
recipe pick it up from the registry.
"""

from .base import CONFIG_KEY, MECHANISMS, InputAttention, Mechanism, MechanismConfig, Paper, PluginModule, parse_layers
from .local_window import LocalWindowGate, LocalWindowShare, WindowedConfig
from .rela import RELA, RelaConfig
from .sliced_relu import SLICED_RELU, SlicedReluConfig

__all__ = [
    "CONFIG_KEY",
    "MECHANISMS",
    "InputAttention",
    "LocalWindowGate",
    "LocalWindowShare",
    "RELA",
    "SLICED_RELU",
    "Mechanism",
    "MechanismConfig",
    "Paper",
    "PluginModule",
    "RelaConfig",
    "SlicedReluConfig",
    "WindowedConfig",
    "parse_layers",
]

MECHANISMS.register(SLICED_RELU)
MECHANISMS.register(RELA)
