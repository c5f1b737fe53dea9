"""The C++ kernel is built once when several processes (the ranks of a distributed run) ask for it at once."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hf_sliced_attn.ops import _native

NATIVE = Path(_native.__file__)

# Each process loads _native.py by itself (no package import, so both are ready quickly), says it is ready,
# waits for the other, then asks for the kernel: both reach the build together.
RANK = """
import importlib.util, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("native_under_test", sys.argv[1])
native = importlib.util.module_from_spec(spec)
spec.loader.exec_module(native)
here, other = Path(sys.argv[2]), Path(sys.argv[3])
here.touch()
deadline = time.monotonic() + 300
while not other.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(0 if native.load("sliced_relu_cpu") is not None else 1)
"""


def _logging_compiler(folder: Path, compiler: str, log: Path) -> Path:
    """A $CXX that appends a line to ``log`` for each compilation (not for ``--version``), then runs ``compiler``."""
    wrapper = folder / "logging-c++"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'for arg in "$@"; do case "$arg" in *.cpp) echo "compile $$" >> "{log}";; esac; done\n'
        f'exec "{compiler}" "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


def test_concurrent_processes_compile_the_kernel_once(tmp_path):
    compiler = _native._compiler()
    if compiler is None:
        pytest.skip("no C++ compiler found ($CXX, else c++, g++ or clang++): the kernel cannot be built at all")
    log = tmp_path / "compilations.log"
    env = {**os.environ, "CXX": str(_logging_compiler(tmp_path, compiler, log)),
           "HF_SLICED_ATTN_CACHE": str(tmp_path / "cache"), "HF_SLICED_ATTN_NATIVE": "1"}
    ready = [tmp_path / "ready-0", tmp_path / "ready-1"]
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(NATIVE), str(ready[i]), str(ready[1 - i])],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outputs = [rank.communicate(timeout=600)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    compilations = log.read_text().splitlines()
    assert len(compilations) == 1, f"the kernel was compiled {len(compilations)} times: {compilations}"
    built = list((tmp_path / "cache" / "kernels").glob("sliced_relu_cpu-*.so"))
    assert len(built) == 1, built
