"""The README: its commands are the ones CI runs, its examples run offline, its layout matches the tree."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The commands in the README's first code block."""
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_ci_runs_the_readme_test_command():
    install_and_run, install_and_test = readme_commands()[:2]
    assert "pytest" in install_and_test and "torch==2.13.0" in install_and_test
    ci_lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    assert install_and_test in ci_lines


def test_readme_main_job_pins_torch_and_runs_the_recipe():
    install_and_run = readme_commands()[0]
    assert "torch==2.13.0" in install_and_run and "recipes/glue.py" in install_and_run


def layout_block() -> str:
    """The code block of the README's "Layout" section."""
    section = (ROOT / "README.md").read_text().split("## Layout", 1)[1]
    return section.split("```", 2)[1]


def test_the_layout_section_matches_the_tree():
    """Every module of the package's top level and of conversion/, recipes/ and benchmarks/ is named, and
    every file and folder the section names exists."""
    block = layout_block()
    folders = ["hf_sliced_attn", "hf_sliced_attn/conversion", "recipes", "benchmarks"]
    unnamed = [f"{folder}/{path.name}" for folder in folders for path in sorted((ROOT / folder).glob("*.py"))
               if path.name != "__init__.py" and path.name not in block]
    assert not unnamed, f"modules missing from the README's layout: {unnamed}"
    names = set(re.findall(r"[\w.]+\.py\b", block)) | set(re.findall(r"\b[\w]+/(?=[\s,(])", block))
    existing = {path.name for path in ROOT.rglob("*.py")} | {f"{path.name}/" for path in ROOT.rglob("*") if path.is_dir()}
    assert not names - existing, f"the layout names what the tree lacks: {sorted(names - existing)}"


OFFLINE_BLOCK = re.compile(r"<!-- runs offline(, slow)? -->\n```python\n(.*?)```", re.S)


def offline_blocks(slow: bool) -> list[str]:
    """The README's Python blocks marked ``<!-- runs offline -->`` (or ``<!-- runs offline, slow -->``)."""
    return [code for flag, code in OFFLINE_BLOCK.findall((ROOT / "README.md").read_text()) if bool(flag) == slow]


def run_blocks(blocks: list[str], folder: Path) -> None:
    """Run ``blocks`` one after the other in one fresh interpreter, offline, in ``folder``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", "\n\n".join(blocks)], cwd=folder, env=env, capture_output=True,
                            text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_readme_examples_run_offline(tmp_path):
    blocks = offline_blocks(slow=False)
    assert len(blocks) >= 3 and "get_model_path()" in blocks[0]
    run_blocks(blocks, tmp_path)
    assert (tmp_path / "minilm-sliced" / "config.json").is_file()  # the first example saved its model


@pytest.mark.slow
def test_the_readme_conversion_example_runs_offline(tmp_path):
    pytest.importorskip("sentence_transformers")
    blocks = offline_blocks(slow=True)
    assert blocks
    run_blocks(blocks, tmp_path)
