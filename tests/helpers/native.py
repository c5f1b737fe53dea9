"""The mark of the tests that need the C++ CPU kernel built: skipped, with the reason, where no C++ compiler is found.

A compiler that is found but fails to build the kernel still fails those tests: only its absence skips them.
"""

from __future__ import annotations

import pytest

from hf_sliced_attn.ops import _native

NO_COMPILER = "no C++ compiler found ($CXX, else c++, g++ or clang++); the CPU kernel cannot be built"

requires_compiler = pytest.mark.skipif(_native._compiler() is None, reason=NO_COMPILER)
"""Marks a test (or a parameter, through ``pytest.param(..., marks=requires_compiler)``) that needs the
CPU kernel: skipped where :mod:`hf_sliced_attn.ops._native` finds no compiler to build it with."""

requires_compiler_for_inductor = pytest.mark.skipif(
    _native._compiler() is None,
    reason="no C++ compiler found ($CXX, else c++, g++ or clang++); torch.compile's inductor backend needs one on CPU")
"""Marks a case compiled with inductor on CPU, which generates and builds C++ like the kernel."""
