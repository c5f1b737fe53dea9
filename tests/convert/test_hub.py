"""Model cards and publishing: YAML metadata, model-index, loading code; push checks and dry run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from huggingface_hub import ModelCard
from safetensors.torch import load_file, save_file

from hf_sliced_attn.cli import main
from hf_sliced_attn.conversion.cards import render_conversion_card, render_glue_card
from hf_sliced_attn.hub import PushError, push, upload_plan


def yaml_header(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``folder`` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


@pytest.fixture
def no_token(monkeypatch, tmp_path):
    """No token anywhere: neither in the environment nor in a saved login."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr("hf_sliced_attn.hub.get_token", lambda: None)


def test_glue_card(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "README.md").write_text("---\nlicense: mit\n---\n# a base model\n")
    card = render_glue_card(tmp_path / "out", base_model=str(base), task_name="sst2", mechanism="rela",
                            metrics={"eval_accuracy": 0.9123, "eval_loss": 0.31, "eval_runtime": 2.0},
                            dataset_name="nyu-mll/glue")
    saved = ModelCard.load(tmp_path / "out" / "README.md")
    header = yaml_header(tmp_path / "out" / "README.md")
    assert header["license"] == "mit"  # inherited from the base model's card
    assert header["library_name"] == "transformers" and {"hf-sliced-attn", "rela"} <= set(header["tags"])
    assert header["datasets"] == ["nyu-mll/glue"] and "glue" in header["tags"]
    result = header["model-index"][0]["results"][0]
    assert result["dataset"] == {"type": "nyu-mll/glue", "name": "GLUE SST2", "config": "sst2", "split": "validation"}
    results = saved.data.eval_results
    assert [(r.metric_type, r.metric_value, r.dataset_split) for r in results] == [("accuracy", 0.9123, "validation")]
    assert header["model-index"][0]["results"][0]["metrics"][0]["value"] == 0.9123
    for text in ("pip install hf-sliced-attn", "import hf_sliced_attn",
                 'AutoModelForSequenceClassification.from_pretrained("out")', "arXiv 2104.07012",
                 "Zhang, Titov & Sennrich", "## Limitations"):
        assert text in str(card)
    assert str(tmp_path) not in str(card)  # the folder's name, never its path


def test_glue_card_on_local_data_lists_no_dataset(tmp_path):
    render_glue_card(tmp_path, base_model="FacebookAI/roberta-base", task_name="mrpc", mechanism="sliced_relu",
                     metrics={"eval_f1": 0.8, "eval_accuracy": 0.75},
                     dataset_name="the GLUE-format sample bundled with hf-sliced-attn (glue_sample/mrpc)")
    header = yaml_header(tmp_path / "README.md")
    assert "datasets" not in header and header["base_model"] == "FacebookAI/roberta-base"
    assert "glue" not in header["tags"]  # local files in a GLUE format are not GLUE: no claim of a GLUE result
    result = header["model-index"][0]["results"][0]
    assert result["dataset"]["type"] == "local" and "glue_sample/mrpc" in result["dataset"]["name"]
    assert result["task"]["name"] == "MRPC-format text classification"
    metrics = result["metrics"]
    assert {m["type"]: m["value"] for m in metrics} == {"f1": 0.8, "accuracy": 0.75}
    assert "glue_sample/mrpc" in (tmp_path / "README.md").read_text()


def test_glue_card_rejects_unknown_mechanism(tmp_path):
    with pytest.raises(ValueError, match="sliced_relu"):
        render_glue_card(tmp_path, base_model="b", task_name="sst2", metrics={"accuracy": 1.0}, mechanism="linear")


def test_conversion_card(converted_roberta):
    output = converted_roberta.output_dir
    header = yaml_header(output / "README.md")
    assert header["base_model"] == "FacebookAI/roberta-base" and header["library_name"] == "transformers"
    assert {"hf-sliced-attn", "sliced-relu"} <= set(header["tags"])
    metrics = {m["type"]: m["value"] for m in header["model-index"][0]["results"][0]["metrics"]}
    assert metrics["cosine_similarity"] == round(converted_roberta.report["embedding_cosine"]["after"], 4)
    text = (output / "README.md").read_text()
    assert str(output) not in text
    for snippet in ("pip install hf-sliced-attn", "import hf_sliced_attn", f'AutoModel.from_pretrained("{output.name}")',
                    "arXiv 2512.11411", "Boufadène & Vialard", "## Fidelity to the original model", "## Limitations"):
        assert snippet in text


