"""Where a model or a text comes from: a local folder or a Hub id, one clear error when it is
neither, and names to record that are never local paths."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from huggingface_hub.errors import HFValidationError
from transformers import AutoConfig, PretrainedConfig

from hf_sliced_attn_cli.hub_access import describe_missing_model, hub_offline, hub_unreachable, is_hub_id

__all__ = ["ModelNotFoundError", "describe_missing_model", "hub_id_of", "hub_offline", "hub_unreachable",
           "load_model_config", "source_name"]


class ModelNotFoundError(ValueError):
    """The model named by the user can be found neither on disk nor on the Hub; the message says which."""


def load_model_config(name: str) -> PretrainedConfig:
    """``AutoConfig.from_pretrained(name)``, raising :class:`ModelNotFoundError` with one clear line
    when ``name`` is neither a checkpoint folder nor a reachable Hub model. A Hub id is loaded from the
    local cache when the Hub cannot be reached (:func:`hub_unreachable`), and fails at once when it is not there."""
    if not Path(name).exists() and is_hub_id(name):
        hub_unreachable()
    try:
        return AutoConfig.from_pretrained(name)
    except (OSError, HFValidationError, ValueError) as error:
        raise ModelNotFoundError(describe_missing_model(name, error)) from None


_HUB_CACHE_FOLDER = re.compile(r"models--(?P<org>[\w.-]+?)--(?P<name>[\w.-]+)[/\\]snapshots[/\\]")
_LOADING_SNIPPET = re.compile(r"""(?:SentenceTransformer|from_pretrained)\(\s*['"]([\w.-]+/[\w.-]+)['"]""")


def hub_id_of(model: str) -> str | None:
    """The Hub id of the checkpoint ``model``, or None when none can be found.

    ``model`` itself when it names no local folder and is a valid id. For a local folder: the
    id in its Hub-cache path (``models--org--name/snapshots/...``), else the id its own model
    card loads it by (``from_pretrained("org/name")`` / ``SentenceTransformer("org/name")``,
    the most frequent), else its config's ``_name_or_path`` when that is a Hub id.
    """
    folder = Path(model)
    if not folder.exists():
        return model if is_hub_id(model) else None
    cached = _HUB_CACHE_FOLDER.search(str(folder.resolve()) + "/")
    if cached:
        return f"{cached['org']}/{cached['name']}"
    card = folder / "README.md"
    if card.is_file():
        snippets = Counter(_LOADING_SNIPPET.findall(card.read_text(encoding="utf-8", errors="replace")))
        if snippets:
            return snippets.most_common(1)[0][0]
    config = folder / "config.json"
    if config.is_file():
        name = json.loads(config.read_text()).get("_name_or_path")
        if isinstance(name, str) and not Path(name).exists() and is_hub_id(name):
            return name
    return None


def source_name(source: str) -> str:
    """How a text source is recorded in reports and cards: a local file or folder by its name only
    (never its path), a dataset name as it is."""
    path = Path(source)
    return f"{path.name} (local)" if path.exists() else source
