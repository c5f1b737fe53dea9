"""sentence-transformers checkpoints through a conversion.

An embedding model such as all-MiniLM-L6-v2 is a transformers encoder in the folder's root plus
sentence-transformers files: ``modules.json`` (the pipeline: Transformer -> Pooling ->
Normalize), a folder per module (``1_Pooling/``), ``sentence_bert_config.json`` (its
``max_seq_length``) and ``config_sentence_transformers.json`` (prompts, similarity function).
A converted copy keeps them, so that ``SentenceTransformer(folder)`` (after ``import
hf_sliced_attn``) loads the new attention and gives the pooled, normalised embeddings.
sentence-transformers itself is optional: nothing here imports it.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from huggingface_hub import snapshot_download

logger = logging.getLogger(__name__)

CONFIG_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


def sentence_transformers_folder(model: str) -> Path | None:
    """A local folder with the sentence-transformers files of ``model`` (a folder, or a Hub id whose
    small files are fetched or found in the cache), or None when ``model`` is not such a model."""
    folder = Path(model)
    if not folder.is_dir():
        try:
            folder = Path(snapshot_download(model, allow_patterns=[*CONFIG_FILES, "*/config.json"]))
        except Exception as error:  # noqa: BLE001 - offline, missing or private: the files are optional
            logger.warning("Could not look for sentence-transformers files of %s (%s); the converted folder "
                           "will be a plain transformers checkpoint.", model, error)
            return None
    return folder if (folder / "modules.json").is_file() else None


def copy_sentence_transformers_files(source: Path, output: Path) -> list[str]:
    """Copy the sentence-transformers files of ``source`` into the converted ``output``; returns what
    was copied. The Transformer module must sit in the folder's root (where the converted
    checkpoint is); a layout with it in a subfolder is refused with a ValueError."""
    modules = json.loads((source / "modules.json").read_text())
    transformer = [m for m in modules if m.get("type", "").endswith(".Transformer")]
    if len(transformer) != 1 or transformer[0].get("path", "") != "":
        raise ValueError(f"{source.name}: sentence-transformers layouts whose Transformer module is not in the "
                         "folder's root are not supported; convert its transformer folder and rebuild the pipeline.")
    copied = []
    for name in CONFIG_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, output / name)
            copied.append(name)
    for module in modules:
        path = module.get("path", "")
        if path and (source / path).is_dir():
            shutil.copytree(source / path, output / path, dirs_exist_ok=True)
            copied.append(f"{path}/")
    return copied
