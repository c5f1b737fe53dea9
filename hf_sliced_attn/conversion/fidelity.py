"""How close a converted model is to its softmax original, on held-out text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from scipy.stats import spearmanr
from torch import nn
from transformers import PreTrainedTokenizerBase

from .attention_taps import mean_pool, tap_attention, token_mask
from .training_text import tokenize


@torch.no_grad()
def measure_fidelity(teacher: nn.Module, student: nn.Module, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str],
                     *, layers: Sequence[int], max_length: int, batch_size: int = 32) -> dict[str, Any]:
    """Compare ``student`` with ``teacher`` on ``texts`` (both in eval mode).

    Returns ``attention_relative_error`` (per layer in ``layers``: ‖s − t‖ / ‖t‖ over all
    real tokens, each layer fed the teacher's inputs), ``hidden_state_cosine`` (mean over
    real tokens of the cosine between final hidden states), ``embedding_cosine`` (mean over
    texts of the cosine between mean-pooled embeddings) and ``pairwise_spearman`` (Spearman
    correlation between the teacher's and the student's cosine similarities over all pairs
    of texts).
    """
    device = next(student.parameters()).device
    error_sq = torch.zeros(len(layers), dtype=torch.float64)
    reference_sq = torch.zeros(len(layers), dtype=torch.float64)
    token_cosine, token_count = 0.0, 0
    teacher_embeddings, student_embeddings = [], []
    encodings = tokenize(tokenizer, texts, max_length)
    for start in range(0, len(encodings), batch_size):
        padded = tokenizer.pad(encodings[start:start + batch_size], return_tensors="pt")
        batch = {k: v.to(device) for k, v in padded.items()}
        mask = batch["attention_mask"]
        with tap_attention(teacher) as targets:
            teacher_hidden = teacher(**batch).last_hidden_state
        with tap_attention(student, replace_with=targets) as predictions:
            student(**batch)
        for row, layer in enumerate(layers):
            token = token_mask(mask, targets[layer])
            error_sq[row] += ((predictions[layer] - targets[layer]).pow(2) * token).sum().double().cpu()
            reference_sq[row] += (targets[layer].pow(2) * token).sum().double().cpu()
        student_hidden = student(**batch).last_hidden_state
        cosine = nn.functional.cosine_similarity(student_hidden, teacher_hidden, dim=-1)
        token_cosine += float((cosine * mask).sum())
        token_count += int(mask.sum())
        teacher_embeddings.append(mean_pool(teacher_hidden, mask).double().cpu())
        student_embeddings.append(mean_pool(student_hidden, mask).double().cpu())
    teacher_pooled, student_pooled = torch.cat(teacher_embeddings), torch.cat(student_embeddings)
    errors = (error_sq / reference_sq.clamp(min=1e-30)).sqrt().tolist()
    return {
        "attention_relative_error": {str(layer): e for layer, e in zip(layers, errors)},
        "attention_relative_error_mean": sum(errors) / max(len(errors), 1),
        "hidden_state_cosine": token_cosine / token_count,
        "embedding_cosine": float(nn.functional.cosine_similarity(student_pooled, teacher_pooled, dim=-1).mean()),
        "pairwise_spearman": _pairwise_spearman(teacher_pooled, student_pooled),
    }


def _pairwise_spearman(teacher: torch.Tensor, student: torch.Tensor) -> float:
    """Spearman correlation of the two models' cosine similarities over all pairs i < j of (N, C) embeddings."""
    def pair_cosines(x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.normalize(x, dim=-1)
        rows, cols = torch.triu_indices(len(x), len(x), offset=1)
        return (x @ x.T)[rows, cols]

    return float(spearmanr(pair_cosines(teacher).numpy(), pair_cosines(student).numpy()).statistic)


@torch.no_grad()
def embed(model: nn.Module, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int) -> torch.Tensor:
    """(N, C) mean-pooled final hidden states of ``texts``, in float64."""
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in tokenizer(list(texts), padding=True, truncation=True,
                                                   max_length=max_length, return_tensors="pt").items()}
    return mean_pool(model(**batch).last_hidden_state, batch["attention_mask"]).double().cpu()

