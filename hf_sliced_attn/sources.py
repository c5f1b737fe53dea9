"""Where a model comes from: a local folder or a Hub id, and one clear error when it is neither."""

from __future__ import annotations

from pathlib import Path

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from transformers import AutoConfig, PretrainedConfig

from .hub import hub_offline


class ModelNotFoundError(ValueError):
    """The model named by the user can be found neither on disk nor on the Hub; the message says which."""


def _is_hub_id(name: str) -> bool:
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def describe_missing_model(name: str, error: Exception) -> str:
    """One line: why ``name`` could not be loaded, and whether it could be a Hub id."""
    if Path(name).exists():
        return f"{name!r} exists but is not a loadable transformers checkpoint (no usable config.json): {error}"
    if not _is_hub_id(name):
        return (f"No local folder {name!r} exists, and the name cannot be a Hub model id (those look like "
                "'org/name'): check the path.")
    if hub_offline():
        return (f"No local folder {name!r} exists; as a Hub model id it cannot be downloaded because the machine is "
                "offline (HF_HUB_OFFLINE is set). Give a local folder, or unset HF_HUB_OFFLINE.")
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"No local folder {name!r} exists, and the Hub model {name!r} could not be loaded: {reason}"


def load_model_config(name: str) -> PretrainedConfig:
    """``AutoConfig.from_pretrained(name)``, raising :class:`ModelNotFoundError` with one clear line
    when ``name`` is neither a checkpoint folder nor a reachable Hub model."""
    try:
        return AutoConfig.from_pretrained(name)
    except (OSError, HFValidationError, ValueError) as error:
        raise ModelNotFoundError(describe_missing_model(name, error)) from None
