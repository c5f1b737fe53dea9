"""Tiny random checkpoints with a word-level tokenizer trained on the shipped text, saved to disk."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoModel, ModernBertConfig, PreTrainedTokenizerFast, RobertaConfig

TEXT_DIR = files("hf_sliced_attn") / "data" / "text"
TRAIN_TEXT = str(TEXT_DIR / "convert_train.txt")
HELDOUT_TEXT = str(TEXT_DIR / "heldout.txt")
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


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


def tiny_checkpoint(model_type: str, path: Path, seed: int = 0) -> Path:
    """Save a randomly initialised 2-layer (ModernBERT: 3-layer) encoder and its tokenizer to ``path``."""
    tokenizer = word_tokenizer()
    common = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=len(tokenizer),
                  pad_token_id=0)
    if model_type == "roberta":
        config = RobertaConfig(**common, num_hidden_layers=2, max_position_embeddings=160,
                               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    elif model_type == "modernbert":
        config = ModernBertConfig(**common, num_hidden_layers=3, max_position_embeddings=160, local_attention=8,
                                  global_attn_every_n_layers=2, bos_token_id=2, eos_token_id=3, cls_token_id=2,
                                  sep_token_id=3, attention_dropout=0.0, mlp_dropout=0.0, embedding_dropout=0.0)
    else:
        raise ValueError(model_type)
    torch.manual_seed(seed)
    AutoModel.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
