"""Where a sliced ReLU layer's time goes in a fine-tuning step: its projection, the op, its output module and its
local window, beside SDPA's layer.

    python benchmarks/bench_attention_layer.py                        # 32x128 and 8x512, 15 repeats
    python benchmarks/bench_attention_layer.py --shapes 2x16 --repeats 2 --threads 1 --output /tmp/al_smoke

The models are ``bench_training_step.py``'s: all-MiniLM-L6-v2 (12 heads, head dim 32, hidden 384, 6
layers) for sequence classification, built by its ``build_model`` for the contenders ``sliced_relu``
(one linear slice per head), ``sliced_relu_converted`` (4 slices, MLP projection, affine output) and
``sliced_relu_window4_linear1`` (one linear slice, affine output, a local softmax window of 4 with the
shared normaliser: the cheapest layer measured for converting every layer, issue #24), fed its
``make_batch`` (a quarter of the batch padded on its second half). One forward in train() mode
records layer 0's input x (B, T, 384) and padding mask, and its value (B, H, T, D); on those inputs
each piece of the layer runs forward, then backward from a fixed random gradient:

* ``projection``: the scalars s, t from the layer input, the projection folded into the query
  and key layers (``sliced_projection.project_input(x, query, key, mask)``; an MLP projection runs on
  the real tokens only; the layer itself computes a linear projection's scalars beside v, in the value
  layer's product, which ``layer`` times); ``projection_formed``: the query and key layers, then
  ``sliced_projection`` of q and k, as when the fold does not apply;
* ``op``: ``sliced_relu(s, t, value, mask)`` on s, t as leaves;
* ``output``: ``value_mean`` and ``module.sliced_output`` (layers with the affine output);
* with a local window (where the op is ``sliced_relu(..., return_denominator=True)``, its normaliser being the
  shared normaliser's): ``window``, the softmax within the window with its log-normaliser
  (``windowed_softmax(q, k, v, mask, return_lse=True)``) on the layer's q, k as leaves; ``window_combined``, the
  same combined with a fixed sliced term and denominator (``local_window_attention``): the difference is the
  combination's cost;
* ``layer``: the self-attention module's forward as the model runs it (the value layer, the projection,
  the op and the output; a layer with a window from one product of its input for q, k, v and a linear
  projection's scalars); ``layer_formed``: the same forming q and k with the query and key layers (within
  ``observe_attention``);
* ``sdpa_fused_layer``: the same layer of the ``sdpa_fused`` model (softmax, SDPA's fused kernel, attention
  dropout 0), on its own layer-0 input, timed in turn with the contender's pieces; the report gives each
  ``layer``'s speed-up over it.

Each piece's time is the median of ``--repeats`` runs (``time.perf_counter``) after one warm-up, the
pieces of a contender and shape taking turns run by run (``benchmarks/_harness.py``); the
"per step" column multiplies it by the number of layers (every layer has this shape). Results:
printed and written to ``<output>/attention_layer.md`` and ``attention_layer.json`` (``<output>`` =
``benchmarks/results`` unless ``--output``), with the command, commit, date, versions, CPU and threads.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from benchmarks._harness import Run, fmt_ratio, interleaved, write_results  # noqa: E402
from benchmarks.bench_training_step import build_model, make_batch, parse_arguments, parse_shapes  # noqa: E402
from hf_sliced_attn.attention import observe_attention  # noqa: E402
from hf_sliced_attn.mechanisms.local_window import find_window_module  # noqa: E402
from hf_sliced_attn.mechanisms.sliced_relu import WINDOW_PREFIX  # noqa: E402
from hf_sliced_attn.ops import local_window_attention, sliced_relu, value_mean, windowed_softmax  # noqa: E402
from hf_sliced_attn.conversion.attention_taps import attention_modules  # noqa: E402

CONTENDERS = ("sliced_relu", "sliced_relu_converted", "sliced_relu_window4_linear1")
BASELINE = "sdpa_fused"
"""The softmax layer every contender's ``layer`` is compared with (``sdpa_fused_layer``)."""


