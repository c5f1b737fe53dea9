"""`hf-sliced-attn --help` answers without importing torch, transformers, peft or datasets (issue #23: it took 10 s).

The console script is whatever pyproject.toml names; each check runs it in a fresh interpreter and lists the
heavy modules that were imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with tomllib (Python >= 3.11)")

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "peft", "datasets", "accelerate", "hf_sliced_attn")
ENTRY_POINT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["hf-sliced-attn"]

RUN = """
import importlib, json, sys
module, function = sys.argv[1].split(":")
watched = json.loads(sys.argv[2])
sys.argv = ["hf-sliced-attn", *sys.argv[3:]]
try:
    status = getattr(importlib.import_module(module), function)()
except SystemExit as exit_:
    status = exit_.code
heavy = [name for name in watched if name in sys.modules]
print(json.dumps({"status": status, "heavy": heavy}), file=sys.stderr)
"""


def _run(entry_point: str, *args: str, heavy: tuple[str, ...] = HEAVY) -> tuple[int, list[str], str]:
    """(exit status, the ``heavy`` modules it imported, its output) of the console script with ``args``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", RUN, entry_point, json.dumps(heavy), *args], env=env,
                          capture_output=True, text=True, timeout=600)
    result = json.loads(done.stderr.strip().splitlines()[-1])
    return result["status"], result["heavy"], done.stdout + done.stderr


def test_help_lists_the_commands_without_heavy_imports():
    status, heavy, output = _run(ENTRY_POINT, "--help")
    assert status == 0, output
    assert all(command in output for command in ("convert", "push", "analyze")), output
    assert heavy == [], f"`hf-sliced-attn --help` imported {heavy}"


@pytest.mark.parametrize("args", [(), ("conver",)])
def test_usage_errors_need_no_heavy_import_either(args):
    status, heavy, output = _run(ENTRY_POINT, *args)
    assert status == 2 and "usage: hf-sliced-attn" in output, output
    assert heavy == [], heavy


def test_a_command_is_handed_to_the_package():
    status, heavy, output = _run(ENTRY_POINT, "analyze", "--help")
    assert status == 0 and "--max-length" in output, output
    assert "hf_sliced_attn" in heavy


def test_the_package_command_line_builds_only_the_command_asked_for():
    """`python -m hf_sliced_attn.cli --help` imports the package (it registers with transformers), not the
    conversion's modules (peft, datasets)."""
    status, heavy, output = _run("hf_sliced_attn.cli:main", "--help", heavy=("peft", "datasets", "hf_sliced_attn.convert"))
    assert status == 0 and "convert" in output, output
    assert heavy == [], heavy
