"""The README and the guides keep their promises: the commands are what CI runs, the links resolve, every
difference from torch names a test that exists, and the front door stays short."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
GUIDES = {path.name: path.read_text() for path in sorted((ROOT / "docs").glob("*.md"))}

REPORT = 'python -m pip install -c constraints.txt -e ".[report]" && observers-core report'
TESTS = 'python -m pip install -c constraints.txt -e ".[test]" && python -m pytest -q'
SLOW = "python -m pytest -q -m slow"


def _section(text: str, title: str) -> str:
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _fenced_lines(text: str, language: str) -> list[str]:
    return [line for block in re.findall(rf"^```{language}\n(.*?)^```$", text, re.S | re.M)
            for line in block.splitlines()]


def _ci_commands() -> list[str]:
    """The lines of .ci/run that install the project or run the tests."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    return [line for line in lines if not line.startswith("#") and ("pytest" in line or "pip install" in line)]


def test_set_up_commands_are_the_report_the_tests_and_the_slow_tests():
    commands = _fenced_lines(_section(README, "Set-up commands"), "bash")
    assert commands == [REPORT, TESTS, SLOW]


def test_ci_runs_what_the_readme_shows():
    ci = _ci_commands()
    assert TESTS in ci, f".ci/run must run the README's test command exactly: {TESTS}"
    shown = _fenced_lines(README, "bash")
    not_shown = [line for line in ci if line not in shown]
    assert not not_shown, f".ci/run runs commands README.md does not show: {not_shown}"
    if re.search(r"[\"']slow\s*:", (ROOT / "pyproject.toml").read_text()):  # the slow marker is declared
        assert SLOW in ci, f"pyproject.toml declares the slow marker, so .ci/run must also run: {SLOW}"


def test_the_example_command_runs_an_existing_script():
    lines = [line for line in _fenced_lines(GUIDES["torch.md"], "bash") if "examples/" in line]
    assert lines, "docs/torch.md must show the command that runs the example"
    script = lines[0].split("python ")[-1].split()[0]
    assert (ROOT / script).is_file(), script


def test_readme_is_at_most_250_lines_besides_the_report_sample():
    sample = re.search(r"^```text\n(.*?)^```$", README, re.S | re.M)
    sample_lines = sample.group(1).count("\n") if sample else 0
    assert README.count("\n") - sample_lines <= 250


def test_every_guide_is_linked_from_the_readme_and_every_local_link_resolves():
    for name in GUIDES:
        if not name.startswith("gpu-kernels"):  # reached from docs/gpu.md (gpu-kernels-*.md: merged into it)
            assert f"](docs/{name})" in README, f"README.md does not link docs/{name}"
    broken = []
    for path, text in [(ROOT / "README.md", README)] + [(ROOT / "docs" / n, t) for n, t in GUIDES.items()]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not target.startswith(("http://", "https://")) and not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_docs_name_no_issue_numbers_and_keep_table_rows_short():
    for name, text in [("README.md", README)] + [(f"docs/{n}", t) for n, t in GUIDES.items()]:
        assert not re.search(r"\bissue \d+|\(#\d+\)", text, re.I), f"{name} cites an issue number"
        long_rows = [line[:60] for line in text.splitlines() if line.startswith("|") and len(line) > 260]
        assert not long_rows, f"{name}: table rows over 260 characters: {long_rows}"


def test_every_difference_from_torch_is_pinned_by_an_existing_test():
    table = _section(GUIDES["torch.md"], "Differences from torch.ao")
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    refs = [re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", row) for row in rows]
    assert len(rows) >= 20 and all(refs), [row for row, ref in zip(rows, refs) if not ref]
    missing = [f"{f}::{name}" for ref in refs for f, name in ref
               if not (ROOT / f).is_file() or f"def {name}(" not in (ROOT / f).read_text()]
    assert not missing, missing
