"""benchmarks/bench_attention.py: the window variants time what their names say (issue #24's table)."""

from __future__ import annotations

import pytest
import torch

from benchmarks import bench_attention as bench
from hf_sliced_attn.ops import local_window_attention, sliced_relu


@pytest.mark.parametrize("size", [4, 16, 64])
@pytest.mark.parametrize("combine", ["shared", "gate"])
def test_a_window_variant_runs_its_window_and_combination(size, combine):
    name = f"sliced_relu_window{size}" + ("_gate" if combine == "gate" else "")
    contender = next(c for c in bench.WINDOW_VARIANTS_GROUP if c.name == name)
    forward, (q, k, v) = contender.build(100)
    directions = bench._directions(q.shape[-1])
    s, t = (torch.einsum("bhtd,hd->bht", x, directions) for x in (q, k))
    sliced, denominator = sliced_relu(s, t, v, return_denominator=True)
    mix = torch.full((q.shape[1],), 1.0 if combine == "shared" else 0.5)
    expected = local_window_attention(q, k, v, sliced, mix, window=size, combine=combine, denominator=denominator)
    torch.testing.assert_close(forward(), expected)
    other = local_window_attention(q, k, v, sliced, mix, window=size + 1, combine=combine, denominator=denominator)
    assert not torch.allclose(forward(), other)


def test_every_window_variant_is_one_contender_per_name_in_a_group():
    names = [c.name for c in bench.WINDOW_VARIANTS_GROUP]
    assert len(names) == len(set(names)) == 8
    assert bench.WINDOW_GROUP[0] in bench.WINDOW_VARIANTS_GROUP  # the same object: measured once per run
    group = next(g for g in bench.groups(False, None) if g.stem == "window_variants")
    assert group.lengths == [128, 512, 16384, 65536]
    assert set(names) <= set(bench.CONTENDER_NAMES)
