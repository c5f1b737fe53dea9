"""The package's C++ CPU kernels (``ops/csrc/*.cpp``): built on first use, loaded with ctypes.

The kernels are C++17 with a C interface, one library per ``csrc/<name>.cpp``, sharing the
headers of ``csrc/`` (``sorted_sweep.h``); the only torch header they include is
``ATen/Parallel.h`` (their threads are torch's intra-op pool), so building one takes a few
seconds with the system's C++ compiler (``$CXX``, else ``c++``/``g++``). The shared library
is cached in ``$HF_SLICED_ATTN_CACHE`` (default ``~/.cache/hf_sliced_attn/kernels``), keyed by
the source and the headers beside it, the compiler, torch's version, the flags and the CPU, so
it is built once per machine and torch, under a file lock so that concurrent processes build it once. ctypes
releases the GIL during a call.

Where no kernel can be built (no compiler), :func:`load` returns None once, with a warning
that says why and how to fix it, and the ops run their portable torch implementation (the
same maths, slower on CPU). ``HF_SLICED_ATTN_NATIVE=0`` turns the kernels off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

__all__ = ["NativeKernelWarning", "entry_points", "load"]

import torch
from filelock import FileLock
from torch.utils import cpp_extension

_SOURCES = Path(__file__).with_name("csrc")


def _flags() -> list[str]:
    """Compiler flags: optimised for this CPU, against the installed torch's headers and
    libraries (the kernels use ``at::parallel_for``, torch's own OpenMP thread pool), as torch
    builds its C++ extensions. ``-fno-trapping-math`` (no code reads floating-point exception flags; results
    are unchanged) lets GCC vectorise float-to-int conversions, which ``fast_exp.h``'s exponential needs."""
    abi = int(torch.compiled_with_cxx11_abi())
    return [
        "-O3", "-march=native", "-fno-trapping-math", "-std=c++17", "-shared", "-fPIC", "-fopenmp",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *(f"-I{path}" for path in cpp_extension.include_paths()),
        *(f"-L{path}" for path in cpp_extension.library_paths()),
        *(f"-Wl,-rpath,{path}" for path in cpp_extension.library_paths()),
        "-lc10", "-ltorch_cpu",
    ]


class NativeKernelWarning(UserWarning):
    """A C++ kernel could not be built or loaded; the op runs its torch implementation."""


def _compiler() -> str | None:
    candidates = [os.environ["CXX"]] if os.environ.get("CXX") else ["c++", "g++", "clang++"]
    return next((path for path in map(shutil.which, candidates) if path), None)


def _machine() -> str:
    """What ``-march=native`` builds for: the architecture and, on Linux, the CPU's model and flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    described = [line for line in lines if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join([platform.machine(), *dict.fromkeys(described)])


def _cache_dir() -> Path:
    root = os.environ.get("HF_SLICED_ATTN_CACHE") or Path.home() / ".cache" / "hf_sliced_attn"
    return Path(root) / "kernels"


def _build(source: Path, compiler: str) -> Path:
    """Compile ``source`` into the cache (once per source and headers, compiler and machine) -> the library's path.

    A file lock beside the library makes concurrent processes (the ranks of a distributed run, say)
    build it once: the first compiles while the others wait, then find it built.
    """
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    flags = _flags()
    headers = [header.read_text() for header in sorted(source.parent.glob("*.h"))]
    key = hashlib.sha256(
        "\0".join([source.read_text(), *headers, compiler, version, torch.__version__, *flags, _machine()]).encode()
    ).hexdigest()[:16]
    target = _cache_dir() / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.with_name(target.name + ".lock")):
        if target.exists():  # another process built it while this one waited
            return target
        # Build beside the target and rename: a process that does not take the lock never loads a half-written file.
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            built = Path(scratch) / target.name
            result = subprocess.run([compiler, str(source), *flags, "-o", str(built)], capture_output=True, text=True)
            if result.returncode:
                raise RuntimeError(f"{compiler} failed on {source.name}:\n{result.stderr.strip()}")
            os.replace(built, target)
    return target


@functools.cache
def load(name: str) -> ctypes.CDLL | None:
    """The kernel library ``csrc/<name>.cpp``, built if needed; None (with one warning) where it
    cannot be built or loaded, or when ``HF_SLICED_ATTN_NATIVE=0``."""
    if os.environ.get("HF_SLICED_ATTN_NATIVE", "1") == "0":
        return None
    compiler = _compiler()
    problem = "no C++ compiler was found (install g++, or set CXX)"
    if compiler is not None:
        try:
            return ctypes.CDLL(str(_build(_SOURCES / f"{name}.cpp", compiler)))
        except OSError as error:
            problem = f"{error} (set HF_SLICED_ATTN_CACHE to a writable folder for the built kernels)"
        except (RuntimeError, subprocess.SubprocessError) as error:
            problem = str(error)
    warnings.warn(
        f"hf_sliced_attn: the C++ CPU kernel {name!r} is not available, so this op runs its torch "
        f"implementation on CPU (the same results, several times slower): {problem}. "
        "Set HF_SLICED_ATTN_NATIVE=0 to choose the torch implementation without this warning.",
        NativeKernelWarning, stacklevel=3,
    )
    return None


def entry_points(
    name: str, prefix: str, scalars: list[type], steps: dict[str, int],
    step_scalars: dict[str, list[type]] | None = None,
) -> dict[str, ctypes._CFuncPtr] | None:
    """The entry points ``<prefix>_<step>_<f32|f64>`` of the library ``csrc/<name>.cpp`` (:func:`load`) with
    their argument types, keyed by ``<step>_<f32|f64>``; None without the library. Every entry point takes
    the ``scalars`` (ctypes types: sizes, then the options), then those of ``step_scalars[step]`` (options of
    that step alone, if any), then the data pointers of ``steps[step]`` tensors, then one pointer to the array
    of their strides, and returns an int status."""
    library = load(name)
    if library is None:
        return None
    kernels = {}
    for step, tensors in steps.items():
        own = (step_scalars or {}).get(step, [])
        argtypes = [*scalars, *own, *[ctypes.c_void_p] * (tensors + 1)]
        for suffix in ("f32", "f64"):
            function = getattr(library, f"{prefix}_{step}_{suffix}")
            function.argtypes, function.restype = argtypes, ctypes.c_int
            kernels[f"{step}_{suffix}"] = function
    return kernels

