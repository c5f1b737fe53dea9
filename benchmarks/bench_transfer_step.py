"""CPU benchmark of one attention-transfer step (stage 1) of all-MiniLM-L6-v2: sliced ReLU layers folding their
projection through peft's LoRA adapters, against the same step with the LoRA-wrapped query and key layers called.

    python benchmarks/bench_transfer_step.py                       # 32x128, 10 rounds
    python benchmarks/bench_transfer_step.py --shapes 2x16 --steps 2 --threads 1 --output /tmp/ts_smoke

Attention transfer (``hf-sliced-attn convert``, the recipe's transfer) trains LoRA on the attention projections and
the new modules, the softmax original as the teacher. Each variant's student is the bundled checkpoint converted in
every layer with ``bench_training_step.py``'s options, wrapped by ``with_transfer_lora`` (r = 32, alpha = 64, the
transfer defaults); one step is ``attention_transfer_loss`` (the teacher's forward, the student's, teacher forced),
its backward and an AdamW step over the trainable parameters, on that script's ``make_batch`` (a quarter of the
batch padded on its second half). The variants have no local window: with one, q and k are formed anyway.

* ``<variant>_folded``: as the package runs it: each LoRA-wrapped layer is read as W_0 + s B A
  (``hf_sliced_attn.affine_layers.affine_of``) and the projection folds into it;
* ``<variant>_called``: the same model with ``affine_of`` seeing only plain ``nn.Linear`` layers, as before it read
  peft's: the wrapped query, key and value layers run, q and k are formed.

Variants: ``converted`` (4 slices, MLP projection a quarter of H*D wide, affine output) and ``linear`` (one linear
slice). The contenders take turns step by step (``benchmarks/_harness.py``); the report gives, per variant and
shape, the paired per-round ratio ``called`` step / ``folded`` step, its mean and 95% interval. Results: printed and
written to ``<output>/transfer_step.md`` and ``transfer_step.json`` (``<output>`` = ``benchmarks/results`` unless
``--output``), with the command, commit, date, versions, CPU and threads.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402
from transformers import AutoConfig, AutoModel  # noqa: E402

import hf_sliced_attn  # noqa: E402
from benchmarks._harness import Point, Run, interleaved, paired_interval, write_results  # noqa: E402
from benchmarks.bench_training_step import (  # noqa: E402
    CONVERTED,
    checkpoint,
    make_batch,
    parse_arguments,
    parse_shapes,
)
from hf_sliced_attn import integration  # noqa: E402
from hf_sliced_attn.affine_layers import affine_of  # noqa: E402
from hf_sliced_attn.conversion.transfer import attention_transfer_loss, with_transfer_lora  # noqa: E402

VARIANTS = {"converted": CONVERTED, "linear": {"projection": "linear", "num_slices": 1}}
"""Sliced ReLU options of each variant's student (every layer converted, no local window)."""
MODES = ("folded", "called")
LORA_R, LORA_ALPHA = 32, 64


@contextlib.contextmanager
def lora_layers_called() -> Iterator[None]:
    """Within the block, the package reads only plain ``nn.Linear`` layers: peft's are called."""
    integration.affine_of = lambda layer: affine_of(layer) if type(layer) is torch.nn.Linear else None
    try:
        yield
    finally:
        integration.affine_of = affine_of


def build_student(options: dict[str, object]) -> torch.nn.Module:
    """The checkpoint converted with ``options`` in every layer, LoRA-wrapped as a transfer wraps it, in train mode."""
    folder = checkpoint()
    config = hf_sliced_attn.prepare_config(AutoConfig.from_pretrained(folder), "sliced_relu", **options)
    student = AutoModel.from_pretrained(folder, config=config)
    return with_transfer_lora(student, LORA_R, LORA_ALPHA, seed=0).train()


def transfer_step(teacher: torch.nn.Module, student: torch.nn.Module, batch: dict[str, torch.Tensor],
                  mode: str) -> Callable[[], None]:
    """One stage-1 step: the transfer loss over every layer, backward, AdamW, zero_grad; ``mode`` "called" under
    :func:`lora_layers_called`."""
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=1e-4)
    layers = list(range(student.config.num_hidden_layers))

    def step() -> None:
        with lora_layers_called() if mode == "called" else contextlib.nullcontext():
            attention_transfer_loss(teacher, student, batch, layers).backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def measure_shape(batch_size: int, length: int, steps: int) -> dict[str, Point]:
    """Every variant's student in both modes, timed side by side: a warm-up step each, then ``steps`` rounds."""
    teacher = AutoModel.from_pretrained(checkpoint(), attn_implementation="sdpa").eval().requires_grad_(False)
    batch = make_batch(batch_size, length, teacher.config.vocab_size, teacher.config.pad_token_id)
    del batch["labels"]
    runs = {f"{variant}_{mode}": transfer_step(teacher, build_student(options), batch, mode)
            for variant, options in VARIANTS.items() for mode in MODES}
    return interleaved(runs, steps, label=f"{batch_size}x{length}")


def report(run: Run, steps: int, times: dict[str, dict[str, Point]]) -> tuple[str, list[dict[str, object]]]:
    """The markdown report and the JSON records: each contender's median step, and per variant the paired ratio."""
    lines = [f"# Attention-transfer step (CPU): folding through LoRA against calling the wrapped layers, {steps} "
             "rounds", "", run.header(), "",
             "| B×T | variant | folded step (median) | called step (median) | called / folded, paired per round |",
             "|---|---|---:|---:|---:|"]
    records = []
    for shape, points in times.items():
        for variant in VARIANTS:
            folded, called = points[f"{variant}_folded"], points[f"{variant}_called"]
            interval = paired_interval(c / f for c, f in zip(called.runs, folded.runs, strict=True))
            lines.append(f"| {shape} | {variant} | {folded.seconds * 1e3:.0f} ms | {called.seconds * 1e3:.0f} ms | "
                         f"{interval.describe('.3f')} |")
            records.append({"shape": shape, "variant": variant, "folded_s": folded.runs, "called_s": called.runs,
                            "called_over_folded": interval.record()})
    return "\n".join(lines) + "\n", records


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(__doc__.split("\n\n")[0], argv, ("steps", 10, "timed rounds per shape"), shapes="32x128")
    run = Run(Path(__file__).name, argv)
    times = {}
    for batch, length in parse_shapes(args.shapes):
        times[f"{batch}x{length}"] = measure_shape(batch, length, args.steps)
    run.finish()
    markdown, records = report(run, args.steps, times)
    print("\n" + markdown)
    write_results(args.output, "transfer_step", markdown, {"environment": {**run.record(), "steps": args.steps},
                                                            "results": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