def test_conversion_card_for_an_adapter_trained_on_a_hub_dataset(converted_roberta, tmp_path):
    report = {**converted_roberta.report, "adapter_only": True, "license": "apache-2.0"}
    report["training"] = {**report["training"], "datasets": ["someone/passages"]}
    card = render_conversion_card(tmp_path, report=report, model_id="someone/adapter")
    header = yaml_header(tmp_path / "README.md")
    assert header["library_name"] == "peft" and header["datasets"] == ["someone/passages"]
    assert header["license"] == "apache-2.0"
    assert 'PeftModel.from_pretrained(base, "someone/adapter")' in str(card)
    assert 'AutoModel.from_pretrained("FacebookAI/roberta-base", config=config)' in str(card)


def test_push_dry_run_lists_exactly_the_files(converted_roberta, capsys):
    output = converted_roberta.output_dir
    (output / ".scratch").write_text("not for upload")
    try:
        assert main(["push", str(output), "--repo-id", "someone/tiny-sliced", "--dry-run"]) == 0
    finally:
        (output / ".scratch").unlink()
    printed = capsys.readouterr().out
    file_lines = printed.split("would upload", 1)[1].split("--- README.md ---", 1)[0].splitlines()[1:]
    listed = [line.split()[0] for line in file_lines]
    on_disk = sorted(p.name for p in output.iterdir())
    assert listed == on_disk == upload_plan(output)
    assert {"config.json", "model.safetensors", "README.md", "fidelity.json", "tokenizer.json"} <= set(listed)
    # The card to upload names the repository in its loading code.
    assert 'AutoModel.from_pretrained("someone/tiny-sliced")' in printed


def test_push_refuses_a_modified_folder(converted_roberta, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(converted_roberta.output_dir, copy)
    weights = load_file(copy / "model.safetensors")
    # A weight rewritten at random: the query layer's, which the layer's softmax window reads (a shift of every
    # weight by one constant can leave the tiny model's outputs within the check's tolerance).
    name = next(k for k in weights if k.endswith("attention.self.query.weight"))
    weights[name] = torch.randn(weights[name].shape, generator=torch.Generator().manual_seed(0))
    save_file(weights, copy / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(PushError, match="differ from the ones recorded"):
        push(copy, "someone/x", dry_run=True, echo=lambda line: None)


def test_push_offline_without_token_fails_cleanly(converted_roberta, no_token, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    output = converted_roberta.output_dir
    before = snapshot(output.parent)
    assert main(["push", str(output), "--repo-id", "someone/tiny-sliced"]) != 0
    error = capsys.readouterr().err
    assert "HF_HUB_OFFLINE" in error and "no Hugging Face token" in error and "Nothing was uploaded" in error
    assert snapshot(output.parent) == before


def test_push_cli_exit_status(converted_roberta, tmp_path):
    """The real command line, in a fresh process: offline and without a token it exits non-zero."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home"), "OMP_NUM_THREADS": "1"}
    env.pop("HF_TOKEN", None)
    repo_root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(repo_root), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "hf_sliced_attn.cli", "push", str(converted_roberta.output_dir),
                           "--repo-id", "someone/tiny-sliced"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "hf-sliced-attn push: error: Cannot push" in done.stderr


def test_push_uploads_the_dry_run_files_in_one_commit(converted_roberta, monkeypatch):
    """With the Hub replaced by a recorder: the commit holds exactly the planned files and the re-rendered card."""
    calls = []

    class RecordingApi:
        def __init__(self, token):
            calls.append(("token", token))

        def create_repo(self, repo_id, private, exist_ok):
            calls.append(("create_repo", repo_id, private))

        def create_branch(self, repo_id, branch, exist_ok):
            calls.append(("create_branch", repo_id, branch))

        def create_commit(self, repo_id, operations, commit_message, revision):
            calls.append(("create_commit", repo_id, sorted(op.path_in_repo for op in operations), revision))
            card = next(op for op in operations if op.path_in_repo == "README.md").path_or_fileobj
            calls.append(("card", card.decode() if isinstance(card, bytes) else card.read().decode()))
            return type("Info", (), {"commit_url": "https://example.invalid/commit/1"})()

    monkeypatch.setattr("hf_sliced_attn.hub.HfApi", RecordingApi)
    monkeypatch.setattr("hf_sliced_attn.hub.hub_offline", lambda: False)
    output = converted_roberta.output_dir
    url = push(output, "someone/tiny", private=True, revision="v1", token="hf_test", echo=lambda line: None)
    assert url == "https://example.invalid/commit/1"
    assert calls[:4] == [("token", "hf_test"), ("create_repo", "someone/tiny", True),
                         ("create_branch", "someone/tiny", "v1"),
                         ("create_commit", "someone/tiny", upload_plan(output), "v1")]
    assert 'AutoModel.from_pretrained("someone/tiny")' in calls[4][1]
