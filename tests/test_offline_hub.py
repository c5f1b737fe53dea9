"""Without the Hub (HF_HUB_OFFLINE=1, or an endpoint that does not answer), `hf-sliced-attn convert` and the GLUE
recipe, asked for Hub files that are not cached, fail at once with one line that says so (issue #23).

Each case runs in a fresh process with an empty Hugging Face cache. The clock runs around the failing call, after
the imports (which take seconds of their own on a busy machine): it is what used to spend half a minute retrying.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEXT = REPO / "hf_sliced_attn" / "data" / "text" / "convert_train.txt"
LIMIT_S = 5.0

CONVERT = """
import sys, time
import hf_sliced_attn.convert  # what a conversion imports, before the clock starts
from hf_sliced_attn.cli import main
start = time.perf_counter()
status = main(sys.argv[1:])
print(f"ELAPSED {time.perf_counter() - start:.3f}", file=sys.stderr)
sys.exit(status)
"""

RECIPE = f"""
import sys, time
sys.path.insert(0, {str(REPO / "recipes")!r})
import glue
start = time.perf_counter()
try:
    glue.main(sys.argv[1:])
    status = 0
except SystemExit as exit_:
    status = exit_.code
print(f"ELAPSED {{time.perf_counter() - start:.3f}}", file=sys.stderr)
sys.exit(status)
"""


def _closed_port() -> int:
    """A local port nothing listens on: connecting to it is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _environment(tmp_path: Path, hub: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if name not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_ENDPOINT")}
    env.update(HF_HOME=str(tmp_path / "hf-home"), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
    if hub == "offline":
        env["HF_HUB_OFFLINE"] = "1"
    else:
        env["HF_ENDPOINT"] = f"http://127.0.0.1:{_closed_port()}"
    return env


def _run(script: str, args: list[str], tmp_path: Path, hub: str) -> tuple[int, list[str], float]:
    """(exit status, stderr lines without the timing, seconds the failing call took)."""
    done = subprocess.run([sys.executable, "-c", script, *args], env=_environment(tmp_path, hub), cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    lines = done.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("ELAPSED "), done.stderr[-3000:]
    return done.returncode, lines[:-1], float(lines[-1].split()[1])


REASONS = {"offline": "HF_HUB_OFFLINE is set", "unreachable": "cannot be reached"}


@pytest.mark.parametrize("hub", ["offline", "unreachable"])
def test_convert_from_an_uncached_hub_model_fails_at_once(tmp_path, hub):
    status, stderr, elapsed = _run(CONVERT, ["convert", "--model", "FacebookAI/roberta-base", "--attn", "rela",
                                             "--text", str(TEXT), "--output", str(tmp_path / "out")], tmp_path, hub)
    assert status == 1, stderr
    assert stderr[-1].startswith("hf-sliced-attn convert: error: No local folder 'FacebookAI/roberta-base'"), stderr
    assert REASONS[hub] in stderr[-1] and "Give a local folder" in stderr[-1], stderr
    assert not any("Retrying" in line for line in stderr), stderr
    assert elapsed < LIMIT_S, f"the failing call took {elapsed:.1f} s: {stderr}"


@pytest.mark.parametrize("hub", ["offline", "unreachable"])
def test_recipe_on_an_uncached_glue_task_fails_at_once(tmp_path, hub):
    status, stderr, elapsed = _run(RECIPE, ["--task_name", "mrpc", "--output_dir", str(tmp_path / "out")], tmp_path,
                                   hub)
    assert status == 2, stderr
    assert stderr[-1].startswith("glue.py: error: Cannot load GLUE task 'mrpc' from the Hub dataset nyu-mll/glue: "), stderr
    assert REASONS[hub] in stderr[-1] and "--train_file" in stderr[-1], stderr
    assert not any("Retrying" in line for line in stderr), stderr
    assert elapsed < LIMIT_S, f"the failing call took {elapsed:.1f} s: {stderr}"
