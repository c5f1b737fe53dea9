"""The fixture that runs a local window op's tests on both of its CPU implementations."""

from __future__ import annotations

import pytest

from hf_sliced_attn.ops import local_window_cpu
from tests.helpers.native import requires_compiler


@pytest.fixture(params=[pytest.param("kernel", marks=requires_compiler), "torch"])
def window_implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``local_window_attention`` and ``rela_local_window_attention`` run the fused C++ kernel of
    :mod:`hf_sliced_attn.ops.local_window_cpu` for every window ("kernel"; it must build where a compiler is
    found), or, with it turned off, the composed ops ("torch": the banded softmax and elementwise combination)."""
    if request.param == "kernel":
        assert local_window_cpu.available(), "the C++ local window kernel did not build (see the warning)"
        monkeypatch.setattr(local_window_cpu, "MAX_WINDOW", 10**9)
        monkeypatch.setattr(local_window_cpu, "MAX_WINDOW_NORMED", 10**9)
    else:
        monkeypatch.setattr(local_window_cpu, "available", lambda: False)
        monkeypatch.setattr(local_window_cpu, "_forward", None)  # any use of the kernel would fail
        monkeypatch.setattr(local_window_cpu, "_rela_forward", None)
    return request.param
