"""Tests of recipes/glue.py on tiny BERTs built here (offline, CPU).

Most runs call the recipe's ``main(argv)`` in this process (imports are the slow part);
the multi-process run and the offline-Hub error run it as a real subprocess.
"""

from __future__ import annotations

import importlib.util
import itertools
import dataclasses
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score

import hf_sliced_attn
from hf_sliced_attn.attention import LAYER_MODE_ATTR
from hf_sliced_attn.mechanisms import Paper
from hf_sliced_attn.conversion.settings import mechanism_transfer_defaults
from hf_sliced_attn.conversion.training_text import encoder_batches
from hf_sliced_attn.conversion.transfer import transfer_mode

from tests.helpers.threads import one_thread  # noqa: F401  (autouse: this module's tests on one thread)

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "glue.py"
SAMPLE = REPO / "recipes" / "data" / "glue_sample"
MECHANISMS = list(hf_sliced_attn.MECHANISMS)
TASKS = ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]

sys.path.insert(0, str(RECIPE.parent))  # as running the script would: it imports glue_data from its folder
import glue_data  # noqa: E402

spec = importlib.util.spec_from_file_location("glue_recipe", RECIPE)
glue = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = glue  # as an import would: the recipe's dataclasses look their module up there
spec.loader.exec_module(glue)

# GLUE-format files of the bundled sample, per format
DATA = {
    "sst2": ["--train_file", str(SAMPLE / "sst2" / "train.tsv"), "--validation_file", str(SAMPLE / "sst2" / "validation.tsv")],
    "mrpc": ["--train_file", str(SAMPLE / "mrpc" / "train.csv"), "--validation_file", str(SAMPLE / "mrpc" / "validation.csv")],
    "stsb": ["--train_file", str(SAMPLE / "stsb" / "train.json"), "--validation_file", str(SAMPLE / "stsb" / "validation.json")],
    "mnli": ["--train_file", str(SAMPLE / "mnli" / "train.json"),
             "--validation_file", str(SAMPLE / "mnli" / "validation_matched.json"),
             "--validation_mismatched_file", str(SAMPLE / "mnli" / "validation_mismatched.json")],
}
EXPECTED_METRICS = {
    "sst2": {"eval_accuracy"},
    "mrpc": {"eval_accuracy", "eval_f1"},
    "stsb": {"eval_pearson", "eval_spearmanr"},
    "mnli": {"eval_accuracy", "eval_accuracy_mm"},
}


