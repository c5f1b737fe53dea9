"""ReLA, rectified linear attention (Zhang, Titov & Sennrich, EMNLP 2021), as a registered mechanism."""

from ..base import Mechanism, Paper
from ..local_window import window_attributes
from .attention import WINDOW_PREFIX, attend, build_modules
from .config import RelaConfig
from .modules import GatedRMSNorm

RELA = Mechanism(
    config_class=RelaConfig,
    module_names=("rela_norm", *window_attributes(WINDOW_PREFIX).values()),
    build_modules=build_modules,
    attend=attend,
    title="ReLA (rectified linear attention)",
    tag="rela",
    paper=Paper(arxiv_id="2104.07012", authors="Zhang, Titov & Sennrich (EMNLP 2021)",
                title="Sparse Attention with Linear Units"),
    description=(
        "ReLU(Q Kᵀ d^-½) V per head instead of the softmax, then a gated RMSNorm over all heads together "
        "(`rela_norm`): scale · x · rsqrt(mean(x²) + ε) · σ(gate ⊙ x). The attention weights are exactly "
        "sparse, and a head can attend to nothing. With `local_window` w > 0, each head also attends with the "
        "checkpoint's softmax to the keys within w of each query, combined with ReLA's normalised output by a "
        "learned per-head gate (`rela_window_gate`) or LoLCATs' shared normaliser (`rela_window_share`); the norm "
        "never rescales the window's softmax."
    ),
    # A softmax window beside ReLA in every layer, combined after its norm: 16 tokens for convert (chosen on the
    # tuning texts, benchmarks/results/conversion_paragraphs/rela_window/README.md), 4 before fine-tuning (chosen
    # on the quality benchmark's validation split, benchmarks/results/rela_all_layers_probe/README.md).
    conversion_defaults={"convert": {"local_window": 16}, "finetune": {"local_window": 4}},
    # Every layer converted for both (TransferConfig's keep_softmax_layers 0). convert: measured on
    # all-MiniLM-L6-v2, held-out text of another kind (benchmarks/README.md, "Conversion fidelity"); 700 stage-2
    # steps, not 400: better on both tuning texts when the transfer trains on short and long text together
    # (benchmarks/results/conversion_paragraphs/README.md); finetune: stage 1 only, with the window: 99.64%
    # [98.84%, 100.45%] of softmax's accuracy on the quality benchmark's test_large split, 5 seeds
    # (benchmarks/results/all_layers_test_large/rela_window4/README.md).
    transfer_defaults={
        "convert": {"lora_r": 32, "lora_alpha": 64, "steps": 150, "stage2_steps": 700, "stage2_loss": "cosine",
                    "stage2_lr": 1e-3},
        "finetune": {"lora_r": 32, "lora_alpha": 64, "steps": 100, "stage2_loss": "cosine", "stage2_lr": 1e-3},
    },
)

__all__ = ["RELA", "GatedRMSNorm", "RelaConfig"]
