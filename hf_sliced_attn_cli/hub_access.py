"""Whether the Hugging Face Hub can be used, and the one-line error for a Hub file it cannot give.

This module imports huggingface_hub only (a fraction of a second), so that the console script and the GLUE recipe
can check, before they import torch and transformers, that a model or dataset they must fetch from the Hub is
either cached or reachable: without the Hub they fail in well under a second instead of after the imports and a
half-minute of retries. :mod:`hf_sliced_attn.conversion.model_sources` loads models with the same state: once a
probe finds the Hub unreachable, the whole process is offline.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from huggingface_hub import constants, get_session, try_to_load_from_cache
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

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
    global _unreachable
    if _unreachable is not None:
        return _unreachable
    if hub_offline():
        return "HF_HUB_OFFLINE is set"
    timeout = constants.HF_HUB_ETAG_TIMEOUT if os.environ.get("HF_HUB_ETAG_TIMEOUT") else PROBE_TIMEOUT_S
    try:
        get_session().head(constants.ENDPOINT, timeout=timeout)
    except Exception as error:  # whatever stops the request, the Hub cannot be used
        said = (str(error).strip().splitlines() or ["no answer"])[0]
        _unreachable = f"the Hub ({constants.ENDPOINT}) cannot be reached ({type(error).__name__}: {said})"
        _go_offline()
    return _unreachable


def is_hub_id(name: str) -> bool:
    """Whether ``name`` is a valid Hub repository id (``name`` or ``org/name``)."""
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def describe_missing_model(name: str, error: Exception | None = None) -> str:
    """One line: why the model ``name`` cannot be loaded, whether it could be a Hub id, and what to do.
    ``error`` is what loading it raised (None when the Hub was found unusable before trying)."""
    if Path(name).exists():
        return f"{name!r} exists but is not a loadable transformers checkpoint (no usable config.json): {error}"
    if not is_hub_id(name):
        return (f"No local folder {name!r} exists, and the name cannot be a Hub model id (those look like "
                "'org/name'): check the path.")
    if hub_offline():
        return (f"No local folder {name!r} exists; as a Hub model id it cannot be downloaded because the machine is "
                "offline (HF_HUB_OFFLINE is set). Give a local folder, or unset HF_HUB_OFFLINE.")
    if _unreachable is not None:
        return (f"No local folder {name!r} exists, and as a Hub model id it is not in the local cache and cannot be "
                f"downloaded: {_unreachable}. Give a local folder, or check the network (HF_ENDPOINT, proxies).")
    reason = str(error).strip().splitlines()[0] if error is not None and str(error).strip() else type(error).__name__
    return f"No local folder {name!r} exists, and the Hub model {name!r} could not be loaded: {reason}"


def uncached_hub_model(name: str) -> str | None:
    """The one-line error (:func:`describe_missing_model`) for a model that can only come from the Hub when the
    Hub cannot be used and its ``config.json`` is not in the local Hub cache; None when it may load (a local
    path, which the loader checks itself; a cached or downloadable Hub id)."""
    if Path(name).exists() or not is_hub_id(name):
        return None
    if isinstance(try_to_load_from_cache(name, constants.CONFIG_NAME), str):
        return None
    return describe_missing_model(name) if hub_unreachable() else None


def dataset_cached(repo_id: str) -> bool:
    """Whether anything of the Hub dataset ``repo_id`` is in a local cache: its prepared Arrow files
    (``HF_DATASETS_CACHE``) or its downloaded files (the Hub cache). What it holds is for ``datasets`` to judge."""
    datasets_cache = Path(os.environ.get("HF_DATASETS_CACHE", Path(constants.HF_HOME) / "datasets"))
    prepared = datasets_cache / repo_id.replace("/", "___")
    downloaded = Path(constants.HF_HUB_CACHE) / f"datasets--{repo_id.replace('/', '--')}"
    return prepared.exists() or downloaded.exists()
