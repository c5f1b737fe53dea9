"""benchmarks/bench_encode.py at a tiny size: every contender encodes both kinds of input, the converted models run
the plugin's attention with the convert defaults' options on the layers they convert (both recorded), and they keep
the original's modules and embedding size."""

from __future__ import annotations

import json

import pytest

import hf_sliced_attn

pytest.importorskip("sentence_transformers")

from benchmarks import bench_encode as bench  # noqa: E402
from hf_sliced_attn.attention import LAYER_MODE_ATTR, SOFTMAX  # noqa: E402
from hf_sliced_attn.conversion.settings import resolve_transfer_config  # noqa: E402


def test_every_contender_encodes_short_and_long_inputs(tmp_path):
    assert bench.main(["--rounds", "1", "--sentences", "8", "--long_inputs", "2", "--threads", "1",
                       "--output", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "encode.json").read_text())
    cases = {(r["inputs"], r["contender"]) for r in record["results"]}
    assert cases == {(case, name) for case in ("short sentences, batch 64", "512 tokens, batch 8")
                     for name in bench.CONTENDERS}
    assert all(r["sentences_per_s"] > 0 for r in record["results"])
    for name, mechanism, given in (("sliced_relu", "sliced_relu", {}), ("rela", "rela", {}),
                                   ("sliced_relu_mlp384", "sliced_relu", {"mlp_ratio": 1.0})):
        keep = resolve_transfer_config(mechanism, "convert", {}, converted_layers=6, layers_listed=False,
                                       has_local_layers=False).keep_softmax_layers
        assert record["layers"][name] == list(range(keep, 6))
        options = hf_sliced_attn.MECHANISMS[mechanism].conversion_options("convert", given)
        attention = record["attention"][name]
        assert attention["mechanism"] == mechanism and attention["layers"] == record["layers"][name]
        assert {k: v for k, v in options.items() if k != "mlp_ratio"}.items() <= attention.items()
    assert record["attention"]["sliced_relu"]["mlp_ratio"] == 0.25
    assert "mlp_ratio" not in record["attention"]["sliced_relu_mlp384"]  # the authors' width: not saved
    markdown = (tmp_path / "encode.md").read_text()
    assert "| 512 tokens, batch 8 |" in markdown and json.dumps(record["attention"]["sliced_relu"]) in markdown


@pytest.mark.parametrize("name", ["sliced_relu", "sliced_relu_mlp384", "rela"])
def test_a_converted_encoder_keeps_the_embedding_modules(name):
    original, _ = bench.encoder(bench.BASELINE)
    converted, layers = bench.encoder(name)
    modes = [getattr(layer.attention.self, LAYER_MODE_ATTR) for layer in converted[0].auto_model.encoder.layer]
    mechanism = bench.CONTENDERS[name][0]
    assert modes == [mechanism if i in layers else SOFTMAX for i in range(len(modes))]
    if mechanism == "sliced_relu":
        width = converted[0].auto_model.encoder.layer[0].attention.self.sliced_projection.width
        assert width == (384 if name.endswith("mlp384") else 96)
    texts = bench.short_sentences(3)
    embeddings = converted.encode(texts, convert_to_tensor=True)
    assert embeddings.shape == original.encode(texts, convert_to_tensor=True).shape
    assert [type(module).__name__ for module in converted] == [type(module).__name__ for module in original]
    assert len(bench.long_inputs(original, 2)) == 2
