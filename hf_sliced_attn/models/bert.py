"""The BERT family: BERT, RoBERTa and XLM-RoBERTa (encoders; every layer is global).

The self-attention class of each (``*SelfAttention``) gets the new module; the model's
``attention.output.dense`` follows it as usual.
"""

from __future__ import annotations

from torch import nn
from transformers import BertConfig, RobertaConfig, XLMRobertaConfig
from transformers.models.bert.modeling_bert import BertPreTrainedModel, BertSelfAttention
from transformers.models.roberta.modeling_roberta import RobertaPreTrainedModel, RobertaSelfAttention
from transformers.models.xlm_roberta.modeling_xlm_roberta import XLMRobertaPreTrainedModel, XLMRobertaSelfAttention

from .spec import ArchitectureSpec

# q, k, v and the attention output projection; not the feed-forward's dense layers.
LORA_TARGETS = r".*\.attention\.(self\.(query|key|value)|output\.dense)"


def _head_shape(module: nn.Module) -> tuple[int, int]:
    return module.num_attention_heads, module.attention_head_size


def _never_local(config, layer_idx: int) -> bool:
    return False


SPECS = [
    ArchitectureSpec("bert", BertConfig, BertPreTrainedModel, (BertSelfAttention,), LORA_TARGETS, _head_shape, _never_local),
    ArchitectureSpec(
        "roberta", RobertaConfig, RobertaPreTrainedModel, (RobertaSelfAttention,), LORA_TARGETS, _head_shape, _never_local
    ),
    ArchitectureSpec(
        "xlm-roberta", XLMRobertaConfig, XLMRobertaPreTrainedModel, (XLMRobertaSelfAttention,), LORA_TARGETS,
        _head_shape, _never_local,
    ),
]
