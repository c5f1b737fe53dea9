"""One tiny configuration per architecture family, and the models built from it, shared by every test.

``tiny_config(model_type, **overrides)``: 3 layers, 4 heads, hidden 32, no dropout; ModernBERT
gets a local window of 5 (|i - j| <= 4) on its local layers. ``tiny_encoder`` builds a random
encoder of that config converted to a mechanism; ``tiny_checkpoint`` saves a random model of that
config with a word-level tokenizer trained on the shipped text.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoModel,
    BertConfig,
    CamembertConfig,
    DistilBertConfig,
    ElectraConfig,
    ModernBertConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    RobertaConfig,
    XLMRobertaConfig,
)

import hf_sliced_attn

MODEL_TYPES = ["bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert", "modernbert"]
VOCAB = 120
TEXT_DIR = files("hf_sliced_attn") / "data" / "text"
TRAIN_TEXT = str(TEXT_DIR / "convert_train.txt")
HELDOUT_TEXT = str(TEXT_DIR / "heldout.txt")
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

_COMMON = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB)
_BERT_STYLE = dict(max_position_embeddings=96, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_FAMILIES: dict[str, tuple[type[PretrainedConfig], dict[str, Any]]] = {
    "bert": (BertConfig, _BERT_STYLE),
    "roberta": (RobertaConfig, dict(_BERT_STYLE, pad_token_id=1)),
    "xlm-roberta": (XLMRobertaConfig, dict(_BERT_STYLE, pad_token_id=1)),
    "camembert": (CamembertConfig, dict(_BERT_STYLE, pad_token_id=1)),
    # ELECTRA's embeddings may be narrower than its hidden size (a projection between them): 16 here.
    "electra": (ElectraConfig, dict(_BERT_STYLE, embedding_size=16)),
    # DistilBERT names its sizes dim, n_layers and n_heads (the config maps the common names onto them), but not
    # its feed-forward width or dropouts.
    "distilbert": (DistilBertConfig, dict(hidden_dim=64, max_position_embeddings=96, dropout=0.0,
                                          attention_dropout=0.0)),
    "modernbert": (ModernBertConfig, dict(
        max_position_embeddings=128, local_attention=8, global_attn_every_n_layers=3, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, attention_dropout=0.0, mlp_dropout=0.0,
        embedding_dropout=0.0,
    )),
}


def tiny_config(model_type: str, **overrides: Any) -> PretrainedConfig:
    """The tiny config of ``model_type`` (one of :data:`MODEL_TYPES`), with ``overrides``."""
    config_class, family = _FAMILIES[model_type]
    return config_class(**{**_COMMON, **family, **overrides})


def tiny_encoder(
    model_type: str, mechanism: str, config_overrides: Mapping[str, Any] | None = None, **options: Any,
) -> PreTrainedModel:
    """A randomly initialised (seed 0) tiny ``model_type`` encoder (``tiny_config`` with
    ``config_overrides``) converted to ``mechanism`` with ``options``, in eval mode."""
    torch.manual_seed(0)
    config = hf_sliced_attn.prepare_config(tiny_config(model_type, **(config_overrides or {})), mechanism, **options)
    return AutoModel.from_config(config).eval()


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A lower-cased word-level tokenizer over the shipped text ([CLS] ... [SEP]); [PAD] is id 0."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train([TRAIN_TEXT, HELDOUT_TEXT], trainers.WordLevelTrainer(vocab_size=4000, special_tokens=SPECIALS))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def tiny_checkpoint(model_type: str, path: Path, seed: int = 0, **overrides: Any) -> Path:
    """Save a randomly initialised tiny encoder (``tiny_config`` with ``overrides``, sized to the
    word tokenizer, [PAD] = 0) and the tokenizer to ``path``."""
    tokenizer = word_tokenizer()
    special = dict(bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3) if model_type == "modernbert" else {}
    config = tiny_config(model_type, vocab_size=len(tokenizer), pad_token_id=0, max_position_embeddings=160,
                         **{**special, **overrides})
    torch.manual_seed(seed)
    AutoModel.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
