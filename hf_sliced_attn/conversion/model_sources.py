"""Where a model or a text comes from: a local folder or a Hub id, one clear error when it is
neither, and names to record that are never local paths."""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from pathlib import Path

from huggingface_hub import constants, get_session
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from transformers import AutoConfig, PretrainedConfig

PROBE_TIMEOUT_S = 3.0
"""How long :func:`hub_unreachable` waits for the Hub to answer, unless ``HF_HUB_ETAG_TIMEOUT`` is set."""

_unreachable: str | None = None
"""Why the Hub could not be reached, once a probe failed (the process is offline from then on)."""


def hub_offline() -> bool:
    """Whether offline mode was asked for (``HF_HUB_OFFLINE``); not when this process went offline itself
    because the Hub could not be reached (:func:`hub_unreachable`)."""
    asked = os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}
    return asked or (bool(constants.HF_HUB_OFFLINE) and _unreachable is None)


def _go_offline() -> None:
    """Offline mode for the rest of this process, as ``HF_HUB_OFFLINE=1`` would have set it: huggingface_hub,
    transformers and datasets read their local caches at once instead of retrying each file."""
    constants.HF_HUB_OFFLINE = True
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:  # imported: it read the setting already (later imports read constants)
        datasets_config.HF_HUB_OFFLINE = True


def hub_unreachable() -> str | None:
    """Why the Hugging Face Hub cannot be used, in a few words, or None when it answers.

    Offline mode (``HF_HUB_OFFLINE``) is a reason. Otherwise one HEAD request to the endpoint
    (``HF_ENDPOINT``), through huggingface_hub's session with a short timeout
    (``HF_HUB_ETAG_TIMEOUT``, else :data:`PROBE_TIMEOUT_S`) and no retries, once per process. Any answer
    will do; when none comes, the process goes offline: what the local caches hold still loads, and
    what they do not fails at once, rather than after half a minute of retries per file.
    """
    if _unreachable is not None:
        return _unreachable
    if hub_offline():
        return "HF_HUB_OFFLINE is set"
    timeout = constants.HF_HUB_ETAG_TIMEOUT if os.environ.get("HF_HUB_ETAG_TIMEOUT") else PROBE_TIMEOUT_S
    try:
        get_session().head(constants.ENDPOINT, timeout=timeout)
    except Exception as error:  # whatever stops the request, the Hub cannot be used
        said = (str(error).strip().splitlines() or ["no answer"])[0]
        return _went_unreachable(f"the Hub ({constants.ENDPOINT}) cannot be reached ({type(error).__name__}: {said})")
    return None


def _went_unreachable(reason: str) -> str:
    global _unreachable
    _unreachable = reason
    _go_offline()
    return reason


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
    if _unreachable is not None:
        return (f"No local folder {name!r} exists, and as a Hub model id it is not in the local cache and cannot be "
                f"downloaded: {_unreachable}. Give a local folder, or check the network (HF_ENDPOINT, proxies).")
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"No local folder {name!r} exists, and the Hub model {name!r} could not be loaded: {reason}"


def load_model_config(name: str) -> PretrainedConfig:
    """``AutoConfig.from_pretrained(name)``, raising :class:`ModelNotFoundError` with one clear line
    when ``name`` is neither a checkpoint folder nor a reachable Hub model. A Hub id is loaded from the
    local cache when the Hub cannot be reached (:func:`hub_unreachable`), and fails at once when it is not there."""
    if not Path(name).exists() and _is_hub_id(name):
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
        return model if _is_hub_id(model) else None
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
        if isinstance(name, str) and not Path(name).exists() and _is_hub_id(name):
            return name
    return None


def source_name(source: str) -> str:
    """How a text source is recorded in reports and cards: a local file or folder by its name only
    (never its path), a dataset name as it is."""
    path = Path(source)
    return f"{path.name} (local)" if path.exists() else source
