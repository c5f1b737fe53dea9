"""Training text for attention transfer: loading passages, splitting off held-out text, and the
deterministic stream of tokenized batches."""

from __future__ import annotations

import inspect
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase


MIN_HELDOUT_TEXTS = 3
"""Fewest held-out passages a fidelity report is measured on: the Spearman correlation of the pairwise
similarities needs at least three pairs."""


def load_texts(sources: Sequence[str], *, column: str = "text", split: str = "train") -> list[str]:
    """Passages from text files (one per non-empty line), saved datasets (``save_to_disk``
    folders) or dataset names/folders for :func:`datasets.load_dataset` (``column`` of ``split``)."""
    texts: list[str] = []
    for source in sources:
        path = Path(source)
        if path.is_file():
            texts += [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            continue
        texts += [str(t).strip() for t in _dataset_column(source, column, split) if t and str(t).strip()]
    return texts


def _dataset_column(source: str, column: str, split: str) -> list[str]:
    import datasets

    path = Path(source)
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        data = datasets.load_from_disk(str(path))
        if isinstance(data, datasets.DatasetDict):
            data = data[split]
    else:
        try:
            data = datasets.load_dataset(source, split=split)
        except Exception as error:  # noqa: BLE001 - datasets raises many types; the message is what matters
            raise ValueError(f"Cannot read text from {source!r}: not a file, and not a dataset ({error}).") from error
    if column not in data.column_names:
        raise ValueError(f"{source!r} has no column {column!r} (columns: {data.column_names}); pass --text-column.")
    return data[column]


def split_heldout(
    texts: list[str], heldout: list[str] | None, *, fraction: float, seed: int
) -> tuple[list[str], list[str], str | None]:
    """(train, heldout, a note saying how the held-out text was split off, or None if it was given).
    Held-out text must not overlap the training text.

    Without ``heldout``, a ``fraction`` of the distinct passages is split off, chosen by a
    seeded shuffle, so the same inputs always give the same split.
    """
    if not texts:
        raise ValueError("The training text is empty: give text files with one passage per line, or a dataset.")
    if heldout is not None:
        if len(heldout) < MIN_HELDOUT_TEXTS:
            raise ValueError(f"The held-out text needs at least {MIN_HELDOUT_TEXTS} passages (the report correlates "
                             f"pairs of them), got {len(heldout)}.")
        overlap = set(texts) & set(heldout)
        if overlap:
            example = next(iter(overlap))
            raise ValueError(
                f"{len(overlap)} held-out passage(s) also appear in the training text (e.g. {example!r}): "
                "the fidelity report must be measured on unseen text."
            )
        return texts, heldout, None
    distinct = list(dict.fromkeys(texts))
    count = max(MIN_HELDOUT_TEXTS, round(fraction * len(distinct)))
    if len(distinct) - count < 1:
        raise ValueError(f"Too little text to split off a held-out part ({len(distinct)} distinct passages).")
    order = list(range(len(distinct)))
    random.Random(seed).shuffle(order)
    held = {distinct[i] for i in order[:count]}
    note = (
        f"no held-out text given: {count} of {len(distinct)} distinct passages of the training text "
        f"(fraction {fraction}, seed {seed}) were split off and not trained on"
    )
    return [t for t in texts if t not in held], [distinct[i] for i in sorted(order[:count])], note


class Batches:
    """The deterministic stream of training batches.

    Passages are drawn epoch by epoch in a seeded permutation; the global batch of step
    ``s`` covers stream positions [s·G, (s+1)·G) with G = batch_size · num_processes, and
    process p takes its slice. A step's batch depends on (seed, s) only: resuming at step
    s needs no other data state.
    """

    def __init__(self, encodings: list[dict[str, list[int]]], tokenizer: PreTrainedTokenizerBase,
                 batch_size: int, seed: int) -> None:
        self.encodings, self.tokenizer, self.batch_size, self.seed = encodings, tokenizer, batch_size, seed
        self._epoch, self._order = -1, torch.empty(0, dtype=torch.long)

    def _index(self, position: int) -> int:
        epoch, offset = divmod(position, len(self.encodings))
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._epoch, self._order = epoch, torch.randperm(len(self.encodings), generator=generator)
        return int(self._order[offset])

    def get(self, step: int, process_index: int = 0, num_processes: int = 1) -> dict[str, torch.Tensor]:
        """The (B, T) ``input_ids``/``attention_mask`` (and any other tokenizer fields) of ``step`` on this process."""
        start = (step * num_processes + process_index) * self.batch_size
        rows = [self.encodings[self._index(p)] for p in range(start, start + self.batch_size)]
        return self.tokenizer.pad(rows, return_tensors="pt")

    def stream(self, start: int = 0, process_index: int = 0, num_processes: int = 1) -> Iterator[dict[str, torch.Tensor]]:
        """The batches of steps ``start``, ``start + 1``, ... on this process, without end."""
        step = start
        while True:
            yield self.get(step, process_index, num_processes)
            step += 1


def pack_passages(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], tokens: int) -> list[str]:
    """Consecutive passages joined (with a space, in their order) into rows of at most ``tokens`` tokens, special
    tokens included: a row takes the next passage while it fits, so the transfer trains on inputs as long as the
    text a converted model will read, not on each short line alone. A passage longer than ``tokens`` is a row of
    its own (truncated where it is tokenized). Every passage is in exactly one row."""
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    specials = tokenizer.num_special_tokens_to_add(pair=False)
    lengths = [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
    rows: list[str] = []
    current: list[str] = []
    used = specials
    for text, length in zip(texts, lengths, strict=True):
        if current and used + length > tokens:
            rows.append(" ".join(current))
            current, used = [], specials
        current.append(text)
        used += length
    if current:
        rows.append(" ".join(current))
    return rows


def tokenize(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int) -> list[dict[str, list[int]]]:
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length)
    return [{key: encoded[key][i] for key in encoded} for i in range(len(texts))]


def encoder_batches(dataset, tokenizer: PreTrainedTokenizerBase, encoder: nn.Module, batch_size: int,
                    seed: int) -> Batches:
    """A tokenized :class:`datasets.Dataset` (a task's training split: labels and text columns included) as the
    :class:`Batches` of the inputs ``encoder.forward`` takes, and nothing else."""
    accepted = inspect.signature(encoder.forward).parameters
    return Batches(dataset.select_columns([c for c in dataset.column_names if c in accepted]), tokenizer, batch_size,
                   seed)
