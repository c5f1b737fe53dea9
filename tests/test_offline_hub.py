"""Without the Hub (HF_HUB_OFFLINE=1, or an endpoint that does not answer), `hf-sliced-attn convert` and the GLUE
recipe, asked for Hub files that are not cached, fail at once with one line that says so (issue #23).

Each case runs in a fresh process with an empty Hugging Face cache, two ways: the whole command as a user runs it
(`hf-sliced-attn convert ...`, `python recipes/glue.py ...`), timed from start to exit, which a check before the heavy
imports answers (hf_sliced_attn_cli.hub_access, recipes/hub_preflight.py); and the package's own loading path, as the
Python API reaches it, timed around the failing call after the imports (it is what used to spend half a minute
retrying). What the check must let through (local files, cached Hub files) is checked in-process below.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
SAMPLE = RECIPES / "data" / "glue_sample" / "sst2"
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


LAUNCHER = "import sys; from hf_sliced_attn_cli import main; sys.exit(main())"
"""What the ``hf-sliced-attn`` console script runs."""


def _run_whole(command: list[str], tmp_path: Path, hub: str) -> tuple[int, list[str], float]:
    """(exit status, stderr lines, seconds from the process's start to its exit)."""
    start = time.perf_counter()
    done = subprocess.run(command, env=_environment(tmp_path, hub), cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    return done.returncode, done.stderr.strip().splitlines(), time.perf_counter() - start


@pytest.mark.parametrize("hub", ["offline", "unreachable"])
def test_the_convert_command_fails_within_the_limit_from_start_to_exit(tmp_path, hub):
    status, stderr, elapsed = _run_whole(
        [sys.executable, "-c", LAUNCHER, "convert", "--model", "FacebookAI/roberta-base", "--attn", "rela",
         "--text", str(TEXT), "--output", str(tmp_path / "out")], tmp_path, hub)
    assert status == 1, stderr
    assert len(stderr) == 1, stderr
    assert stderr[0].startswith("hf-sliced-attn convert: error: No local folder 'FacebookAI/roberta-base'"), stderr
    assert REASONS[hub] in stderr[0] and "Give a local folder" in stderr[0], stderr
    assert elapsed < LIMIT_S, f"the command took {elapsed:.1f} s: {stderr}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("hub", "args", "expected"), [
    ("offline", ["--task_name", "mrpc"], "Cannot load GLUE task 'mrpc' from the Hub dataset nyu-mll/glue: "),
    ("unreachable", ["--task_name", "mrpc"], "Cannot load GLUE task 'mrpc' from the Hub dataset nyu-mll/glue: "),
    ("offline", ["--preset", "roberta-base-mrpc"], "Cannot load GLUE task 'mrpc' from the Hub dataset nyu-mll/glue: "),
    ("unreachable", ["--train_file", str(SAMPLE / "train.tsv"), "--validation_file", str(SAMPLE / "validation.tsv"),
                     "--model_name_or_path", "FacebookAI/roberta-base"], "No local folder 'FacebookAI/roberta-base'"),
])
def test_the_recipe_fails_within_the_limit_from_start_to_exit(tmp_path, hub, args, expected):
    status, stderr, elapsed = _run_whole(
        [sys.executable, str(RECIPES / "glue.py"), *args, "--output_dir", str(tmp_path / "out")], tmp_path, hub)
    assert status == 2, stderr
    assert len(stderr) == 1 and stderr[0].startswith(f"glue.py: error: {expected}"), stderr
    assert REASONS[hub] in stderr[0], stderr
    assert elapsed < LIMIT_S, f"the recipe took {elapsed:.1f} s: {stderr}"
    assert not (tmp_path / "out").exists()


@pytest.fixture
def hub_preflight(monkeypatch, tmp_path):
    """recipes/hub_preflight.py, offline, over empty caches in ``tmp_path``."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    monkeypatch.syspath_prepend(str(RECIPES))
    import hub_preflight

    return hub_preflight


def _cache_model_config(hub_cache: Path, repo_id: str) -> None:
    """Put ``repo_id``'s config.json in a Hub cache, laid out as huggingface_hub writes it."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")


def test_the_preflight_lets_cached_and_local_sources_through(hub_preflight, tmp_path):
    model, task = ["--model_name_or_path", "FacebookAI/roberta-base"], ["--task_name", "mrpc"]
    assert "No local folder 'FacebookAI/roberta-base'" in hub_preflight.hub_problem(model)
    assert "Cannot load GLUE task 'mrpc'" in hub_preflight.hub_problem(task)
    _cache_model_config(tmp_path / "hf-home" / "hub", "FacebookAI/roberta-base")
    assert hub_preflight.hub_problem(model) is None
    (tmp_path / "hf-home" / "datasets" / "nyu-mll___glue").mkdir(parents=True)
    assert hub_preflight.hub_problem(task) is None
    local = ["--train_file", str(SAMPLE / "train.tsv"), "--preset", "roberta-base-mrpc",
             "--model_name_or_path", str(tmp_path)]
    assert hub_preflight.hub_problem(local) is None  # local files drop the preset's task; a local folder is the loader's
    assert hub_preflight.hub_problem([]) is None  # the main job: the bundled sample and checkpoint
