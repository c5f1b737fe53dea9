"""benchmarks/results/README.md indexes the results: every file there is named in it, and every
results path the READMEs quote exists (or the index says why there is no file)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "README.md"


def expand(path: str) -> list[str]:
    """``a.{md,json}`` -> ``a.md``, ``a.json`` (one brace group)."""
    found = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", path)
    return [f"{found[1]}{part}{found[3]}" for part in found[2].split(",")] if found else [path]


def readme_paths() -> set[str]:
    """The paths under benchmarks/results/ that the main README and benchmarks/README.md name."""
    text = (ROOT / "README.md").read_text() + (ROOT / "benchmarks" / "README.md").read_text()
    names = re.findall(r"benchmarks/results/([\w./{},-]*)", text)
    return {path for name in names for path in expand(name.rstrip(".,"))}


def indexed(relative: str, index: str) -> bool:
    """Whether the index names this file, or a folder holding it."""
    parts = Path(relative).parts
    return f"`{relative}`" in index or any(f"`{'/'.join(parts[:i])}/`" in index for i in range(1, len(parts)))


def test_every_results_file_is_in_the_index():
    index = INDEX.read_text()
    files = [p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file() and p != INDEX]
    assert files and not [f for f in files if not indexed(f, index)]


def test_every_results_path_the_readme_quotes_exists_or_the_index_says_why_not():
    not_backed = INDEX.read_text().split("Not backed by a file here:", 1)[1].lstrip().split("\n\n", 1)[0]
    paths = readme_paths()
    assert "long_context.md" in paths and "training_step_fused/" in paths
    missing = [p for p in paths if not (RESULTS / p).exists() and f"`{p}`" not in not_backed]
    assert not missing, missing


def test_a_file_missing_from_the_index_is_found():
    assert not indexed("encoder_time.png", "`encoder/encoder_time.png`")
    assert indexed("ablation/rela_keep2-seed0.json", "`ablation/`")
