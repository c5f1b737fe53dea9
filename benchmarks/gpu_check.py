#!/usr/bin/env python
"""Time and peak memory of the attention ops on one device, side by side: sliced ReLU, ReLA and SDPA.

The GPU half of ``benchmarks/gpu_check.sh`` (which runs the ``cuda`` op tests first). For each
sequence length T (B=1, H=12, D=64, fp32 unless ``--dtype``), every contender runs forward and
forward+backward; the median of ``--repeats`` timed runs after one warm-up, with the device
synchronised around each, and the peak memory allocated above the inputs
(``torch.cuda.max_memory_allocated``; on CPU no memory figure). SDPA is skipped at lengths
where its O(T²) time would dominate the run (``--sdpa_max``). Ratios are to SDPA at the same T,
measured in the same run.

    python benchmarks/gpu_check.py                         # CUDA, T = 1k .. 64k
    python benchmarks/gpu_check.py --device cpu --lengths 256,1024 --output /tmp/gpu-smoke   # smoke run

Writes ``<output>/gpu_check.json`` and ``gpu_check.md`` (default ``benchmarks/results/gpu``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from hf_sliced_attn.ops import rela, sliced_relu

REPO = Path(__file__).resolve().parents[1]
HEADS, DIM, SLICES = 12, 64, 4


def contenders(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: torch.Tensor, t: torch.Tensor
               ) -> dict[str, tuple[Callable[[], torch.Tensor], list[torch.Tensor]]]:
    """name -> (forward thunk, its differentiable inputs)."""
    return {
        "sdpa": (lambda: F.scaled_dot_product_attention(q, k, v), [q, k, v]),
        "sliced_relu": (lambda: sliced_relu(s, t, v), [s, t, v]),
        "rela": (lambda: rela(q, k, v), [q, k, v]),
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(forward: Callable[[], torch.Tensor], inputs: list[torch.Tensor], backward: bool, repeats: int,
            device: torch.device) -> dict[str, float | None]:
    """Median seconds and peak extra memory (MiB, CUDA only) of forward (and backward) runs."""
    def once() -> float:
        for x in inputs:
            x.grad = None
        synchronize(device)
        start = time.perf_counter()
        out = forward()
        if backward:
            out.backward(torch.ones_like(out))
        synchronize(device)
        return time.perf_counter() - start

    once()  # warm-up
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times = [once() for _ in range(repeats)]
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if device.type == "cuda" else None
    return {"seconds": statistics.median(times), "peak_mib": peak}


def run(args: argparse.Namespace) -> list[dict]:
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
                result = measure(forward, inputs, backward, args.repeats, device)
                rows.append({"T": length, "op": name, "pass": "fwd+bwd" if backward else "fwd", **result})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(rows: list[dict], args: argparse.Namespace, device_name: str) -> str:
    sdpa = {(r["T"], r["pass"]): r["seconds"] for r in rows if r["op"] == "sdpa"}
    lines = [f"# Attention ops on {device_name}", "",
             f"B=1, H={HEADS}, D={DIM}, {SLICES} slices for sliced ReLU, {args.dtype}; median of {args.repeats} runs "
             "after a warm-up; ratio = SDPA's time / the op's, measured in the same run.", "",
             "| T | op | pass | ms | × SDPA speed | peak MiB |", "|---:|---|---|---:|---:|---:|"]
    for r in rows:
        reference = sdpa.get((r["T"], r["pass"]))
        ratio = f"{reference / r['seconds']:.2f}" if reference else "n/a"
        peak = f"{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "n/a"
        lines.append(f"| {r['T']} | {r['op']} | {r['pass']} | {r['seconds'] * 1e3:.2f} | {ratio} | {peak} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--lengths", default="1024,4096,16384,65536",
                        type=lambda text: [int(x) for x in text.split(",")])
    parser.add_argument("--sdpa_max", type=int, default=65536, help="longest T at which SDPA runs")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "gpu")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("No CUDA GPU here: pass --device cpu for a smoke run, or run this on a GPU machine.")
    rows = run(args)
    device_name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "CPU"
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "gpu_check.json").write_text(json.dumps({"device": device_name, "dtype": args.dtype,
                                                            "rows": rows}, indent=1) + "\n")
    report = markdown(rows, args, device_name)
    (args.output / "gpu_check.md").write_text(report)
    print("\n" + report)


if __name__ == "__main__":
    main()
