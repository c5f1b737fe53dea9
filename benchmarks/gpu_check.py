#!/usr/bin/env python
"""Time and peak memory of the attention ops on one device, side by side: sliced ReLU (both kernels), the
local softmax window with it, ReLA and SDPA.

The GPU half of ``benchmarks/gpu_check.sh`` (which runs the ``cuda`` op tests first). For each
sequence length T (B=1, H=12, D=64, fp32 unless ``--dtype``; 4 slices; the bump kernel's bandwidth 0.7;
the local window w = 64 combined by the shared normaliser), every contender runs forward and
forward+backward; the median of ``--repeats`` timed runs after one warm-up (``benchmarks/_harness.py``),
with the device synchronised around each, and the peak memory above the inputs (on CUDA
the allocator's ``torch.cuda.max_memory_allocated``, on CPU the resident set's growth). SDPA is
skipped at lengths where its O(T²) time would dominate the run (``--sdpa_max``). Ratios are to SDPA at
the same T, measured in the same run.

    python benchmarks/gpu_check.py                         # CUDA, T = 1k .. 64k
    python benchmarks/gpu_check.py --device cpu --lengths 256,1024 --output /tmp/gpu-smoke   # smoke run

Writes ``<output>/gpu_check.json`` and ``gpu_check.md`` (default ``benchmarks/results/gpu``), each with
the command, commit, date, versions and the device.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks._harness import RESULTS, Run, int_list, measure_point, write_results  # noqa: E402
from hf_sliced_attn.ops import (  # noqa: E402
    local_window_attention,
    rela,
    sliced_relu,
    sliced_relu_bump,
    windowed_softmax,
)

HEADS, DIM, SLICES, WINDOW = 12, 64, 4, 64


def contenders(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: torch.Tensor, t: torch.Tensor
               ) -> dict[str, tuple[Callable[[], torch.Tensor], list[torch.Tensor]]]:
    """name -> (forward thunk, its differentiable inputs)."""
    bandwidth = torch.full((HEADS, SLICES), 0.7, device=v.device, dtype=v.dtype)
    gamma = torch.ones(HEADS, device=v.device, dtype=v.dtype)

    def sliced_relu_window() -> torch.Tensor:
        sliced, denominator = sliced_relu(s, t, v, return_denominator=True)
        return local_window_attention(q, k, v, sliced, gamma, window=WINDOW, combine="shared", denominator=denominator)

    return {
        "sdpa": (lambda: F.scaled_dot_product_attention(q, k, v), [q, k, v]),
        "sliced_relu": (lambda: sliced_relu(s, t, v), [s, t, v]),
        "sliced_relu_bump": (lambda: sliced_relu_bump(s, t, v, bandwidth), [s, t, v]),
        f"windowed_softmax_w{WINDOW}": (lambda: windowed_softmax(q, k, v, sliding_window=WINDOW + 1), [q, k, v]),
        f"sliced_relu_window{WINDOW}": (sliced_relu_window, [q, k, v, s, t]),
        "rela": (lambda: rela(q, k, v), [q, k, v]),
    }


def forward_pass(forward: Callable[[], torch.Tensor], backward: bool) -> None:
    """The forward, and with ``backward`` the backward from a gradient of ones."""
    out = forward()
    if backward:
        out.backward(torch.ones_like(out))


def reset_grads(inputs: list[torch.Tensor]) -> None:
    """Drop the inputs' gradients before a run (outside its time and memory)."""
    for x in inputs:
        x.grad = None


def measure_all(args: argparse.Namespace) -> list[dict]:
    """A row per T, contender and pass: its median seconds and peak memory in MiB."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    rows = []
    for length in args.lengths:
        gen = torch.Generator(device=device).manual_seed(length)
        q, k, v = (torch.randn(1, HEADS, length, DIM, device=device, dtype=dtype, generator=gen).requires_grad_()
                   for _ in range(3))
        s, t = (torch.randn(1, HEADS, SLICES, length, device=device, dtype=dtype, generator=gen).requires_grad_()
                for _ in range(2))
        for name, (forward, inputs) in contenders(q, k, v, s, t).items():
            if name == "sdpa" and length > args.sdpa_max:
                continue
            for backward in (False, True):
                point = measure_point(functools.partial(forward_pass, forward, backward), args.repeats,
                                      prepare=functools.partial(reset_grads, inputs), device=device)
                rows.append({"T": length, "op": name, "pass": "fwd+bwd" if backward else "fwd",
                             "seconds": point.seconds, "peak_mib": point.peak_bytes / 2**20})
                print(rows[-1], flush=True)
    return rows


def markdown(rows: list[dict], args: argparse.Namespace, run: Run, device_name: str) -> str:
    """The markdown results file: header, settings and one row a measurement, with its ratio to SDPA."""
    sdpa = {(r["T"], r["pass"]): r["seconds"] for r in rows if r["op"] == "sdpa"}
    lines = [f"# Attention ops on {device_name}", "", run.header(), "",
             f"B=1, H={HEADS}, D={DIM}, {SLICES} slices for sliced ReLU, {args.dtype}; median of {args.repeats} runs "
             "after a warm-up; ratio = SDPA's time / the op's, measured in the same run.", "",
             "| T | op | pass | ms | × SDPA speed | peak MiB |", "|---:|---|---|---:|---:|---:|"]
    for r in rows:
        reference = sdpa.get((r["T"], r["pass"]))
        ratio = f"{reference / r['seconds']:.2f}" if reference else "n/a"
        lines.append(f"| {r['T']} | {r['op']} | {r['pass']} | {r['seconds'] * 1e3:.2f} | {ratio} "
                     f"| {r['peak_mib']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--lengths", default="1024,4096,16384,65536", type=int_list)
    parser.add_argument("--sdpa_max", type=int, default=65536, help="longest T at which SDPA runs")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS / "gpu")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("No CUDA GPU here: pass --device cpu for a smoke run, or run this on a GPU machine.")
    run = Run(Path(__file__).name, argv)
    rows = measure_all(args)
    run.finish()
    device_name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "CPU"
    report = markdown(rows, args, run, device_name)
    print("\n" + report)
    write_results(args.output, "gpu_check", report,
                  {"environment": run.record(), "device": device_name, "dtype": args.dtype, "rows": rows})


if __name__ == "__main__":
    main()
