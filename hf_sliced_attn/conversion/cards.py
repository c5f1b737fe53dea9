"""Model cards: one renderer for converted folders and fine-tunes, filled from the package's templates.

* :func:`render_conversion_card` fills ``model_cards/converted.md`` from a conversion's
  ``fidelity.json`` report; :func:`render_glue_card` fills ``model_cards/glue.md`` for a
  GLUE fine-tune. Both write ``README.md`` into the folder and return the
  :class:`huggingface_hub.ModelCard` (YAML metadata, ``model-index`` with the metrics).
* What a card says about a mechanism (title, paper, description, tag) comes from the
  registry (:data:`hf_sliced_attn.MECHANISMS`).
"""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..mechanisms import MECHANISMS

TEMPLATES = files("hf_sliced_attn") / "model_cards"
PLUGIN_TAG = "hf-sliced-attn"
NON_METRICS = ("loss", "runtime", "per_second", "epoch", "step")
"""Fragments of metric names (as the Trainer reports them) that are not evaluation results."""


def base_model_license(source: str | Path) -> str | None:
    """The license in the model card (README.md) of a local checkpoint folder, or None."""
    readme = Path(source) / "README.md"
    if not readme.is_file():
        return None
    license_ = ModelCard.load(readme).data.license
    return license_ if isinstance(license_, str) else None


def _hub_id(name: str | None) -> str | None:
    """``name`` if it looks like a Hub id ("org/name") rather than a local path or a description
    (only Hub ids belong in ``base_model`` and ``datasets``)."""
    return name if name and not Path(name).exists() and re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name) else None


LOCAL_BASE_MODEL = "a local checkpoint"
"""How a card names a base model whose Hub id is unknown (a card never holds a local path)."""


def _model_ref(name: str | None) -> str:
    """Markdown for a base model: a link to its Hub page, or :data:`LOCAL_BASE_MODEL`."""
    return f"[{name}](https://huggingface.co/{name})" if _hub_id(name) else LOCAL_BASE_MODEL


def _registered_names() -> str:
    return " and ".join(f'"{name}"' for name in MECHANISMS)


def _loading_code(model_id: str, *, model_class: str, mechanism: str, adapter_base: str | None = None) -> str:
    """The exact Python that loads the folder or repository ``model_id``."""
    if adapter_base is None:
        return (
            f"import hf_sliced_attn  # registers {_registered_names()} with transformers\n"
            f"from transformers import AutoTokenizer, {model_class}\n\n"
            f'tokenizer = AutoTokenizer.from_pretrained("{model_id}")\n'
            f'model = {model_class}.from_pretrained("{model_id}")  # runs {mechanism} attention, from config.json'
        )
    return (
        f"import hf_sliced_attn  # registers {_registered_names()} with transformers\n"
        f"from peft import PeftModel\n"
        f"from transformers import AutoConfig, AutoTokenizer, {model_class}\n\n"
        f'config = AutoConfig.from_pretrained("{model_id}")  # the base config with the {mechanism} options\n'
        f'base = {model_class}.from_pretrained("{adapter_base}", config=config)\n'
        f'model = PeftModel.from_pretrained(base, "{model_id}")\n'
        f'tokenizer = AutoTokenizer.from_pretrained("{model_id}")'
    )


def _sentence_transformers_code(model_id: str) -> str:
    """The Python that loads ``model_id`` with sentence-transformers."""
    return (
        f"import hf_sliced_attn  # registers {_registered_names()} with transformers\n"
        f"from sentence_transformers import SentenceTransformer\n\n"
        f'model = SentenceTransformer("{model_id}")\n'
        f'embeddings = model.encode(["The weather is lovely today.", "It is sunny outside."])\n'
        f"print(model.similarity(embeddings, embeddings))"
    )


def _mechanism_fields(mechanism: str) -> dict[str, Any]:
    info = MECHANISMS.get_mechanism(mechanism)
    return {"mechanism": mechanism, "mechanism_title": info.title, "mechanism_description": info.description,
            "arxiv_id": info.paper.arxiv_id, "paper_authors": info.paper.authors, "paper_title": info.paper.title}


