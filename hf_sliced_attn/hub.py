"""Publishing a converted folder (or a fine-tune with its card) to the Hugging Face Hub.

:func:`push` checks that a folder loads through the plugin and reproduces the outputs
recorded at conversion time, then uploads it in one commit (``create_repo`` +
``create_commit``). It never writes into the folder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from huggingface_hub import CommitOperationAdd, HfApi, ModelCard, get_token
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
from transformers import AutoTokenizer

from .conversion.converted_folder import CHECKPOINT_DIR, REPORT_NAME, check_reference, load_converted
from .conversion.cards import render_conversion_card
from .conversion.model_sources import hub_offline
from .mechanisms import CONFIG_KEY


class PushError(RuntimeError):
    """A push that cannot go ahead; the message says why and what to do."""


def upload_plan(folder: str | Path) -> list[str]:
    """The files ``push`` uploads (POSIX paths relative to ``folder``): all of them except
    hidden files and folders and a leftover ``checkpoints/`` of an unfinished conversion."""
    folder = Path(folder)
    paths = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        hidden = any(part.startswith(".") for part in relative.parts)
        if path.is_file() and relative.parts[0] != CHECKPOINT_DIR and not hidden:
            paths.append(relative.as_posix())
    return paths


def verify_folder(folder: str | Path) -> str:
    """Check that ``folder`` loads through the plugin with all its weights and the mechanism
    selected, and reproduces its recorded outputs. Returns what was checked; raises PushError."""
    folder = Path(folder)
    try:
        if (folder / REPORT_NAME).exists():
            difference = check_reference(folder)
            return ("loads through the plugin and reproduces the outputs recorded at conversion "
                    f"(max diff {difference:.2g})")
        first, second = (_sample_output(folder) for _ in range(2))
        if not torch.equal(first, second):
            raise ValueError("two loads give different outputs (some weights are initialised at random on load).")
        return f"loads through the plugin, identically twice (no {REPORT_NAME} with reference outputs)"
    except (ValueError, OSError) as error:
        raise PushError(f"{folder} is not ready to publish: {error}") from error


@torch.no_grad()
def _sample_output(folder: Path) -> torch.Tensor:
    model = load_converted(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(["A short sentence to check the model.", "Another one."], padding=True, return_tensors="pt")
    output = model(**batch)
    return output.logits if getattr(output, "logits", None) is not None else output.last_hidden_state


def publish_card(folder: str | Path, repo_id: str) -> str:
    """The README.md to upload: a converted folder's card re-rendered so its loading snippet
    names ``repo_id``; otherwise the folder's own README.md."""
    folder = Path(folder)
    if (folder / REPORT_NAME).exists():
        report = json.loads((folder / REPORT_NAME).read_text())
        return str(render_conversion_card(folder, report=report, model_id=repo_id, save=False))
    if not (folder / "README.md").exists():
        raise PushError(f"{folder} has no README.md model card.")
    return (folder / "README.md").read_text(encoding="utf-8")


def push(folder: str | Path, repo_id: str, *, private: bool = False, revision: str | None = None,
         dry_run: bool = False, token: str | None = None, echo: Callable[[str], None] = print) -> str | None:
    """Check ``folder`` (:func:`verify_folder`) and upload it to the model repository ``repo_id``
    in one commit. Returns the commit URL, or None for ``dry_run`` (which prints the files
    and the card instead). Raises PushError, leaving the folder untouched."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise PushError(f"{folder} is not a model folder (no config.json).")
    if (folder / CHECKPOINT_DIR).exists():
        raise PushError(f"{folder} holds an unfinished conversion ({CHECKPOINT_DIR}/): finish it with --resume first.")
    card_text = publish_card(folder, repo_id)
    if not ModelCard(card_text).data.base_model:
        echo("Warning: the model card names no base_model (the checkpoint's Hub id was not found). Convert with "
             "--base-model-id ORG/NAME, or add base_model to the card, so that the Hub links the two.")
    card = card_text.encode("utf-8")
    files_ = sorted({*upload_plan(folder), "README.md"})
    echo(f"Checked: {folder} {verify_folder(folder)}.")
    if dry_run:
        where = f"{repo_id}" + (f" (revision {revision})" if revision else "") + (" [private]" if private else "")
        echo(f"Dry run: would upload {len(files_)} files to {where}:")
        for name in files_:
            if name == "README.md":
                echo(f"  {name}  {len(card)} bytes (the model card below)")
            else:
                echo(f"  {name}  {(folder / name).stat().st_size} bytes")
        echo("--- README.md ---")
        echo(card.decode("utf-8"))
        return None
    token = token or get_token()
    problems = []
    if hub_offline():
        problems.append("HF_HUB_OFFLINE is set, so the Hub cannot be reached (unset it to publish)")
    if token is None:
        problems.append("no Hugging Face token was found (pass --token, set HF_TOKEN, or run `hf auth login`)")
    if problems:
        raise PushError("Cannot push: " + "; and ".join(problems) + ". Nothing was uploaded.")
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(folder / name))
                  for name in files_ if name != "README.md"]
    operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card))
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.create_commit(repo_id, operations, commit_message=f"Upload {folder.name} ({CONFIG_KEY})",
                                 revision=revision)
    except OfflineModeIsEnabled as error:
        raise PushError(f"Cannot push: the Hub is in offline mode ({error}). Nothing was uploaded.") from error
    except HfHubHTTPError as error:
        raise PushError(f"The Hub refused the upload to {repo_id}: {error}") from error
    except Exception as error:  # noqa: BLE001 - the HTTP client's connection errors are not part of its API
        raise PushError(f"Cannot reach the Hugging Face Hub ({type(error).__name__}: {error}). "
                        "Nothing was uploaded.") from error
    echo(f"Uploaded {len(operations)} files to {info.commit_url}")
    return info.commit_url
