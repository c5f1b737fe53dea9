"""Sliced ReLU attention (Boufadène & Vialard, arXiv 2512.11411) as a registered mechanism."""

from ..base import InputAttention, Mechanism, Paper
from ..local_window import window_attributes
from .attention import WINDOW_PREFIX, attend, attend_from_input, build_modules, folds_input
from .config import SlicedReluConfig
from .modules import SlicedBandwidth, SlicedMLPProjection, SlicedOutputAffine, SlicedProjection

TRANSFER_OPTIONS = {"projection": "mlp", "affine_output": True, "num_slices": 4}
"""The options of every transfer from a softmax checkpoint unless told otherwise; the recipe's (``finetune``) takes
one linear slice instead of the MLP's four (``conversion_defaults`` below)."""

SLICED_RELU = Mechanism(
    config_class=SlicedReluConfig,
    module_names=("sliced_projection", "sliced_bandwidth", "sliced_output",
                  *window_attributes(WINDOW_PREFIX).values()),
    build_modules=build_modules,
    attend=attend,
    input_attention=InputAttention(applies=folds_input, attend=attend_from_input),
    title="Sliced ReLU attention",
    tag="sliced-relu",
    paper=Paper(arxiv_id="2512.11411", authors="Boufadène & Vialard"),
    description=(
        "Each head projects its queries and keys to M scalars (`sliced_projection`: learned directions w, "
        "s_i = ⟨w, q_i⟩ and t_j = ⟨w, k_j⟩, or the authors' MLP over all heads), and attends with the kernel "
        "ReLU(s_i − t_j) / Σ_l |s_i − t_l| to the centred values, or with the authors' bump kernel "
        "max(0, 1 − |s_i − t_j| / b) / n, b a learned bandwidth per head (`sliced_bandwidth`); the M kernels "
        "are averaged. With "
        "`affine_output`, a learned per-head gain and share of the mean value follow (`sliced_output`). "
        "Sorting the scalars makes it exact in O(n log n) time and O(n) memory: no n × n attention "
        "matrix is formed. With `local_window` w > 0, each head also attends with the checkpoint's softmax to "
        "the keys within w of each query, combined with the sliced attention by a learned per-head gate "
        "(`sliced_window_gate`) or LoLCATs' shared normaliser (`sliced_window_share`), in O(n w) more."
    ),
    # The paper's plain formula (a linear projection, no gain, centred values only) loses the mean value
    # and half the weight of a softmax layer: transfers use the authors' MLP projection, the learned gain
    # and mean value, and 4 slices. Measured on all-MiniLM-L6-v2, held-out text of another kind (benchmarks/README.md,
    # "Conversion fidelity"). Both purposes add a local softmax window, so that every layer converts: 16 tokens for
    # convert (benchmarks/results/conversion_paragraphs/README.md), 4 before fine-tuning (chosen on the quality
    # benchmark's validation split, benchmarks/results/local_window_probe/README.md), where one linear slice
    # replaces the MLP (below). convert's MLP is a quarter of H*D wide (96 on MiniLM, not 384): within 0.005 of the
    # authors' width on every tuning figure over 4 seeds, paired (benchmarks/results/mlp_width/README.md).
    conversion_defaults={
        "convert": {**TRANSFER_OPTIONS, "mlp_ratio": 0.25, "local_window": 16},
        "finetune": {**TRANSFER_OPTIONS, "projection": "linear", "num_slices": 1, "local_window": 4},
    },
    # Every layer converted for both (TransferConfig's keep_softmax_layers 0). convert: with 300 stage-2 steps
    # (chosen on the tuning texts, benchmarks/results/conversion_paragraphs/README.md); finetune: stage 1 only,
    # within the recipe's time budget, with one linear slice instead of the MLP's four: 99.02% [98.68%, 99.36%] of
    # softmax's accuracy on the quality benchmark's test_large split over 10 seeds, 1.34x its wall time, and a
    # MiniLM step at 32x128 of 1.01-1.04x SDPA's fused one (the MLP's four slices: 99.4% on 5 seeds, but
    # 0.81-0.86x the step, as the MLP cannot fold into q and k beside the window; benchmarks/results/
    # all_layers_linear/README.md).
    transfer_defaults={
        "convert": {"lora_r": 32, "lora_alpha": 64, "steps": 100, "stage2_steps": 300, "stage2_loss": "cosine",
                    "stage2_lr": 2e-3},
        "finetune": {"lora_r": 32, "lora_alpha": 64, "steps": 100, "stage2_loss": "cosine", "stage2_lr": 2e-3},
    },
)

__all__ = [
    "SLICED_RELU",
    "SlicedBandwidth",
    "SlicedMLPProjection",
    "SlicedOutputAffine",
    "SlicedProjection",
    "SlicedReluConfig",
]
