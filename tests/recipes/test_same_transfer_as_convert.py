"""``hf-sliced-attn convert`` and the GLUE recipe run one transfer: on the same text, settings and seed they
return the same layers to softmax, ranked by the same attention errors."""

from __future__ import annotations

import csv
import dataclasses

import pytest

from hf_sliced_attn import MECHANISMS
from hf_sliced_attn.convert import ConvertOptions, convert

from tests.recipes.test_glue import SAMPLE, glue, make_tiny, recipe_parts

SETTINGS = {"steps": 6, "stage2_steps": 2, "lora_r": 4, "lora_alpha": 8, "batch_size": 8, "keep_softmax_layers": 2}
SEED, MAX_LENGTH = 3, 48


def test_convert_and_the_recipe_return_the_same_layers_to_softmax(tmp_path):
    model = make_tiny(tmp_path / "tiny", num_hidden_layers=4)
    train_file = SAMPLE / "sst2" / "train.tsv"
    with open(train_file, newline="") as f:
        sentences = [row["sentence"] for row in csv.DictReader(f, delimiter="\t")]
    text = tmp_path / "train.txt"
    text.write_text("\n".join(sentences) + "\n")
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("Return the sum of the arguments.\nOpen the file and read it.\nA queue of pending jobs.\n")

    # every option of the layer the recipe's transfer builds (convert's own defaults differ: a window of 16)
    built = MECHANISMS["sliced_relu"].make_config(**MECHANISMS["sliced_relu"].conversion_options("finetune"))
    options = {option.name: getattr(built, option.name) for option in dataclasses.fields(built)}
    converted = convert(ConvertOptions(model=str(model), mechanism="sliced_relu", output_dir=str(tmp_path / "converted"),
                                       text=[str(text)], heldout_text=[str(heldout)], transfer=SETTINGS, seed=SEED,
                                       max_length=MAX_LENGTH, mechanism_options=options)).report["kept_softmax"]

    flags = [f"--{'' if name == 'keep_softmax_layers' else 'attention_transfer_'}{name}" for name in SETTINGS]
    argv = ["--model_name_or_path", model, "--output_dir", tmp_path / "finetuned", "--attn_implementation",
            "sliced_relu", "--train_file", train_file, "--validation_file", SAMPLE / "sst2" / "validation.tsv",
            "--seed", SEED, "--max_length", MAX_LENGTH,
            *[item for flag, value in zip(flags, SETTINGS.values()) for item in (flag, value)]]
    args, accelerator, data, tokenizer, task_model, processed, transfer = recipe_parts(argv)
    assert len(sentences) == len(processed["train"]) and transfer.total_steps == 8
    recipe = glue.transfer_attention_step(args, accelerator, task_model, tokenizer, data, processed,
                                          transfer)["softmax_layers"]

    assert recipe["layers"] == converted["layers"] and len(recipe["layers"]) == 2
    assert recipe["attention_relative_error"] == pytest.approx(converted["ranking_attention_error"], rel=1e-4)
