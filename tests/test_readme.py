"""The README's promises are what CI runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command_exactly():
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert len(ci_lines) == 1, ci_lines
    readme = (ROOT / "README.md").read_text()
    assert f"\n{ci_lines[0]}\n" in readme, f"README.md must show the test command: {ci_lines[0]}"


def _setup_commands(readme: str) -> list[str]:
    section = readme.split("## Set-up commands", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("python -m pip install")]


def test_readme_set_up_commands_are_the_report_and_the_tests():
    commands = _setup_commands((ROOT / "README.md").read_text())
    assert commands == [
        'python -m pip install -c constraints.txt -e ".[report]" && observers-core report',
        'python -m pip install -c constraints.txt -e ".[test]" && python -m pytest -q',
    ]


def test_readme_main_command_runs_an_existing_example():
    readme = (ROOT / "README.md").read_text()
    main = [line for line in readme.splitlines() if line.startswith("python -m pip install") and "examples/" in line]
    assert main, "README.md must show the command that runs the example"
    script = main[0].split("python ")[-1].split()[0]
    assert (ROOT / script).is_file(), script


def test_every_difference_from_torch_is_pinned_by_an_existing_test():
    import re

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Differences from torch.ao", 1)[1].split("\n## ", 1)[0]
    refs = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", section)
    assert len(refs) >= 10, refs
    missing = [f"{f}::{name}" for f, name in refs if f"def {name}(" not in (ROOT / f).read_text()]
    assert not missing, missing
