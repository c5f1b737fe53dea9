"""The maths, free of transformers: fast ops and their float64 references.

The ops are torch functions; on CPU, ``sliced_relu`` and ``sliced_relu_bump`` run the C++ kernels of
:mod:`.sliced_relu_cpu`, ``rela`` that of :mod:`.rela_cpu`, ``windowed_softmax`` that of
:mod:`.windowed_softmax_cpu` and, for small windows, ``local_window_attention`` and
``rela_local_window_attention`` that of :mod:`.local_window_cpu`, built on first use by :mod:`._native`. Each op
sits next to its
reference in :mod:`hf_sliced_attn.ops.naive`, and the tests compare the two, values and
gradients.
"""

from .banded import windowed_sliced_relu, windowed_sliced_relu_bump, windowed_softmax
from .local_window import WINDOW_COMBINES, local_window_attention, rela_local_window_attention
from .norm import gated_rms_norm
from .rela import rela
from .sliced_relu import sliced_relu
from .sliced_relu_bump import sliced_relu_bump
from .value_mean import value_mean

__all__ = [
    "WINDOW_COMBINES",
    "gated_rms_norm",
    "local_window_attention",
    "rela",
    "rela_local_window_attention",
    "sliced_relu",
    "sliced_relu_bump",
    "value_mean",
    "windowed_sliced_relu",
    "windowed_sliced_relu_bump",
    "windowed_softmax",
]