def layer_inputs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict:
    """Layer 0's attention module, its input x (B, T, C), the padding mask it gets (B, T) bool or None,
    and its value (B, H, T, D), from one forward."""
    module = attention_modules(model)[0]
    seen: dict = {"module": module}
    handle = module.register_forward_pre_hook(
        lambda _, args, kwargs: seen.update(hidden_states=args[0], attention_mask=kwargs["attention_mask"]),
        with_kwargs=True)
    try:
        with torch.no_grad(), observe_attention(lambda **inputs: seen.setdefault("value", inputs["value"])):
            model(**batch)
    finally:
        handle.remove()
    return seen


def _leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Fresh leaves with the same values and strides (v stays a view of a (B, T, H, D) buffer)."""
    return [x.detach().clone(memory_format=torch.preserve_format).requires_grad_() for x in tensors]


def layer_run(inputs: dict, gradient: torch.Tensor) -> Callable[[], None]:
    """The self-attention module's forward on its recorded input, then backward from ``gradient``."""
    module, mask, hidden_states = inputs["module"], inputs["attention_mask"], inputs["hidden_states"]

    def layer() -> None:
        out, _ = module(*_leaves(hidden_states), attention_mask=mask)
        out.backward(gradient)

    return layer


def pieces(inputs: dict) -> dict[str, Callable[[], None]]:
    """Each piece of the layer as a function that runs its forward and backward once."""
    module, mask = inputs["module"], inputs["attention_mask"]
    hidden_states, value = inputs["hidden_states"], inputs["value"]
    projection, window = module.sliced_projection, find_window_module(module, WINDOW_PREFIX)
    generator = torch.Generator().manual_seed(0)
    s, t = (x.detach() for x in projection.project_input(hidden_states, module.query, module.key, mask))
    grads = {name: torch.randn(shape, generator=generator) for name, shape in
             (("s", s.shape), ("t", t.shape), ("out", value.shape), ("layer", hidden_states.shape),
              ("denominator", s.shape), ("lse", value.shape[:3]))}

    def heads(x: torch.Tensor) -> torch.Tensor:
        return x.view(*value.transpose(1, 2).shape).transpose(1, 2)

    def project() -> None:
        scalars = projection.project_input(*_leaves(hidden_states), module.query, module.key, mask)
        torch.autograd.backward(scalars, (grads["s"], grads["t"]))

    def project_formed() -> None:
        (x,) = _leaves(hidden_states)
        scalars = projection(heads(module.query(x)), heads(module.key(x)), mask)
        torch.autograd.backward(scalars, (grads["s"], grads["t"]))

    def op() -> None:
        q_scalars, k_scalars, v = _leaves(s, t, value)
        if window is None:
            sliced_relu(q_scalars, k_scalars, v, mask).backward(grads["out"])
        else:
            outputs = sliced_relu(q_scalars, k_scalars, v, mask, return_denominator=True)
            torch.autograd.backward(outputs, (grads["out"], grads["denominator"]))

    def output() -> None:
        attention, v = _leaves(value, value)  # an op output has value's shape and layout
        module.sliced_output(attention, value_mean(v, mask)).backward(grads["out"])

    layer = layer_run(inputs, grads["layer"])

    def layer_formed() -> None:
        with observe_attention(lambda **_: None):
            layer()

    runs = {"projection": project, "projection_formed": project_formed, "op": op}
    if getattr(module, "sliced_output", None) is not None:
        runs["output"] = output
    if window is not None:
        runs |= window_pieces(inputs, window, grads)
    return {**runs, "layer": layer, "layer_formed": layer_formed}


