"""The README's commands are the ones CI runs."""

from pathlib import Path

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