def subprocess_env(**extra) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def reset_accelerate():
    """Each in-process run builds its own Accelerator: forget the previous run's singletons."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def run(argv) -> dict:
    reset_accelerate()
    glue.main([str(a) for a in argv])
    out = Path(argv[argv.index("--output_dir") + 1])
    return json.loads((out / "all_results.json").read_text())


def make_tiny(path: Path, dropout: float = 0.0, head_labels: int | None = None, num_hidden_layers: int = 2) -> Path:
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification, BertModel

    tokenizer = AutoTokenizer.from_pretrained(glue.default_model_path())
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=num_hidden_layers, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    if head_labels:  # a fine-tuned classifier
        config.num_labels = head_labels
        model = BertForSequenceClassification(config)
    else:  # an encoder without head, like the pretrained MiniLM
        model = BertModel(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tiny_dropout(tmp_path_factory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("tiny_dropout"), dropout=0.1)


def common(model: Path, out: Path, attn: str = "sliced_relu", transfer: int | None = 0) -> list:
    """The flags of a tiny run. ``transfer``: --attention_transfer_steps for a plugin mechanism (0: the direct
    path, for the tests of fine-tuning mechanics; None: the recipe's default)."""
    steps = ["--attention_transfer_steps", transfer] if transfer is not None and attn in hf_sliced_attn.MECHANISMS else []
    return ["--model_name_or_path", model, "--output_dir", out, "--attn_implementation", attn,
            "--per_device_train_batch_size", 16, "--per_device_eval_batch_size", 16, "--learning_rate", 1e-3,
            "--seed", 1, *steps]


def assert_claims_no_glue_result(card: str, data_name: str) -> None:
    """A card of a run on local files: its metadata names no GLUE dataset, type or tag, and its results
    name the local data."""
    header = yaml.safe_load(card.split("---")[1])
    assert "datasets" not in header and "glue" not in header["tags"]
    for result in header["model-index"][0]["results"]:
        assert result["dataset"]["type"] == "local" and data_name in result["dataset"]["name"]
        assert "GLUE" not in result["task"]["name"] and "GLUE" not in result["dataset"]["name"].split("(")[0]


def log_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def assert_same_weights(a_dir: Path, b_dir: Path, atol: float = 1e-6) -> None:
    a, b = load_file(a_dir / "model.safetensors"), load_file(b_dir / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=atol, msg=name)


def recompute(out: Path, task: str, files: dict, attn: str) -> dict:
    """Predict the validation files with the saved model and compute the GLUE metric by hand."""
    import pandas as pd
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(out, attn_implementation=attn).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    keys = {"sst2": ("sentence", None), "mrpc": ("sentence1", "sentence2"), "stsb": ("sentence1", "sentence2"),
            "mnli": ("premise", "hypothesis")}[task]
    results = {}
    for suffix, path in files.items():
        df = pd.read_csv(path, sep="\t") if path.endswith(".tsv") else (
            pd.read_csv(path) if path.endswith(".csv") else pd.read_json(path, lines=True))
        texts = [df[keys[0]].tolist()] + ([df[keys[1]].tolist()] if keys[1] else [])
        with torch.no_grad():
            logits = model(**tokenizer(*texts, padding=True, truncation=True, max_length=128, return_tensors="pt")).logits
        labels = df["label"].to_numpy()
        if task == "stsb":
            preds = logits.squeeze(-1).numpy().astype(np.float64)
            results[f"eval_pearson{suffix}"] = pearsonr(preds, labels)[0]
            results[f"eval_spearmanr{suffix}"] = spearmanr(preds, labels)[0]
        else:
            preds = logits.argmax(-1).numpy()
            results[f"eval_accuracy{suffix}"] = float((preds == labels).mean())
            if task == "mrpc":
                results[f"eval_f1{suffix}"] = f1_score(labels, preds)
        results[f"eval_samples{suffix}"] = len(df)
    return results


# ----------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("attn", MECHANISMS)
@pytest.mark.parametrize("task", ["sst2", "mrpc", "stsb", "mnli"])
def test_end_to_end(task, attn, tiny, tmp_path):
    out = tmp_path / "out"
    # sst2: local files with --task_name (the task's metric and label names) and a test file; others: inferred
    test_file = ["--task_name", "sst2", "--test_file", SAMPLE / "sst2" / "test.tsv"] if task == "sst2" else []
    # the default path: a short attention transfer, then fine-tuning
    results = run(common(tiny, out, attn, transfer=3) + DATA[task] + test_file + ["--max_train_steps", 6, "--max_train_samples", 96])

    metric_keys = {k for k in results if k.startswith("eval_") and "samples" not in k}
    assert metric_keys == EXPECTED_METRICS[task]
    transfer = results["attention_transfer"]
    assert (transfer["steps"], transfer["stage2_steps"]) == (3, 0) and transfer["wall_time_s"] > 0
    assert transfer["fidelity_texts"] == min(64, results["eval_samples"])  # validation texts (pairs as pairs)
    for name in ("attention_relative_error_mean", "hidden_state_cosine", "embedding_cosine", "pairwise_spearman"):
        assert set(transfer[name]) == {"before", "after"} and all(isinstance(v, float) for v in transfer[name].values())
    for key in metric_keys:
        low = -1.0 if task == "stsb" else 0.0
        assert low <= results[key] <= 1.0, (key, results[key])
    # the metric equals a by-hand evaluation of the saved model on every validation example
    files = {"": DATA[task][3]} | ({"_mm": DATA[task][5]} if task == "mnli" else {})
    expected = recompute(out, task, files, attn)
    for key, value in expected.items():
        assert results[key] == pytest.approx(value, abs=1e-4), key
    assert results["train_steps"] == 6
    assert len((out / "train_log.jsonl").read_text().splitlines()) == 6
    config = json.loads((out / "config.json").read_text())
    assert config["attn_implementation"] == attn
    for option, value in hf_sliced_attn.MECHANISMS[attn].conversion_options("finetune").items():  # transferred
        assert config[hf_sliced_attn.CONFIG_KEY][option] == value, option
    # the saved head: one label per class of the data, named (GLUE names with --task_name), or one regression score
    expected_labels = {"sst2": ["negative", "positive"], "mrpc": ["0", "1"], "stsb": ["LABEL_0"], "mnli": ["0", "1", "2"]}
    assert [config["id2label"][str(i)] for i in range(len(config["id2label"]))] == expected_labels[task]
    assert config["problem_type"] == ("regression" if task == "stsb" else "single_label_classification")
    assert (out / "tokenizer.json").is_file() and (out / "README.md").is_file()
    card = (out / "README.md").read_text()
    assert "---" in card and "## Attention transfer" in card and "3 steps matching" in card
    assert_claims_no_glue_result(card, "glue_sample/")
    after = transfer["embedding_cosine"]["after"]
    assert f"| cosine of the mean-pooled embeddings | {transfer['embedding_cosine']['before']:.4f} | {after:.4f} |" in card
    assert not (out / "transfer_checkpoints").exists()  # removed once the run is over
    for path in [*out.glob("*.json"), *out.glob("*.md"), *out.glob("*.jsonl")]:  # names, never local paths
        assert str(tiny) not in path.read_text() and str(out) not in path.read_text(), path.name
    if task == "sst2":  # predictions on the unlabeled test file, with the label names
        lines = (out / "predict_results.txt").read_text().splitlines()
        assert len(lines) == 1 + 21 and {l.split("\t")[1] for l in lines[1:]} <= {"negative", "positive"}


def test_finetuned_head_label_order_is_kept(tmp_path):
    """A head fine-tuned with its own label order keeps it: the data's labels map onto the head's ids."""
    model_dir = make_tiny(tmp_path / "head", head_labels=2)
    config = json.loads((model_dir / "config.json").read_text())
    config["label2id"], config["id2label"] = {"POSITIVE": 0, "NEGATIVE": 1}, {"0": "POSITIVE", "1": "NEGATIVE"}
    (model_dir / "config.json").write_text(json.dumps(config))
    args = glue.parse_args([str(a) for a in common(model_dir, tmp_path / "o") + ["--task_name", "sst2"] + DATA["sst2"]])
    built = glue.build_config(args, 2, [0, 1], False)
    assert built.label2id == {"negative": 1, "positive": 0}


def test_multiprocess_counts_each_example_once(tiny, tmp_path):
    """2 CPU processes: 101 validation examples (odd: padding duplicates would show) evaluated exactly once.
    An attention transfer (its objective DDP-wrapped) runs first; the fine-tuning model is prepared after it."""
    out = tmp_path / "out"
    # accelerate's --cpu flag starts one process (several need mpirun); through torchrun on a machine
    # without GPUs the recipe runs N CPU processes over gloo.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(RECIPE),
           *map(str, common(tiny, out, transfer=3) + DATA["sst2"] + ["--max_train_steps", 3, "--max_train_samples", 64,
                                                                    "--checkpointing_steps", 2])]
    proc = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_samples"] == 101
    hits = results["eval_accuracy"] * 101
    assert abs(hits - round(hits)) < 1e-6  # a count out of exactly 101 examples
    assert results["eval_accuracy"] == pytest.approx(recompute(out, "sst2", {"": DATA["sst2"][3]}, "sliced_relu")["eval_accuracy"])
    assert "processes = 2," in proc.stderr  # the recipe's log: really two processes
    assert "Attention transfer done: 3 steps" in proc.stderr and results["attention_transfer"]["steps"] == 3
    assert [r["step"] for r in log_of(out)] == [1, 2, 3] and len({round(r["loss"], 6) for r in log_of(out)}) > 1
    assert json.loads((out / "step_2" / glue.STATE_FILE).read_text())["attention_transfer"] == results["attention_transfer"]


