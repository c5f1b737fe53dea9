#!/usr/bin/env bash
# The GPU checks in one call of a few minutes, to run whenever a CUDA GPU is available:
# the op tests marked `cuda` (values and gradients against the float64 references), then the
# time and memory table of the ops side by side with SDPA (benchmarks/results/gpu/).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'No CUDA GPU visible to torch.')"
python -m pytest -m cuda tests/ops -q
python benchmarks/gpu_check.py "$@"
