"""benchmarks/bench_transfer_step.py at a tiny shape: both variants' transfer step, folded through LoRA and with the
wrapped layers called, timed side by side with their paired ratio; "called" really calls them."""

from __future__ import annotations

import json

import torch

from benchmarks import bench_transfer_step as bench
from hf_sliced_attn.conversion.attention_taps import attention_modules


def test_both_variants_are_timed_folded_and_called(tmp_path):
    assert bench.main(["--shapes", "2x16", "--steps", "2", "--threads", "1", "--output", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "transfer_step.json").read_text())["results"]
    assert [(r["shape"], r["variant"]) for r in records] == [("2x16", "converted"), ("2x16", "linear")]
    for record in records:
        assert len(record["folded_s"]) == len(record["called_s"]) == 2
        ratios = [c / f for c, f in zip(record["called_s"], record["folded_s"])]
        assert abs(record["called_over_folded"]["mean"] - sum(ratios) / 2) < 1e-12
    assert "| 2x16 | converted |" in (tmp_path / "transfer_step.md").read_text()


def test_called_mode_runs_the_wrapped_query_layers(monkeypatch):
    """Folded, no LoRA-wrapped query layer runs; under ``lora_layers_called`` each one does."""
    student = bench.build_student(bench.VARIANTS["linear"])
    queries = [module.query for module in attention_modules(student)]
    calls = []
    lora_linear = type(queries[0])
    original = lora_linear.forward

    def forward(self, *args, **kwargs):  # patched on the class: a hook on the layer would stop the fold itself
        calls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(lora_linear, "forward", forward)
    batch = bench.make_batch(2, 16, student.config.vocab_size, student.config.pad_token_id)
    del batch["labels"]
    with torch.no_grad():
        with bench.lora_layers_called():
            student(**batch)
        assert sum(call in queries for call in calls) == len(queries)
        calls.clear()
        student(**batch)
    assert not any(call in queries for call in calls)
