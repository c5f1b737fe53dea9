"""A conversion under ``accelerate launch`` with two CPU processes (gloo), through the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .test_convert import assert_converted_folder
from tests.helpers.models import HELDOUT_TEXT, TRAIN_TEXT

REPO = Path(__file__).resolve().parents[2]


def test_two_processes_convert_together(tiny_roberta, tmp_path):
    output = tmp_path / "out"
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "-m", "hf_sliced_attn.cli", "convert", "--model", str(tiny_roberta), "--attn", "sliced_relu",
               "--text", TRAIN_TEXT, "--heldout-text", HELDOUT_TEXT, "--output", str(output),
               "--steps", "20", "--stage2-steps", "4", "--checkpoint-every", "5", "--keep-softmax-layers", "1",
               "--local-window", "0"]  # the plain layer: convert's default window (16) covers these passages whole
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.count("Wrote ") == 1  # one process reports
    report = json.loads((output / "fidelity.json").read_text())
    assert report["training"]["num_processes"] == 2  # one process group, not two separate runs
    errors = report["attention_relative_error"]
    assert errors["mean_after"] < errors["mean_before"]
    assert len(report["converted_layers"]) == 1  # ranked by both processes, one layer went back to softmax
    assert_converted_folder(output, "sliced_relu")