def _layers_description(layers: list[int], options: dict[str, Any]) -> str:
    """ "in layers 0, 1, 2 , 4 slice(s) per head, ..." from the saved mechanism ``options``."""
    text = f"in layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))}"
    return ", ".join([text, *MECHANISMS.config_from_dict(options).describe()])


def _model_name(model_id: str) -> str:
    return model_id.rstrip("/").split("/")[-1]


def _fmt(value: float) -> str:
    return f"{value:.4f}"


def render_conversion_card(output_dir: str | Path, *, report: dict[str, Any], model_id: str | None = None,
                           save: bool = True) -> ModelCard:
    """The card of a converted folder, from its fidelity ``report`` (the content of ``fidelity.json``).

    ``model_id`` is the name in the loading snippet (default: the folder's name). With
    ``save``, the card is written to ``output_dir/README.md``.
    """
    output_dir = Path(output_dir)
    model_id = model_id or output_dir.name
    mechanism, base = report["mechanism"], report["base_model"]
    training = report["training"]
    embedding_model = report.get("sentence_transformers")
    card = ModelCard.from_template(
        _conversion_card_data(report, model_id), template_path=str(TEMPLATES / "converted.md"),
        model_name=_model_name(model_id), base_model_ref=_model_ref(base), adapter_only=report["adapter_only"],
        layers_description=_layers_description(report["converted_layers"], report["mechanism_options"]),
        loading_code=_loading_code(model_id, model_class="AutoModel", mechanism=mechanism,
                                   adapter_base=(_hub_id(base) or "path/to/the-base-model")
                                   if report["adapter_only"] else None),
        sentence_transformers_code=_sentence_transformers_code(model_id) if embedding_model == "kept" else None,
        sentence_transformers_adapter=embedding_model == "adapter-only",
        training=training, training_text=", ".join(map(str, training["text"])),
        wall_time=f"{report['wall_time_s'] / 60:.1f} min", heldout=report["heldout"],
        heldout_source=", ".join(report["heldout"]["source"]) if isinstance(report["heldout"]["source"], list)
        else report["heldout"]["source"],
        **_fidelity_rows(report), **_mechanism_fields(mechanism),
    )
    if save:
        card.save(output_dir / "README.md")
    return card


def _conversion_card_data(report: dict[str, Any], model_id: str) -> ModelCardData:
    """The YAML metadata of a converted folder's card: a sentence-transformers model when it kept
    the original's sentence-transformers files."""
    embedding_model = report.get("sentence_transformers") == "kept"
    library = "peft" if report["adapter_only"] else "sentence-transformers" if embedding_model else "transformers"
    tags = [PLUGIN_TAG, MECHANISMS.get_mechanism(report["mechanism"]).tag, "attention-transfer"]
    results = [
        EvalResult(task_type="feature-extraction", dataset_type="text", dataset_name="held-out text",
                   metric_type="cosine_similarity", metric_value=round(report["embedding_cosine"]["after"], 4),
                   metric_name="Cosine to the original model (mean-pooled embeddings)"),
        EvalResult(task_type="feature-extraction", dataset_type="text", dataset_name="held-out text",
                   metric_type="spearmanr", metric_value=round(report["pairwise_spearman"]["after"], 4),
                   metric_name="Spearman with the original model's pairwise cosine similarities"),
    ]
    return ModelCardData(
        base_model=_hub_id(report["base_model"]), library_name=library, license=report.get("license"),
        tags=tags + ["sentence-transformers"] if embedding_model else tags,
        datasets=report["training"]["datasets"] or None,
        pipeline_tag="sentence-similarity" if embedding_model else "feature-extraction",
        model_name=_model_name(model_id), eval_results=results,
    )


