"""Several training processes on a machine without GPUs."""

from __future__ import annotations

import os
from typing import Any

import torch


def cpu_process_group_kwargs() -> dict[str, Any]:
    """Extra ``accelerate.Accelerator`` arguments for the launch at hand.

    ``{"cpu": True}`` when several processes were launched (``WORLD_SIZE`` > 1: torchrun, or
    ``accelerate launch --multi_gpu --num_processes N``) on a machine without CUDA: accelerate
    then joins them in one gloo process group. Without it, each process finds no GPU and
    runs alone, as if it were the only one. Otherwise ``{}``.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
        return {"cpu": True}
    return {}
