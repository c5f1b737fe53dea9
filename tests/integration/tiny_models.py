"""Tiny configs of every supported architecture, shared by the integration tests."""

from __future__ import annotations

from transformers import BertConfig, ModernBertConfig, PretrainedConfig, RobertaConfig, XLMRobertaConfig

VOCAB = 120
COMMON = dict(
    hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB,
)
BERT_STYLE = dict(
    COMMON, max_position_embeddings=96, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
)


def tiny_config(model_type: str) -> PretrainedConfig:
    """A 3-layer, 4-head, hidden-32 config; ModernBERT gets a local window of 5 (|i-j| <= 4) on layers 1 and 2."""
    if model_type == "bert":
        return BertConfig(**BERT_STYLE)
    if model_type == "roberta":
        return RobertaConfig(**BERT_STYLE, pad_token_id=1)
    if model_type == "xlm-roberta":
        return XLMRobertaConfig(**BERT_STYLE, pad_token_id=1)
    if model_type == "modernbert":
        return ModernBertConfig(
            **COMMON, max_position_embeddings=128, local_attention=8, global_attn_every_n_layers=3,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
            attention_dropout=0.0, mlp_dropout=0.0, embedding_dropout=0.0,
        )
    raise ValueError(model_type)


MODEL_TYPES = ["bert", "roberta", "xlm-roberta", "modernbert"]
