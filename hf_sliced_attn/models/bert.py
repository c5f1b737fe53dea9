"""The BERT family: BERT, RoBERTa, XLM-RoBERTa, CamemBERT and ELECTRA (encoders; every layer is global).

The self-attention class of each (``*SelfAttention``) gets the new module; the model's
``attention.output.dense`` follows it as usual. Its forward is q, k, v = ``query``, ``key``, ``value``
of the input, then the attention function: a mechanism may attend from the input instead.
"""

from __future__ import annotations

from torch import nn
from transformers import BertConfig, CamembertConfig, ElectraConfig, RobertaConfig, XLMRobertaConfig
from transformers.models.bert.modeling_bert import BertPreTrainedModel, BertSelfAttention
from transformers.models.camembert.modeling_camembert import CamembertPreTrainedModel, CamembertSelfAttention
from transformers.models.electra.modeling_electra import ElectraPreTrainedModel, ElectraSelfAttention
from transformers.models.roberta.modeling_roberta import RobertaPreTrainedModel, RobertaSelfAttention
from transformers.models.xlm_roberta.modeling_xlm_roberta import XLMRobertaPreTrainedModel, XLMRobertaSelfAttention

from .spec import ArchitectureSpec, every_layer_global

# q, k, v and the attention output projection; not the feed-forward's dense layers.
LORA_TARGETS = r".*\.attention\.(self\.(query|key|value)|output\.dense)"


def _head_shape(module: nn.Module) -> tuple[int, int]:
    return module.num_attention_heads, module.attention_head_size


def _input_projections(module: nn.Module) -> tuple[nn.Module, nn.Module, nn.Module]:
    return module.query, module.key, module.value


SPECS = [
    ArchitectureSpec(model_type, config_class, pretrained_class, (attention_class,), LORA_TARGETS, _head_shape,
                     every_layer_global, _input_projections)
    for model_type, config_class, pretrained_class, attention_class in (
        ("bert", BertConfig, BertPreTrainedModel, BertSelfAttention),
        ("roberta", RobertaConfig, RobertaPreTrainedModel, RobertaSelfAttention),
        ("xlm-roberta", XLMRobertaConfig, XLMRobertaPreTrainedModel, XLMRobertaSelfAttention),
        ("camembert", CamembertConfig, CamembertPreTrainedModel, CamembertSelfAttention),
        ("electra", ElectraConfig, ElectraPreTrainedModel, ElectraSelfAttention),
    )
]