def window_pieces(inputs: dict, window: torch.nn.Module,
                  grads: dict[str, torch.Tensor]) -> dict[str, Callable[[], None]]:
    """``window`` and ``window_combined`` (module docstring) on the layer's q, k and value as leaves."""
    module, mask, value = inputs["module"], inputs["attention_mask"], inputs["value"]
    tokens = value.transpose(1, 2).shape  # (B, T, H, D): q, k and the op's output are views of such buffers
    with torch.no_grad():
        query, key = (linear(inputs["hidden_states"]).view(tokens).transpose(1, 2)
                      for linear in (module.query, module.key))
    sliced = torch.randn(tokens, generator=torch.Generator().manual_seed(1)).transpose(1, 2)
    denominator = torch.rand(grads["denominator"].shape, generator=torch.Generator().manual_seed(2)) + 1.0
    mix = window().detach()

    def softmax_window() -> None:
        q, k, v = _leaves(query, key, value)
        outputs = windowed_softmax(q, k, v, mask, scaling=module.scaling, sliding_window=window.window + 1,
                                   return_lse=True)
        torch.autograd.backward(outputs, (grads["out"], grads["lse"]))

    def combined() -> None:
        q, k, v, term, den, weight = _leaves(query, key, value, sliced, denominator, mix)
        local_window_attention(q, k, v, term, weight, mask, window=window.window, combine=window.combine,
                               denominator=den, scaling=module.scaling).backward(grads["out"])

    return {"window": softmax_window, "window_combined": combined}


def measure(shapes: list[tuple[int, int]], repeats: int) -> list[dict]:
    """Every piece's median time per layer and per step, for each contender and shape, with SDPA's layer."""
    records = []
    baseline = build_model(BASELINE)
    for name in CONTENDERS:
        model = build_model(name)
        layers = model.config.num_hidden_layers
        for batch_size, length in shapes:
            batch = make_batch(batch_size, length, model.config.vocab_size, model.config.pad_token_id)
            inputs = layer_inputs(model, batch)
            runs = pieces(inputs)
            runs[f"{BASELINE}_layer"] = layer_run(layer_inputs(baseline, batch),
                                                  torch.randn(inputs["hidden_states"].shape))
            for piece, point in interleaved(runs, repeats).items():
                records.append({"contender": name, "shape": f"{batch_size}x{length}", "piece": piece,
                                "layer_s": point.seconds, "layers": layers, "step_s": point.seconds * layers})
                print(f"  {name:22s} {batch_size}x{length} {piece:17s} {point.seconds * 1e3:8.2f} ms per layer",
                      flush=True)
    return records


def report(run: Run, repeats: int, records: list[dict]) -> str:
    """The markdown results file."""
    lines = [
        "# Where a sliced ReLU layer's time goes (CPU): all-MiniLM-L6-v2, forward+backward",
        "",
        f"{run.header()} Layer 0's input from a train() forward of the training-step benchmark's batch (a quarter "
        f"of it padded on its second half); median of {repeats} runs after 1 warm-up, the pieces taking turns; per "
        f"step = per layer × the model's {records[0]['layers']} layers.",
        "",
        f"The last column is the layer's speed-up over the {BASELINE} layer timed in the same turns.",
        "",
        "| contender | B×T | piece | per layer | per step | layer vs sdpa_fused |",
        "|---|---|---|---:|---:|---:|",
    ]
    baseline = {(r["contender"], r["shape"]): r["layer_s"] for r in records if r["piece"] == f"{BASELINE}_layer"}
    for r in records:
        speedup = ""
        if r["piece"] in ("layer", "layer_formed"):
            speedup = fmt_ratio(baseline[r["contender"], r["shape"]] / r["layer_s"])
        lines.append(f"| {r['contender']} | {r['shape']} | {r['piece']} | {r['layer_s'] * 1e3:.1f} ms "
                     f"| {r['step_s'] * 1e3:.0f} ms | {speedup} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(__doc__.split("\n\n")[0], argv, ("repeats", 15, "timed runs per piece"))
    run = Run(Path(__file__).name, argv)
    records = measure(parse_shapes(args.shapes), args.repeats)
    run.finish()
    markdown = report(run, args.repeats, records)
    print("\n" + markdown)
    write_results(args.output, "attention_layer", markdown,
                  {"environment": {**run.record(), "repeats": args.repeats}, "results": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
