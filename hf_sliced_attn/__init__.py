"""Sliced ReLU attention and ReLA for Hugging Face transformers encoders.

``import hf_sliced_attn`` registers ``attn_implementation="sliced_relu"`` and ``"rela"``
on BERT, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, DistilBERT and ModernBERT::

    import hf_sliced_attn
    from transformers import AutoModelForSequenceClassification
    model = AutoModelForSequenceClassification.from_pretrained(path, attn_implementation="sliced_relu")
"""

from .integration import lora_target_modules, modules_to_save, prepare_config, register, register_mechanism
from .mechanisms import CONFIG_KEY, MECHANISMS, Mechanism, MechanismConfig, RelaConfig, SlicedReluConfig
from .models import SUPPORTED_MODEL_TYPES

__version__ = "0.1.0"

__all__ = [
    "CONFIG_KEY",
    "MECHANISMS",
    "SUPPORTED_MODEL_TYPES",
    "Mechanism",
    "MechanismConfig",
    "RelaConfig",
    "SlicedReluConfig",
    "lora_target_modules",
    "modules_to_save",
    "prepare_config",
    "register",
    "register_mechanism",
]

register()