def _fidelity_rows(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The card's two fidelity tables: the summary metrics and the attention error per layer."""
    errors = report["attention_relative_error"]
    names = {"attention_relative_error": "mean relative error of the attention outputs",
             "hidden_state_cosine": "cosine of the final hidden states (token level)",
             "embedding_cosine": "cosine of the mean-pooled embeddings",
             "pairwise_spearman": "Spearman of the pairwise cosine similarities"}
    rows = [{"name": names["attention_relative_error"], "before": _fmt(errors["mean_before"]),
             "after": _fmt(errors["mean_after"])}]
    rows += [{"name": names[key], "before": _fmt(report[key]["before"]), "after": _fmt(report[key]["after"])}
             for key in ("hidden_state_cosine", "embedding_cosine", "pairwise_spearman")]
    layer_rows = [{"layer": layer, "before": _fmt(errors["before"][layer]), "after": _fmt(errors["after"][layer])}
                  for layer in errors["after"]]
    return {"fidelity_rows": rows, "layer_rows": layer_rows}


def render_glue_card(output_dir: str | Path, *, base_model: str | None, task_name: str, metrics: dict[str, float],
                     mechanism: str, dataset_name: str | None = None, split: str = "validation",
                     model_id: str | None = None, license: str | None = None,
                     attention_transfer: dict[str, Any] | None = None) -> ModelCard:
    """Write ``output_dir/README.md`` for a model fine-tuned on GLUE ``task_name`` and return the card.

    ``metrics`` are the evaluation results on ``split`` (e.g. ``{"eval_accuracy": 0.91}``;
    an ``eval_`` prefix is dropped, and losses, runtimes and counters are left out of the
    ``model-index``). ``dataset_name`` is the Hub dataset trained on (default ``nyu-mll/glue``), or
    a description of local data in the task's format: then the card claims no GLUE result (the metadata lists
    no dataset and no ``glue`` tag, and the ``model-index`` names the local data by that description, with
    the dataset type ``local``). ``model_id`` names the model
    in the loading snippet (default: the folder's name). ``base_model`` is a Hub id, or None
    when it has none (the card then says "a local checkpoint"). ``attention_transfer`` is the record of
    the attention transfer that preceded fine-tuning (``steps``, ``stage2_steps``, ``wall_time_s`` and,
    when measured, ``fidelity_texts`` and ``{"before": x, "after": y}`` per fidelity measure), or None.
    """
    MECHANISMS.get_mechanism(mechanism)  # an unknown one fails here, listing the valid ones
    output_dir = Path(output_dir)
    model_id = model_id or output_dir.name
    dataset = dataset_name or "nyu-mll/glue"
    dataset_id = _hub_id(dataset)
    scores = {name.removeprefix("eval_"): float(value) for name, value in metrics.items()
              if isinstance(value, (int, float)) and not any(part in name for part in NON_METRICS)}
    if not scores:
        raise ValueError(f"No evaluation metric in {metrics!r}.")
    task_title = f"GLUE {task_name.upper()}" if dataset_id else f"{task_name.upper()}-format text classification"
    results = [
        EvalResult(task_type="text-classification", task_name=task_title, dataset_type=dataset_id or "local",
                   dataset_name=task_title if dataset_id else dataset, dataset_config=task_name if dataset_id else None,
                   dataset_split=split, metric_type=name, metric_value=round(value, 4))
        for name, value in scores.items()
    ]
    card_data = ModelCardData(
        base_model=_hub_id(base_model), library_name="transformers",
        license=license or (base_model_license(base_model) if base_model else None),
        tags=[PLUGIN_TAG, MECHANISMS.get_mechanism(mechanism).tag, *(["glue"] if dataset_id else [])],
        datasets=[dataset_id] if dataset_id else None, pipeline_tag="text-classification",
        model_name=_model_name(model_id), eval_results=results,
    )
    card = ModelCard.from_template(
        card_data, template_path=str(TEMPLATES / "glue.md"), model_name=_model_name(model_id),
        base_model_ref=_model_ref(base_model), task_title=task_title,
        dataset_description=f"{task_title} ({dataset})" if dataset_id else dataset, split=split,
        metrics={name: _fmt(value) for name, value in scores.items()},
        loading_code=_loading_code(model_id, model_class="AutoModelForSequenceClassification", mechanism=mechanism),
        transfer=attention_transfer, transfer_rows=[
            {"name": name, "before": _fmt(attention_transfer[key]["before"]), "after": _fmt(attention_transfer[key]["after"])}
            for key, name in (("attention_relative_error_mean", "mean relative error of the attention outputs"),
                              ("hidden_state_cosine", "cosine of the final hidden states (token level)"),
                              ("embedding_cosine", "cosine of the mean-pooled embeddings"),
                              ("pairwise_spearman", "Spearman of the pairwise cosine similarities"))
            if key in attention_transfer] if attention_transfer else [],
        **_mechanism_fields(mechanism),
    )
    card.save(output_dir / "README.md")
    return card