# ----------------------------------------------------------------------------- resume
# 4 updates per epoch: mid-epoch 0, the end of epoch 0, mid-epoch 1 (a dropout model: the RNG must match too)
@pytest.mark.parametrize("resume_step", [2, 4, 5])
def test_resume_matches_uninterrupted(resume_step, tiny_dropout, tmp_path):
    args = DATA["sst2"] + ["--max_train_samples", 64, "--max_train_steps", 6, "--checkpointing_steps", 1]
    full = run(common(tiny_dropout, tmp_path / "full") + args)
    checkpoint = tmp_path / "full" / f"step_{resume_step}"
    assert checkpoint.is_dir()
    resumed = run(common(tiny_dropout, tmp_path / "resumed") + args + ["--resume_from_checkpoint", checkpoint])

    for key, value in full.items():
        if key.startswith("eval_"):
            assert resumed[key] == pytest.approx(value, abs=1e-6), key
    a = load_file(tmp_path / "full" / "model.safetensors")
    b = load_file(tmp_path / "resumed" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-6, msg=name)
    full_log = [json.loads(l) for l in (tmp_path / "full" / "train_log.jsonl").read_text().splitlines()]
    resumed_log = [json.loads(l) for l in (tmp_path / "resumed" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed_log] == list(range(resume_step + 1, 7))
    for x, y in zip(full_log[resume_step:], resumed_log):
        assert y["loss"] == pytest.approx(x["loss"], abs=1e-6) and y["lr"] == pytest.approx(x["lr"])


def test_resume_latest_picks_most_advanced(tiny, tmp_path, caplog):
    out = tmp_path / "out"
    args = (common(tiny, out, transfer=2) + DATA["sst2"]
            + ["--max_train_samples", 32, "--max_train_steps", 4, "--checkpointing_steps", 1])
    first = run(args)
    assert glue.find_checkpoint(glue.parse_args([str(a) for a in args] + ["--resume_from_checkpoint", "latest"])).name == "step_4"
    with caplog.at_level("INFO"):
        again = run(args + ["--resume_from_checkpoint", "latest"])  # nothing left to train: same model, same metrics
    assert again["eval_accuracy"] == first["eval_accuracy"] and again["train_steps"] == 4
    assert "Attention transfer not rerun" in caplog.text  # the fine-tuning checkpoint holds the transferred weights
    assert again["attention_transfer"] == first["attention_transfer"]  # the record travels in the checkpoint
    log = [json.loads(l)["step"] for l in (out / "train_log.jsonl").read_text().splitlines()]
    assert log == [1, 2, 3, 4]
    # resuming in place from an earlier checkpoint drops the log lines of the updates redone
    run(args + ["--resume_from_checkpoint", out / "step_2"])
    assert [json.loads(l)["step"] for l in (out / "train_log.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


# ----------------------------------------------------------------------------- gradient accumulation
def test_gradient_accumulation_matches_large_batch(tiny, tmp_path):
    base = DATA["sst2"] + ["--max_train_samples", 64, "--max_train_steps", 4, "--seed", 3, "--attention_transfer_steps", 0,
                           "--model_name_or_path", tiny, "--attn_implementation", "sliced_relu", "--learning_rate", 1e-3]
    run(base + ["--output_dir", tmp_path / "big", "--per_device_train_batch_size", 32])
    run(base + ["--output_dir", tmp_path / "acc", "--per_device_train_batch_size", 8, "--gradient_accumulation_steps", 4])
    big = [json.loads(l) for l in (tmp_path / "big" / "train_log.jsonl").read_text().splitlines()]
    acc = [json.loads(l) for l in (tmp_path / "acc" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in big] == [r["step"] for r in acc] == [1, 2, 3, 4]  # 4 updates, not 16
    assert [r["lr"] for r in acc] == pytest.approx([r["lr"] for r in big])
    assert [r["loss"] for r in acc] == pytest.approx([r["loss"] for r in big], rel=1e-4, abs=1e-5)
    assert len({round(r["loss"], 6) for r in big}) > 1  # the weights do move between updates
    # The head's weights agree too. (Not every tensor: rows of position embeddings that only padding
    # reaches have ~0 gradients whose float noise Adam's normalisation turns into full-size steps.)
    a, b = load_file(tmp_path / "big" / "model.safetensors"), load_file(tmp_path / "acc" / "model.safetensors")
    for name in ("classifier.weight", "classifier.bias"):
        torch.testing.assert_close(b[name], a[name], rtol=1e-3, atol=1e-5, msg=name)


# ----------------------------------------------------------------------------- LoRA
@pytest.mark.parametrize("attn", MECHANISMS)
def test_lora_trains_adapters_new_modules_and_head(attn, tiny, tmp_path):
    from transformers import AutoModelForSequenceClassification

    out = tmp_path / "out"
    argv = [str(a) for a in common(tiny, out, attn, transfer=2) + DATA["sst2"] + ["--lora", "--max_train_steps", 3,
                                                                                  "--max_train_samples", 48]]
    args = glue.parse_args(argv)
    model = glue.add_lora(args, glue.build_model(args, glue.build_config(args, 2, [0, 1], False)))
    new_modules = hf_sliced_attn.modules_to_save(model.get_base_model())
    assert new_modules
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert any("lora_A" in n for n in trainable) and any("lora_B" in n for n in trainable)
    assert any("classifier" in n for n in trainable)
    for module in new_modules:
        assert any(module in n and "modules_to_save" in n for n in trainable), module
    for name in trainable:  # nothing else: embeddings, FFN, norms, pretrained projections stay frozen
        assert "lora_" in name or "modules_to_save" in name, name
    assert any("word_embeddings" in n for n in frozen) and any("intermediate" in n for n in frozen)

    results = run(argv)  # a transfer (its own LoRA, merged), then fine-tuning LoRA (merged)
    assert 0.0 <= results["eval_accuracy"] <= 1.0 and results["attention_transfer"]["steps"] == 2
    loaded, info = AutoModelForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not any("lora" in k or "modules_to_save" in k for k in load_file(out / "model.safetensors"))
    assert loaded.config._attn_implementation == attn
    # the saved (merged) model is the trained one: its accuracy is the reported one
    assert results["eval_accuracy"] == pytest.approx(recompute(out, "sst2", {"": DATA["sst2"][3]}, attn)["eval_accuracy"])


# ----------------------------------------------------------------------------- attention transfer
def recipe_parts(argv):
    """The recipe's steps up to the attention transfer: (args, accelerator, data, tokenizer, model, processed,
    the transfer settings)."""
    args = glue.parse_args([str(a) for a in argv])
    reset_accelerate()
    accelerator = glue.make_accelerator(args)
    data = glue.prepare_data(args)
    config, tokenizer, model = glue.prepare_model(args, data)
    processed = glue.tokenize(args, data, tokenizer, config, accelerator)
    return args, accelerator, data, tokenizer, model, processed, glue.resolve_transfer(args, config)


def test_transfer_trains_the_task_models_encoder(tiny, tmp_path, caplog):
    """The step trains the task model's own encoder (LoRA merged into the attention projections, the mechanism's
    modules), nothing else, brings its attention closer to softmax's, and leaves every parameter trainable."""
    args, accelerator, data, tokenizer, model, processed, transfer = recipe_parts(
        common(tiny, tmp_path / "o", transfer=20) + DATA["mrpc"] + ["--max_train_samples", 64, "--keep_softmax_layers", 0])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with caplog.at_level("INFO"):
        record = glue.transfer_attention_step(args, accelerator, model, tokenizer, data, processed, transfer)
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()  # no adapter or wrapper left behind
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert any(".sliced_" in n for n in changed) and any("attention.self.query.weight" in n for n in changed)
    assert all(n.startswith("bert.encoder.layer.") and ".attention." in n for n in changed), changed
    assert all(p.requires_grad for p in model.parameters())  # fine-tuning decides what trains
    assert all(p.grad is None for p in model.parameters())  # no transfer gradient leaks into the first update
    error = record["attention_relative_error_mean"]
    assert record["steps"] == 20 and error["after"] < 0.5 * error["before"], error
    assert "Attention transfer to sliced_relu" in caplog.text and "converted layers = [0, 1]" in caplog.text
    assert "Attention transfer done: 20 steps" in caplog.text and "embedding_cosine" in caplog.text
    assert (glue.transfer_checkpoint_dir(args) / "latest").is_file()  # kept until fine-tuning has a checkpoint


def test_zero_transfer_steps_is_the_direct_path(tiny, tmp_path, caplog):
    out = tmp_path / "out"
    with caplog.at_level("INFO"):
        results = run(common(tiny, out, transfer=0) + DATA["sst2"] + ["--max_train_steps", 2, "--max_train_samples", 32])
    assert "attention_transfer" not in results
    assert "Attention transfer skipped: --attention_transfer_steps 0" in caplog.text
    options = json.loads((out / "config.json").read_text())[hf_sliced_attn.CONFIG_KEY]
    assert options == hf_sliced_attn.MECHANISMS["sliced_relu"].make_config().to_dict()  # the config defaults
    assert options["projection"] == "linear" and options["affine_output"] is False
    assert "## Attention transfer" not in (out / "README.md").read_text()
    assert not (out / "transfer_checkpoints").exists()


def resolved_transfer(argv):
    """The transfer settings the recipe resolves for ``argv`` on its 2-class data (None: no transfer)."""
    args = glue.parse_args([str(a) for a in argv])
    glue.use_bundled_defaults(args)
    return args, glue.resolve_transfer(args, glue.build_config(args, 2, [0, 1], False))


@pytest.mark.parametrize("attn", MECHANISMS)
def test_transfer_defaults_are_the_mechanisms(attn, tiny, tmp_path):
    """Left out, each setting is the mechanism's measured best before fine-tuning; the batch is the training
    batch; on the tiny 2-layer model at most one layer goes back to softmax, none when the layers are listed."""
    defaults = mechanism_transfer_defaults(attn, "finetune")
    args, resolved = resolved_transfer(common(tiny, tmp_path / "o", attn, transfer=None) + DATA["sst2"])
    expected = {**defaults, "batch_size": args.per_device_train_batch_size,
                "keep_softmax_layers": min(defaults["keep_softmax_layers"], 1)}
    assert dataclasses.asdict(resolved) == expected and resolved.steps > 0
    _, listed = resolved_transfer(common(tiny, tmp_path / "o", attn, transfer=None) + DATA["sst2"] + ["--layers", "0,1"])
    assert listed.keep_softmax_layers == 0  # the user chose the layers
    _, given = resolved_transfer(common(tiny, tmp_path / "o", attn, transfer=None) + DATA["sst2"]
                                 + ["--attention_transfer_lr", "5e-4", "--checkpointing_steps", "7"])
    assert (given.lr, given.checkpoint_every) == (5e-4, 7)


def test_help_shows_the_options_the_transfer_before_fine_tuning_uses(capsys):
    """--help gives each mechanism option's default as a run from a softmax checkpoint takes it: the transfer's."""
    with pytest.raises(SystemExit) as exit_info:
        glue.parse_args(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    shown = {flag: re.search(rf" {flag} [A-Z_]+ .*?\(default: ([^)]*)\)", text) for flag in ("--local_window",
                                                                                           "--num_slices")}
    assert {flag: match and match.group(1) for flag, match in shown.items()} == {
        "--local_window": "4", "--num_slices": "1"}


@pytest.fixture(scope="module")
def tiny_modernbert(tmp_path_factory) -> Path:
    """A 4-layer ModernBERT encoder (layers 0 and 2 global, 1 and 3 local) with MiniLM's tokenizer."""
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertModel

    path = tmp_path_factory.mktemp("tiny_modernbert")
    tokenizer = AutoTokenizer.from_pretrained(glue.default_model_path())
    torch.manual_seed(0)
    config = ModernBertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                              intermediate_size=64, max_position_embeddings=128, global_attn_every_n_layers=2,
                              local_attention=8, pad_token_id=tokenizer.pad_token_id)
    ModernBertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_no_default_keeps_a_global_modernbert_layer_on_softmax(tiny_modernbert, tmp_path, rela_keeps_two_layers):
    """Issue #24: on ModernBERT (local layers beside global ones) the recipe's default keeps no converted layer on
    softmax, whatever the mechanism's default count (here ReLA's is 2 on BERT-style models); a given count
    applies."""
    assert mechanism_transfer_defaults("rela", "finetune")["keep_softmax_layers"] == 2
    flags = common(tiny_modernbert, tmp_path / "o", "rela", transfer=None) + DATA["sst2"]
    _, resolved = resolved_transfer(flags)
    assert resolved.keep_softmax_layers == 0
    _, given = resolved_transfer(flags + ["--keep_softmax_layers", "1"])
    assert given.keep_softmax_layers == 1


@pytest.mark.parametrize("attn", MECHANISMS)
def test_the_default_run_converts_every_global_modernbert_layer_with_its_window(attn, tiny_modernbert, tmp_path):
    """The default run on ModernBERT: the transfer converts both global layers, with the window of 4 beside the
    mechanism; the local layers keep their windowed softmax; the saved model reloads with every global layer
    converted."""
    from transformers import AutoModelForSequenceClassification

    out = tmp_path / "out"
    results = run(common(tiny_modernbert, out, attn, transfer=None) + DATA["sst2"] + [
        "--attention_transfer_steps", 3, "--max_train_steps", 2, "--max_train_samples", 32])
    assert "softmax_layers" not in results["attention_transfer"]
    saved = json.loads((out / "config.json").read_text())[hf_sliced_attn.CONFIG_KEY]
    assert (saved["layers"], saved["local_window"]) == ("global", 4)
    model = AutoModelForSequenceClassification.from_pretrained(out)
    modes = [getattr(layer.attn, LAYER_MODE_ATTR) for layer in model.model.layers]
    assert modes == [attn, "softmax", attn, "softmax"]


def test_softmax_baselines_take_no_transfer(tiny, tmp_path):
    for attn in ("sdpa", "eager"):
        assert resolved_transfer(common(tiny, tmp_path / "o", attn) + DATA["sst2"])[1] is None


def test_keep_softmax_layers_returns_the_worst_layer_to_softmax(tiny, tmp_path, caplog):
    """After the transfer, the layer of largest attention error on training text is the checkpoint's softmax layer
    again (its weights, no plugin module); the other keeps its trained attention; config.json lists it."""
    from transformers import AutoModel

    args, accelerator, data, tokenizer, model, processed, transfer = recipe_parts(
        common(tiny, tmp_path / "o", transfer=10) + DATA["sst2"] + ["--max_train_samples", 64, "--keep_softmax_layers", 1])
    with caplog.at_level("INFO"):
        record = glue.transfer_attention_step(args, accelerator, model, tokenizer, data, processed, transfer)
    errors = record["softmax_layers"]["attention_relative_error"]
    worst = max(errors, key=errors.get)
    assert record["softmax_layers"]["layers"] == [int(worst)] and set(errors) == {"0", "1"}
    other = 1 - int(worst)
    assert getattr(model.config, hf_sliced_attn.CONFIG_KEY)["layers"] == [other]
    original = AutoModel.from_pretrained(tiny).encoder.layer
    for index, layer in enumerate(model.bert.encoder.layer):
        attention = layer.attention.self
        plugin = [name for name, _ in attention.named_children() if name.startswith("sliced_")]
        same = torch.equal(attention.query.weight, original[index].attention.self.query.weight)
        assert (plugin == [] and same) if index == int(worst) else (plugin != [] and not same)
    assert f"softmax kept on layers [{int(worst)}]" in caplog.text


def test_sliced_relu_by_default_converts_every_layer_with_its_window(tiny, tmp_path):
    """Issue #24: the recipe's default sliced_relu run keeps no layer on softmax and saves the window of 4."""
    out = tmp_path / "out"
    results = run(common(tiny, out, transfer=None) + DATA["sst2"] + ["--attention_transfer_steps", 3,
                                                                     "--max_train_steps", 2, "--max_train_samples", 32])
    assert "softmax_layers" not in results["attention_transfer"]
    saved = json.loads((out / "config.json").read_text())[hf_sliced_attn.CONFIG_KEY]
    assert (saved["layers"], saved["local_window"], saved["window_combine"]) == ("global", 4, "shared")
    assert (saved["projection"], saved["num_slices"], saved["affine_output"]) == ("linear", 1, True)


def test_a_hybrid_run_saves_and_reloads_its_layers(tiny, tmp_path):
    """--keep_softmax_layers 1 on a 2-layer model keeps one layer on softmax; the saved model reloads as that hybrid
    and reproduces its outputs."""
    from transformers import AutoModelForSequenceClassification

    out = tmp_path / "out"
    results = run(common(tiny, out, transfer=None) + DATA["sst2"] + ["--attention_transfer_steps", 3,
                                                                     "--max_train_steps", 2, "--max_train_samples", 32,
                                                                     "--keep_softmax_layers", 1])
    kept = results["attention_transfer"]["softmax_layers"]["layers"]
    assert len(kept) == 1
    saved = json.loads((out / "config.json").read_text())[hf_sliced_attn.CONFIG_KEY]
    assert saved["layers"] == [i for i in (0, 1) if i not in kept]
    assert f"Layer {kept[0]}, whose attention error" in " ".join((out / "README.md").read_text().split())
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    names = {n for n, _ in model.named_parameters()}
    assert not any(n.startswith(f"bert.encoder.layer.{kept[0]}.") and ".sliced_" in n for n in names)
    assert any(".sliced_" in n for n in names)
    inputs = {"input_ids": torch.tensor([[101, 2023, 2003, 102]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    with torch.no_grad():
        again = AutoModelForSequenceClassification.from_pretrained(out).eval()
        assert torch.equal(model(**inputs).logits, again(**inputs).logits)


def make_converted(tiny: Path, path: Path):
    """A checkpoint converted to sliced_relu (its config holds the plugin's options)."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    config = hf_sliced_attn.prepare_config(AutoConfig.from_pretrained(tiny), "sliced_relu", projection="mlp",
                                           affine_output=True, num_slices=2)
    converted = AutoModel.from_pretrained(tiny, config=config)
    converted.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(path)
    return converted


def test_a_converted_checkpoint_skips_the_transfer(tiny, tmp_path, caplog):
    converted = make_converted(tiny, tmp_path / "converted")
    out = tmp_path / "out"
    with caplog.at_level("INFO"):  # the default steps: the transfer would run from a softmax checkpoint
        results = run(common(tmp_path / "converted", out, transfer=None) + DATA["sst2"]
                      + ["--max_train_steps", 2, "--max_train_samples", 32])
    assert "attention_transfer" not in results
    assert "Attention transfer skipped: the checkpoint is already converted" in caplog.text
    saved = json.loads((out / "config.json").read_text())[hf_sliced_attn.CONFIG_KEY]
    assert saved == converted.config.to_dict()[hf_sliced_attn.CONFIG_KEY]  # its own options, not convert's defaults


def test_the_recipes_transfer_batches_are_a_function_of_seed_step_and_process(tiny, tmp_path):
    args, _, _, tokenizer, model, processed, transfer = recipe_parts(
        common(tiny, tmp_path / "o", transfer=3) + DATA["mrpc"] + ["--attention_transfer_batch_size", 4])
    steps = 2 * len(processed["train"]) // 4  # two passes over the data: the stream cycles

    def take(count, args=args, **process):
        batches = encoder_batches(processed["train"], tokenizer, model.base_model, transfer.batch_size, args.seed)
        return list(itertools.islice(batches.stream(0, **process), count))

    first, again = take(steps), take(steps)
    assert len(first) == steps and set(first[0]) == {"input_ids", "token_type_ids", "attention_mask"}  # no labels
    assert all(b["input_ids"].shape[0] == 4 for b in first)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first, again))
    other_seed = take(3, args=glue.parse_args([str(a) for a in common(tiny, tmp_path / "o", transfer=3) + DATA["mrpc"]
                                                 + ["--attention_transfer_batch_size", 4, "--seed", 7]]))
    assert not torch.equal(other_seed[0]["input_ids"], first[0]["input_ids"])
    rank0, rank1 = take(3, process_index=0, num_processes=2), take(3, process_index=1, num_processes=2)
    for a, b in zip(rank0, rank1):  # each process its own texts
        assert not torch.equal(a["input_ids"], b["input_ids"])


def test_transfer_mode_is_converts_and_is_restored():
    """During the transfer the accelerator is set as `convert` builds its own; after it the fine-tuning model is
    prepared alone (the transfer's DDP-wrapped objective dropped)."""
    from accelerate import Accelerator

    reset_accelerate()
    accelerator = Accelerator(gradient_accumulation_steps=4)
    with transfer_mode(accelerator):
        assert accelerator.gradient_accumulation_steps == 1 and not accelerator.step_scheduler_with_optimizer
        assert accelerator.ddp_handler.find_unused_parameters
        accelerator.prepare(torch.nn.Linear(2, 2))
    assert accelerator.gradient_accumulation_steps == 4 and accelerator.step_scheduler_with_optimizer
    assert accelerator.ddp_handler is None and accelerator._models == []


def interrupt_transfer_at(monkeypatch, step: int) -> None:
    """Ctrl-C after transfer step ``step``: the transfer saves its checkpoint and the interrupt propagates."""
    original = glue.transfer_and_select

    def interrupted(*args, **kwargs):
        def on_step(done, loss):
            if done == step:
                raise KeyboardInterrupt
        return original(*args, **kwargs, on_step=on_step)

    monkeypatch.setattr(glue, "transfer_and_select", interrupted)


# 4 stage-1 steps then 2 of stage 2: interrupted in stage 1, and in stage 2 (a dropout model: the RNG must match too)
@pytest.mark.parametrize("interrupt_step", [2, 5])
def test_an_interrupted_transfer_resumes_to_the_same_weights(interrupt_step, tiny_dropout, tmp_path, monkeypatch, caplog):
    args = DATA["sst2"] + ["--max_train_samples", 64, "--max_train_steps", 3, "--attention_transfer_stage2_steps", 2]
    full = run(common(tiny_dropout, tmp_path / "full", transfer=4) + args)
    out = tmp_path / "resumed"
    with monkeypatch.context() as patch:
        interrupt_transfer_at(patch, interrupt_step)
        with pytest.raises(KeyboardInterrupt):
            run(common(tiny_dropout, out, transfer=4) + args)
    assert (out / "transfer_checkpoints" / "latest").is_file() and not (out / "all_results.json").exists()
    with caplog.at_level("INFO"):
        resumed = run(common(tiny_dropout, out, transfer=4) + args + ["--resume_from_checkpoint", "latest"])
    assert f"Resuming attention transfer from step {interrupt_step}." in caplog.text

    assert_same_weights(tmp_path / "full", out)
    for key, value in full.items():
        if key.startswith("eval_"):
            assert resumed[key] == pytest.approx(value, abs=1e-6), key
    resumed["attention_transfer"].pop("wall_time_s"), full["attention_transfer"].pop("wall_time_s")
    assert resumed["attention_transfer"] == full["attention_transfer"]  # the same fidelity, "before" saved with the state
    assert [r["loss"] for r in log_of(out)] == pytest.approx([r["loss"] for r in log_of(tmp_path / "full")], abs=1e-6)
    assert not (out / "transfer_checkpoints").exists()


def test_a_run_interrupted_after_its_transfer_resumes_to_the_same_weights(tiny_dropout, tmp_path, caplog):
    """A fine-tuning checkpoint holds the transferred weights (and the transfer's record): the transfer is not rerun."""
    args = DATA["sst2"] + ["--max_train_samples", 64, "--max_train_steps", 6, "--checkpointing_steps", 2]
    full = run(common(tiny_dropout, tmp_path / "full", transfer=3) + args)
    with caplog.at_level("INFO"):
        resumed = run(common(tiny_dropout, tmp_path / "resumed", transfer=3) + args
                      + ["--resume_from_checkpoint", tmp_path / "full" / "step_2"])
    assert "Attention transfer not rerun: fine-tuning resumes from step_2" in caplog.text
    assert "Attention transfer to" not in caplog.text
    assert_same_weights(tmp_path / "full", tmp_path / "resumed")
    assert resumed["attention_transfer"] == full["attention_transfer"]
    assert [r["step"] for r in log_of(tmp_path / "resumed")] == [3, 4, 5, 6]


def test_the_finished_transfer_is_kept_until_fine_tuning_checkpoints(tiny, tmp_path, monkeypatch, caplog):
    """Interrupted in fine-tuning before its first checkpoint, a run resumes from the finished transfer."""
    data = DATA["sst2"] + ["--max_train_samples", 64, "--max_train_steps", 4]
    full = run(common(tiny, tmp_path / "full", transfer=3) + data)
    args = common(tiny, tmp_path / "out", transfer=3) + data
    original = glue.finish_update

    def interrupted(args, run_, position, *rest):
        original(args, run_, position, *rest)
        if position.completed_steps == 2:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(glue, "finish_update", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run(args)
    assert (tmp_path / "out" / "transfer_checkpoints" / "latest").is_file()
    with caplog.at_level("INFO"):
        resumed = run(args + ["--resume_from_checkpoint", "latest"])
    assert "Resuming attention transfer from step 3." in caplog.text  # the finished transfer, loaded rather than redone
    assert_same_weights(tmp_path / "full", tmp_path / "out")
    assert resumed["eval_accuracy"] == full["eval_accuracy"]
    assert not (tmp_path / "out" / "transfer_checkpoints").exists()


def test_transfer_under_fsdp_names_the_fix(tiny, tmp_path):
    """FSDP would shard the encoder for the transfer and again for fine-tuning: refused, with the ways out."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    args, _, data, tokenizer, model, processed, transfer = recipe_parts(
        common(tiny, tmp_path / "o", transfer=3) + DATA["sst2"])
    fsdp = SimpleNamespace(distributed_type=DistributedType.FSDP)
    with pytest.raises(glue.RecipeError, match="hf-sliced-attn convert") as err:
        glue.transfer_attention_step(args, fsdp, model, tokenizer, data, processed, transfer)
    assert "FSDP" in str(err.value) and "--attention_transfer_steps 0" in str(err.value)


def test_transfer_errors(capsys, tiny, tmp_path):
    for attn in ("sdpa", "eager"):
        expect_error(capsys, common(tiny, tmp_path / "o", attn) + DATA["sst2"] + ["--attention_transfer_steps", 5],
                     "--attention_transfer_steps 5", f"not to {attn!r}", "Drop it", "--attn_implementation sliced_relu")
    glue.parse_args([str(a) for a in common(tiny, tmp_path / "o", "sdpa") + DATA["sst2"] + ["--attention_transfer_steps", 0]])
    expect_error(capsys, common(tiny, tmp_path / "o", transfer=-1) + DATA["sst2"],
                 "--attention_transfer_steps must be >= 0", "got -1")
    expect_error(capsys, common(tiny, tmp_path / "o", transfer=0) + DATA["sst2"] + ["--attention_transfer_stage2_steps", 2],
                 "--attention_transfer_stage2_steps", "--attention_transfer_steps > 0")
    expect_error(capsys, common(tiny, tmp_path / "o", transfer=3) + DATA["sst2"] + ["--keep_softmax_layers", -1],
                 "--keep_softmax_layers must be >= 0", "got -1")
    expect_error(capsys, common(tiny, tmp_path / "o", transfer=0) + DATA["sst2"] + ["--keep_softmax_layers", 1],
                 "--keep_softmax_layers 1", "--attention_transfer_steps > 0", "list the layers to convert")
    expect_error(capsys, common(tiny, tmp_path / "o", "sdpa") + DATA["sst2"] + ["--keep_softmax_layers", 1],
                 "--keep_softmax_layers 1", "plugin's mechanisms")
    expect_error(capsys, common(tiny, tmp_path / "o", transfer=3) + DATA["sst2"] + ["--keep_softmax_layers", 1,
                                                                                   "--layers", "0"],
                 "--keep_softmax_layers", "give it or a list of layers to convert, not both")
    expect_error(capsys, common(tiny, tmp_path / "o", transfer=3) + DATA["sst2"] + ["--keep_softmax_layers", 2],
                 "--keep_softmax_layers 2 leaves none of the 2 converted layers")
    assert not (tmp_path / "o" / glue.TRANSFER_CHECKPOINTS).exists()  # refused before any transfer work
    empty = tmp_path / "empty.json"
    empty.write_text("".join(json.dumps({"sentence": "", "label": i % 2}) + "\n" for i in range(8)))
    expect_error(capsys, common(tiny, tmp_path / "o", transfer=3) + ["--train_file", empty, "--validation_file", empty],
                 "['sentence']", "empty", "--text_columns", "--attention_transfer_steps 0")


# ----------------------------------------------------------------------------- bad input
def expect_error(capsys, argv, *fragments):
    reset_accelerate()
    with pytest.raises(SystemExit) as exc:
        glue.main([str(a) for a in argv])
    assert exc.value.code not in (0, None)
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def test_unknown_task(capsys, tmp_path):
    expect_error(capsys, ["--task_name", "sst3", "--output_dir", tmp_path], "sst3", *TASKS)


def test_missing_file(capsys, tiny, tmp_path):
    missing = tmp_path / "nope.csv"
    expect_error(capsys, common(tiny, tmp_path / "o") + ["--train_file", missing, "--validation_file", DATA["sst2"][3]],
                 str(missing), "no such file")


def test_wrong_columns(capsys, tiny, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("text,target\nsome words,1\nother words,0\n")
    err = expect_error(capsys, common(tiny, tmp_path / "o") + ["--train_file", bad, "--validation_file", bad],
                       "text", "target", "sentence1+sentence2", "premise+hypothesis", "--text_columns")
    assert "found columns" in err


def test_explicit_columns_work(tiny, tmp_path):
    data = tmp_path / "renamed.csv"
    rows = ["review,stars"] + [f"{'great fun' if i % 2 else 'dull mess'}{' really' * (i % 4)},{i % 2}" for i in range(21)]
    data.write_text("\n".join(rows) + "\n")
    results = run(common(tiny, tmp_path / "o") + ["--train_file", data, "--validation_file", data, "--text_columns", "review",
                                                 "--label_column", "stars", "--max_train_steps", 2])
    assert results["eval_samples"] == 21


def test_unknown_attn_implementation(capsys, tiny, tmp_path):
    expect_error(capsys, common(tiny, tmp_path / "o", attn="flash_relu") + DATA["sst2"],
                 "flash_relu", "sdpa", "eager", *MECHANISMS)


def test_label_count_mismatch_with_finetuned_head(capsys, tmp_path):
    model = make_tiny(tmp_path / "three_way", head_labels=3)
    expect_error(capsys, common(model, tmp_path / "o") + DATA["sst2"], "3 label", "2", "--ignore_mismatched_sizes")


def test_unknown_preset(capsys, tmp_path):
    expect_error(capsys, ["--preset", "bert-huge-sst2", "--output_dir", tmp_path], "bert-huge-sst2", "roberta-base-sst2")


def test_push_to_hub_offline_fails_clearly(capsys, tiny, tmp_path):
    expect_error(capsys, common(tiny, tmp_path / "o") + DATA["sst2"] + ["--push_to_hub", "--hub_model_id", "me/x"],
                 "--push_to_hub")


def test_task_name_offline_says_hub_unreachable(tiny, tmp_path):
    cmd = [sys.executable, str(RECIPE), "--task_name", "rte", *map(str, common(tiny, tmp_path / "o"))]
    proc = subprocess.run(cmd, env=subprocess_env(HF_HOME=str(tmp_path / "hf_home")), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    assert "Hub" in proc.stderr and "--train_file" in proc.stderr and "HF_HUB_OFFLINE" in proc.stderr, proc.stderr[-3000:]


# ----------------------------------------------------------------------------- presets, metric
def test_presets_apply_and_flags_override():
    args = glue.parse_args(["--preset", "roberta-base-rte", "--train_file", DATA["sst2"][1], "--validation_file",
                            DATA["sst2"][3], "--learning_rate", "3e-5"])
    assert args.learning_rate == 3e-5  # explicit flag wins
    assert args.per_device_train_batch_size == 16 and args.warmup_ratio == 0.06 and args.weight_decay == 0.1
    assert args.num_train_epochs == 10 and args.adam_beta2 == 0.98
    assert args.task_name is None  # local files: the preset's Hub task is not forced on them
    presets = glue.load_presets()
    assert all(p["source"] for p in presets.values())
    assert {n.split("-base-")[1] for n in presets} <= set(TASKS)
    modern = glue.parse_args(["--preset", "modernbert-base-cola"])
    assert modern.task_name == "cola" and modern.model_name_or_path == "answerdotai/ModernBERT-base"


@pytest.mark.parametrize("config_name,preds,refs,expected", [
    ("cola", [1, 0, 1, 1], [1, 0, 0, 1], {"matthews_correlation": 0.5773502691896258}),
    ("mrpc", [1, 0, 1, 1], [1, 0, 0, 1], {"accuracy": 0.75, "f1": 0.8}),
    ("qqp", [0, 0, 1, 1], [1, 0, 0, 1], {"accuracy": 0.5, "f1": 0.5}),
    ("stsb", [0.5, 1.0, 3.0, 2.5], [0.0, 1.5, 2.0, 4.0], {"pearson": 0.741665, "spearmanr": 0.8}),
    ("mnli", [0, 1, 2, 2], [0, 1, 1, 2], {"accuracy": 0.75}),
])
def test_local_glue_metric(config_name, preds, refs, expected):
    import evaluate

    metric = evaluate.load(str(glue_data.GLUE_METRIC_DIR), config_name=config_name, keep_in_memory=True)
    result = metric.compute(predictions=preds, references=refs)
    assert result.keys() == expected.keys()
    for key, value in expected.items():
        assert result[key] == pytest.approx(value, abs=1e-4)


def test_plugin_options_reach_the_config(tiny, tmp_path):
    argv = [str(a) for a in common(tiny, tmp_path / "o") + DATA["sst2"] + ["--num_slices", 3, "--attn_layers", "0"]]
    args = glue.parse_args(argv)
    config = glue.build_config(args, 2, [0, 1], False)
    options = config.to_dict()[hf_sliced_attn.CONFIG_KEY]
    assert options["num_slices"] == 3 and options["layers"] == [0]
    model = glue.build_model(args, config)
    converted = [n for n, _ in model.named_modules() if n.endswith("sliced_projection")]
    assert converted == ["bert.encoder.layer.0.attention.self.sliced_projection"]  # only layer 0
    assert model.bert.encoder.layer[0].attention.self.sliced_projection.directions.shape == (4, 3, 8)  # heads, slices, dim


def test_a_converted_checkpoint_keeps_its_options_and_trained_modules(tiny, tmp_path, capsys):
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    converted_dir = tmp_path / "converted"
    config = hf_sliced_attn.prepare_config(AutoConfig.from_pretrained(tiny), "sliced_relu", projection="mlp",
                                           affine_output=True, num_slices=2)
    converted = AutoModel.from_pretrained(tiny, config=config)
    converted.save_pretrained(converted_dir)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(converted_dir)
    trained = {n: p for n, p in converted.state_dict().items() if ".sliced_" in n}

    args = glue.parse_args([str(a) for a in common(converted_dir, tmp_path / "o") + DATA["sst2"]])
    model = glue.build_model(args, glue.build_config(args, 2, [0, 1], False))
    assert model.config.to_dict()[hf_sliced_attn.CONFIG_KEY] == converted.config.to_dict()[hf_sliced_attn.CONFIG_KEY]
    loaded = {n.removeprefix("bert."): p for n, p in model.state_dict().items() if ".sliced_" in n}
    assert loaded.keys() == trained.keys()
    for name, tensor in trained.items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0)
    # Options that would rebuild the trained modules differently are refused.
    expect_error(capsys, common(converted_dir, tmp_path / "o2") + DATA["sst2"] + ["--num_slices", 4],
                 "converted with", "num_slices")


def test_sliced_relu_projection_and_affine_output_flags(tiny, tmp_path):
    argv = common(tiny, tmp_path / "o") + DATA["sst2"] + ["--projection", "mlp", "--affine_output"]
    args = glue.parse_args([str(a) for a in argv])
    config = glue.build_config(args, 2, [0, 1], False)
    options = config.to_dict()[hf_sliced_attn.CONFIG_KEY]
    assert (options["projection"], options["affine_output"]) == ("mlp", True)
    attention = glue.build_model(args, config).bert.encoder.layer[0].attention.self
    assert type(attention.sliced_projection).__name__ == "SlicedMLPProjection" and hasattr(attention, "sliced_output")


def test_layers_flag_and_its_alias(tiny, tmp_path):
    """--layers is generated from the mechanisms' options; --attn_layers (the README's) is the same flag."""
    for flag in ("--layers", "--attn_layers"):
        args = glue.parse_args([str(a) for a in common(tiny, tmp_path / "o", "rela") + DATA["sst2"] + [flag, "1"]])
        assert args.layers == [1]
        assert glue.build_config(args, 2, [0, 1], False).to_dict()[hf_sliced_attn.CONFIG_KEY]["layers"] == [1]
    assert glue.parse_args([str(a) for a in common(tiny, tmp_path / "o") + DATA["sst2"]]).layers is None  # not given


def test_bad_plugin_options(capsys, tiny, tmp_path):
    expect_error(capsys, common(tiny, tmp_path / "o") + DATA["sst2"] + ["--attn_layers", "first"], "--attn_layers", "global")
    expect_error(capsys, common(tiny, tmp_path / "o") + DATA["sst2"] + ["--layers", "first"], "--layers", "global")
    expect_error(capsys, common(tiny, tmp_path / "o", attn="rela") + DATA["sst2"] + ["--num_slices", 2],
                 "--num_slices applies to sliced_relu only", "not to rela")
    expect_error(capsys, common(tiny, tmp_path / "o", attn="rela") + DATA["sst2"] + ["--projection", "mlp", "--no-affine_output"],
                 "--projection applies to sliced_relu only", "--affine_output applies to sliced_relu only")
    expect_error(capsys, common(tiny, tmp_path / "o", attn="sliced_relu") + DATA["sst2"] + ["--norm_eps", 1e-5],
                 "--norm_eps applies to rela only", "not to sliced_relu")
    expect_error(capsys, common(tiny, tmp_path / "o", attn="sdpa") + DATA["sst2"] + ["--layers", "0"],
                 "--layers applies to", "not to softmax attention")


@dataclass
class EchoConfig(hf_sliced_attn.MechanismConfig):
    mechanism: ClassVar[str] = "echo"
    echo_gain: float = field(default=1.0, metadata={"help": "a made-up option"})


def test_a_mechanism_registered_at_run_time_is_offered(tiny, tmp_path):
    """The --attn_implementation choices and the option flags are read from the registry when the parser is built."""
    argv = [str(a) for a in common(tiny, tmp_path / "o", "echo") + DATA["sst2"] + ["--echo_gain", 0.5]]
    with pytest.raises(SystemExit):
        glue.parse_args(argv)
    echo = hf_sliced_attn.Mechanism(
        config_class=EchoConfig, module_names=(), build_modules=lambda *_: {}, attend=None,
        title="Echo", tag="echo", paper=Paper(arxiv_id="0000.00000", authors="Nobody"), description="A test.")
    hf_sliced_attn.register_mechanism(echo)
    try:
        args = glue.parse_args(argv)
        assert (args.attn_implementation, args.echo_gain) == ("echo", 0.5)
        assert glue.attention_options(args) == {"echo_gain": 0.5}
    finally:
        hf_sliced_attn.MECHANISMS.unregister("echo")


def test_softmax_baseline_runs_without_a_plugin_card(tiny, tmp_path, caplog):
    """sdpa/eager: trained and saved like the mechanisms; render_glue_card describes a mechanism, so no README.md."""
    out = tmp_path / "out"
    with caplog.at_level("INFO"):
        results = run(common(tiny, out, "sdpa") + DATA["sst2"] + ["--max_train_steps", 2, "--max_train_samples", 32])
    assert 0.0 <= results["eval_accuracy"] <= 1.0 and results["train_steps"] == 2
    assert json.loads((out / "config.json").read_text()).get(hf_sliced_attn.CONFIG_KEY) is None
    assert not (out / "README.md").exists()
    assert "No model card written" in caplog.text
    assert "Attention transfer skipped: 'sdpa' is softmax attention" in caplog.text and "attention_transfer" not in results


@pytest.mark.parametrize("model, fragment", [
    ("/no/such/folder", "No local folder '/no/such/folder' exists, and the name cannot be a Hub model id"),
    ("someorg/no-such-model", "cannot be downloaded because the machine is offline"),
])
def test_a_missing_model_is_one_line(capsys, tmp_path, monkeypatch, model, fragment):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    err = expect_error(capsys, ["--model_name_or_path", model, *DATA["sst2"], "--output_dir", tmp_path / "o"],
                       fragment)
    assert err.count("\n") == 1 and "Traceback" not in err
