"""Model cards and publishing to the Hugging Face Hub.

* :func:`render_conversion_card` fills ``model_cards/converted.md`` from a conversion's
  ``fidelity.json`` report; :func:`render_glue_card` fills ``model_cards/glue.md`` for a
  GLUE fine-tune. Both write ``README.md`` into the folder and return the
  :class:`huggingface_hub.ModelCard` (YAML metadata, ``model-index`` with the metrics).
* :func:`push` checks that a folder loads through the plugin and reproduces the outputs
  recorded at conversion time, then uploads it in one commit (``create_repo`` +
  ``create_commit``). It never writes into the folder.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import CommitOperationAdd, EvalResult, HfApi, ModelCard, ModelCardData, constants, get_token
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
from transformers import AutoTokenizer

from .config import CONFIG_KEY
from .convert import CHECKPOINT_DIR, REPORT_NAME, check_reference, load_converted

TEMPLATES = files("hf_sliced_attn") / "model_cards"
PLUGIN_TAG = "hf-sliced-attn"
NON_METRICS = ("loss", "runtime", "per_second", "epoch", "step")
"""Fragments of metric names (as the Trainer reports them) that are not evaluation results."""


@dataclass(frozen=True)
class Mechanism:
    """How a card describes one attention mechanism."""

    title: str
    tag: str
    arxiv_id: str
    authors: str
    paper_title: str | None
    description: str


MECHANISMS: dict[str, Mechanism] = {
    "sliced_relu": Mechanism(
        title="Sliced ReLU attention",
        tag="sliced-relu",
        arxiv_id="2512.11411",
        authors="Boufadène & Vialard",
        paper_title=None,
        description=(
            "Each head projects its queries and keys to M scalars (`sliced_projection`: learned directions w, "
            "s_i = ⟨w, q_i⟩ and t_j = ⟨w, k_j⟩, or the authors' MLP over all heads), and attends with the kernel "
            "ReLU(s_i − t_j) / Σ_l |s_i − t_l| to the centred values; the M kernels are averaged. With "
            "`affine_output`, a learned per-head gain and share of the mean value follow (`sliced_output`). "
            "Sorting the scalars makes it exact in O(n log n) time and O(n) memory: no n × n attention "
            "matrix is formed."
        ),
    ),
    "rela": Mechanism(
        title="ReLA (rectified linear attention)",
        tag="rela",
        arxiv_id="2104.07012",
        authors="Zhang, Titov & Sennrich (EMNLP 2021)",
        paper_title="Sparse Attention with Linear Units",
        description=(
            "ReLU(Q Kᵀ d^-½) V per head instead of the softmax, then a gated RMSNorm over all heads together "
            "(`rela_norm`): scale · x · rsqrt(mean(x²) + ε) · σ(gate ⊙ x). The attention weights are exactly "
            "sparse, and a head can attend to nothing."
        ),
    ),
}


class PushError(RuntimeError):
    """A push that cannot go ahead; the message says why and what to do."""


# --------------------------------------------------------------------------- cards


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


def _model_ref(name: str) -> str:
    """Markdown for a base model: a link to its Hub page, or its local path in code."""
    return f"[{name}](https://huggingface.co/{name})" if _hub_id(name) else f"`{name}`"


def _loading_code(model_id: str, *, model_class: str, mechanism: str, adapter_base: str | None = None) -> str:
    """The exact Python that loads the folder or repository ``model_id``."""
    if adapter_base is None:
        return (
            f'import hf_sliced_attn  # registers "sliced_relu" and "rela" with transformers\n'
            f"from transformers import AutoTokenizer, {model_class}\n\n"
            f'tokenizer = AutoTokenizer.from_pretrained("{model_id}")\n'
            f'model = {model_class}.from_pretrained("{model_id}")  # runs {mechanism} attention, from config.json'
        )
    return (
        f'import hf_sliced_attn  # registers "sliced_relu" and "rela" with transformers\n'
        f"from peft import PeftModel\n"
        f"from transformers import AutoConfig, AutoTokenizer, {model_class}\n\n"
        f'config = AutoConfig.from_pretrained("{model_id}")  # the base config with the {mechanism} options\n'
        f'base = {model_class}.from_pretrained("{adapter_base}", config=config)\n'
        f'model = PeftModel.from_pretrained(base, "{model_id}")\n'
        f'tokenizer = AutoTokenizer.from_pretrained("{model_id}")'
    )


def _mechanism_fields(mechanism: str) -> dict[str, Any]:
    info = MECHANISMS[mechanism]
    return {"mechanism": mechanism, "mechanism_title": info.title, "mechanism_description": info.description,
            "arxiv_id": info.arxiv_id, "paper_authors": info.authors, "paper_title": info.paper_title}


def _layers_description(layers: list[int], options: dict[str, Any]) -> str:
    text = f"in layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))}"
    if "num_slices" in options:
        text += f", {options['num_slices']} slice(s) per head"
    if "projection" in options:
        text += f", {options['projection']} projection"
    if options.get("affine_output"):
        text += ", learned output gain and mean value"
    return text


def _model_name(model_id: str) -> str:
    return model_id.rstrip("/").split("/")[-1]


def _fmt(value: float) -> str:
    return f"{value:.4f}"


def render_conversion_card(output_dir: str | Path, *, report: dict[str, Any], model_id: str | None = None,
                           save: bool = True) -> ModelCard:
    """The card of a converted folder, from its fidelity ``report`` (the content of ``fidelity.json``).

    ``model_id`` is the name in the loading snippet (default: the folder's path). With
    ``save``, the card is written to ``output_dir/README.md``.
    """
    output_dir = Path(output_dir)
    model_id = model_id or str(output_dir)
    mechanism, base = report["mechanism"], report["base_model"]
    training = report["training"]
    results = [
        EvalResult(task_type="feature-extraction", dataset_type="text", dataset_name="held-out text",
                   metric_type="cosine_similarity", metric_value=round(report["embedding_cosine"]["after"], 4),
                   metric_name="Cosine to the original model (mean-pooled embeddings)"),
        EvalResult(task_type="feature-extraction", dataset_type="text", dataset_name="held-out text",
                   metric_type="spearmanr", metric_value=round(report["pairwise_spearman"]["after"], 4),
                   metric_name="Spearman with the original model's pairwise cosine similarities"),
    ]
    card_data = ModelCardData(
        base_model=_hub_id(base), library_name="peft" if report["adapter_only"] else "transformers",
        license=report.get("license"), tags=[PLUGIN_TAG, MECHANISMS[mechanism].tag, "attention-transfer"],
        datasets=training["datasets"] or None, pipeline_tag="feature-extraction",
        model_name=_model_name(model_id), eval_results=results,
    )
    errors = report["attention_relative_error"]
    names = {"attention_relative_error": "mean relative error of the attention outputs",
             "hidden_state_cosine": "cosine of the final hidden states (token level)",
             "embedding_cosine": "cosine of the mean-pooled embeddings",
             "pairwise_spearman": "Spearman of the pairwise cosine similarities"}
    rows = [{"name": names["attention_relative_error"], "before": _fmt(errors["mean_before"]),
             "after": _fmt(errors["mean_after"])}]
    rows += [{"name": names[key], "before": _fmt(report[key]["before"]), "after": _fmt(report[key]["after"])}
             for key in ("hidden_state_cosine", "embedding_cosine", "pairwise_spearman")]
    heldout_source = report["heldout"]["source"]
    card = ModelCard.from_template(
        card_data, template_path=str(TEMPLATES / "converted.md"), model_name=_model_name(model_id),
        base_model_ref=_model_ref(base), adapter_only=report["adapter_only"],
        layers_description=_layers_description(report["converted_layers"], report["mechanism_options"]),
        loading_code=_loading_code(model_id, model_class="AutoModel", mechanism=mechanism,
                                   adapter_base=base if report["adapter_only"] else None),
        training=training, training_text=", ".join(map(str, training["text"])),
        wall_time=f"{report['wall_time_s'] / 60:.1f} min", heldout=report["heldout"],
        heldout_source=", ".join(heldout_source) if isinstance(heldout_source, list) else heldout_source,
        fidelity_rows=rows,
        layer_rows=[{"layer": layer, "before": _fmt(errors["before"][layer]), "after": _fmt(errors["after"][layer])}
                    for layer in errors["after"]],
        **_mechanism_fields(mechanism),
    )
    if save:
        card.save(output_dir / "README.md")
    return card


def render_glue_card(output_dir: str | Path, *, base_model: str, task_name: str, metrics: dict[str, float],
                     mechanism: str, dataset_name: str | None = None, split: str = "validation",
                     model_id: str | None = None, license: str | None = None) -> ModelCard:
    """Write ``output_dir/README.md`` for a model fine-tuned on GLUE ``task_name`` and return the card.

    ``metrics`` are the evaluation results on ``split`` (e.g. ``{"eval_accuracy": 0.91}``;
    an ``eval_`` prefix is dropped, and losses, runtimes and counters are left out of the
    ``model-index``). ``dataset_name`` is the Hub dataset trained on (default ``nyu-mll/glue``), or
    a description of local data (then the metadata lists no dataset); ``model_id`` names the model
    in the loading snippet (default: the folder's path).
    """
    if mechanism not in MECHANISMS:
        raise ValueError(f"Unknown mechanism {mechanism!r}: the valid ones are {list(MECHANISMS)}.")
    output_dir = Path(output_dir)
    model_id = model_id or str(output_dir)
    dataset = dataset_name or "nyu-mll/glue"
    dataset_id = _hub_id(dataset)
    scores = {name.removeprefix("eval_"): float(value) for name, value in metrics.items()
              if isinstance(value, (int, float)) and not any(part in name for part in NON_METRICS)}
    if not scores:
        raise ValueError(f"No evaluation metric in {metrics!r}.")
    results = [
        EvalResult(task_type="text-classification", task_name=f"GLUE {task_name.upper()}",
                   dataset_type=dataset_id or "glue", dataset_name=f"GLUE {task_name.upper()}",
                   dataset_config=task_name,
                   dataset_split=split, metric_type=name, metric_value=round(value, 4))
        for name, value in scores.items()
    ]
    card_data = ModelCardData(
        base_model=_hub_id(base_model), library_name="transformers",
        license=license or base_model_license(base_model), tags=[PLUGIN_TAG, MECHANISMS[mechanism].tag, "glue"],
        datasets=[dataset_id] if dataset_id else None, pipeline_tag="text-classification",
        model_name=_model_name(model_id), eval_results=results,
    )
    card = ModelCard.from_template(
        card_data, template_path=str(TEMPLATES / "glue.md"), model_name=_model_name(model_id),
        base_model_ref=_model_ref(base_model), task_title=task_name.upper(),
        dataset_description=f"GLUE {task_name.upper()} ({dataset})", split=split,
        metrics={name: _fmt(value) for name, value in scores.items()},
        loading_code=_loading_code(model_id, model_class="AutoModelForSequenceClassification", mechanism=mechanism),
        **_mechanism_fields(mechanism),
    )
    card.save(output_dir / "README.md")
    return card


# --------------------------------------------------------------------------- publishing


def upload_plan(folder: str | Path) -> list[str]:
    """The files ``push`` uploads (POSIX paths relative to ``folder``): all of them except
    hidden files and folders and a leftover ``checkpoints/`` of an unfinished conversion."""
    folder = Path(folder)
    paths = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        hidden = any(part.startswith(".") for part in relative.parts)
        if path.is_file() and relative.parts[0] != CHECKPOINT_DIR and not hidden:
            paths.append(relative.as_posix())
    return paths


def verify_folder(folder: str | Path) -> str:
    """Check that ``folder`` loads through the plugin with all its weights and the mechanism
    selected, and reproduces its recorded outputs. Returns what was checked; raises PushError."""
    folder = Path(folder)
    try:
        if (folder / REPORT_NAME).exists():
            difference = check_reference(folder)
            return ("loads through the plugin and reproduces the outputs recorded at conversion "
                    f"(max diff {difference:.2g})")
        first, second = (_sample_output(folder) for _ in range(2))
        if not torch.equal(first, second):
            raise ValueError("two loads give different outputs (some weights are initialised at random on load).")
        return f"loads through the plugin, identically twice (no {REPORT_NAME} with reference outputs)"
    except (ValueError, OSError) as error:
        raise PushError(f"{folder} is not ready to publish: {error}") from error


@torch.no_grad()
def _sample_output(folder: Path) -> torch.Tensor:
    model = load_converted(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(["A short sentence to check the model.", "Another one."], padding=True, return_tensors="pt")
    output = model(**batch)
    return output.logits if getattr(output, "logits", None) is not None else output.last_hidden_state


def publish_card(folder: str | Path, repo_id: str) -> str:
    """The README.md to upload: a converted folder's card re-rendered so its loading snippet
    names ``repo_id``; otherwise the folder's own README.md."""
    folder = Path(folder)
    if (folder / REPORT_NAME).exists():
        report = json.loads((folder / REPORT_NAME).read_text())
        return str(render_conversion_card(folder, report=report, model_id=repo_id, save=False))
    if not (folder / "README.md").exists():
        raise PushError(f"{folder} has no README.md model card.")
    return (folder / "README.md").read_text(encoding="utf-8")


def _offline() -> bool:
    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def push(folder: str | Path, repo_id: str, *, private: bool = False, revision: str | None = None,
         dry_run: bool = False, token: str | None = None, echo: Callable[[str], None] = print) -> str | None:
    """Check ``folder`` (:func:`verify_folder`) and upload it to the model repository ``repo_id``
    in one commit. Returns the commit URL, or None for ``dry_run`` (which prints the files
    and the card instead). Raises PushError, leaving the folder untouched."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise PushError(f"{folder} is not a model folder (no config.json).")
    if (folder / CHECKPOINT_DIR).exists():
        raise PushError(f"{folder} holds an unfinished conversion ({CHECKPOINT_DIR}/): finish it with --resume first.")
    card = publish_card(folder, repo_id).encode("utf-8")
    files_ = sorted({*upload_plan(folder), "README.md"})
    echo(f"Checked: {folder} {verify_folder(folder)}.")
    if dry_run:
        where = f"{repo_id}" + (f" (revision {revision})" if revision else "") + (" [private]" if private else "")
        echo(f"Dry run: would upload {len(files_)} files to {where}:")
        for name in files_:
            if name == "README.md":
                echo(f"  {name}  {len(card)} bytes (the model card below)")
            else:
                echo(f"  {name}  {(folder / name).stat().st_size} bytes")
        echo("--- README.md ---")
        echo(card.decode("utf-8"))
        return None
    token = token or get_token()
    problems = []
    if _offline():
        problems.append("HF_HUB_OFFLINE is set, so the Hub cannot be reached (unset it to publish)")
    if token is None:
        problems.append("no Hugging Face token was found (pass --token, set HF_TOKEN, or run `hf auth login`)")
    if problems:
        raise PushError("Cannot push: " + "; and ".join(problems) + ". Nothing was uploaded.")
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(folder / name))
                  for name in files_ if name != "README.md"]
    operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card))
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.create_commit(repo_id, operations, commit_message=f"Upload {folder.name} ({CONFIG_KEY})",
                                 revision=revision)
    except OfflineModeIsEnabled as error:
        raise PushError(f"Cannot push: the Hub is in offline mode ({error}). Nothing was uploaded.") from error
    except HfHubHTTPError as error:
        raise PushError(f"The Hub refused the upload to {repo_id}: {error}") from error
    except Exception as error:  # noqa: BLE001 - the HTTP client's connection errors are not part of its API
        raise PushError(f"Cannot reach the Hugging Face Hub ({type(error).__name__}: {error}). "
                        "Nothing was uploaded.") from error
    echo(f"Uploaded {len(operations)} files to {info.commit_url}")
    return info.commit_url
