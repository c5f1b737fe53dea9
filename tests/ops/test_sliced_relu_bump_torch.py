"""test_sliced_relu_bump.py's tests on the torch implementation of sliced_relu_bump (what other
devices run, and CPUs without a C++ compiler): where the C++ kernel builds, the op picks it on
CPU, so without this module the torch implementation would go untested here. The tests are
collected from that module as they are; the autouse fixture below turns the kernel off for them."""

from __future__ import annotations

import pytest

from hf_sliced_attn.ops import sliced_relu_cpu
from tests.ops.test_sliced_relu_bump import *  # the tests themselves, collected again here


@pytest.fixture(autouse=True)
def torch_implementation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sliced_relu_cpu, "bump_available", lambda: False)
    monkeypatch.setattr(sliced_relu_cpu, "_bump_forward", None)  # any use of the kernel would fail
