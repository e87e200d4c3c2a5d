"""Every file in ``broken/`` fails to load with exactly the problems its ``# expect:`` lines state.

Header lines of a corpus file:

- ``# expect: LINE:COLUMN KEY.PATH | MESSAGE`` - one per problem, in file order; the message must
  appear in the problem's message (the key path may be empty for file-level problems);
- ``# deep`` - load with deep validation (imports, files);
- ``# env: NAME=VALUE`` - the environment the file is interpolated with (empty otherwise).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from hud_pipelines.spec import SpecError, load_pipeline
from hud_pipelines.spec.problems import Problem

CORPUS = Path(__file__).parent / "broken"
EXPECT = re.compile(r"^# expect: (?P<line>\d+):(?P<column>\d+) (?P<path>\S*) ?\| (?P<message>.+)$")


@dataclass(frozen=True)
class Expected:
    line: int
    column: int
    path: str
    message: str


@dataclass(frozen=True)
class Case:
    file: Path
    expected: list[Expected]
    deep: bool
    env: dict[str, str]


def _case(file: Path) -> Case:
    lines = file.read_text(encoding="utf-8").splitlines()
    expected = [
        Expected(int(m["line"]), int(m["column"]), m["path"], m["message"])
        for m in (EXPECT.match(line) for line in lines)
        if m
    ]
    env = dict(line.removeprefix("# env: ").split("=", 1) for line in lines if line.startswith("# env: "))
    return Case(file, expected, "# deep" in lines, env)


CASES = [_case(f) for f in sorted(CORPUS.glob("*.yaml"))]


def test_the_corpus_is_large_and_every_file_states_its_problems() -> None:
    assert len(CASES) >= 20
    for case in CASES:
        assert case.expected, f"{case.file.name} has no '# expect:' line"


@pytest.mark.parametrize("case", CASES, ids=[c.file.stem for c in CASES])
def test_broken_file_reports_each_problem_at_its_line(case: Case) -> None:
    with pytest.raises(SpecError) as raised:
        load_pipeline(case.file, deep=case.deep, env=case.env)
    problems = raised.value.problems
    found = [f"{p.line}:{p.column} {p.path} | {p.message}" for p in problems]
    assert len(problems) == len(case.expected), "\n".join(found)
    for problem, expected in zip(problems, case.expected, strict=True):
        assert (problem.line, problem.column, problem.path) == (expected.line, expected.column, expected.path), found
        assert expected.message in problem.message, found
        assert problem.file.endswith(f"broken/{case.file.name}")
        _assert_rendered(problem)


def _assert_rendered(problem: Problem) -> None:
    """The rendering names file:line:col and puts the caret under the reported column of the quoted line."""
    rendered = problem.render().splitlines()
    assert rendered[0].startswith(f"{problem.file}:{problem.line}:{problem.column}: ")
    assert problem.message in rendered[0]
    source, caret = rendered[1], rendered[2]
    assert source.startswith(f"{problem.line:>5} | ")
    text_start = source.index(" | ") + 3
    assert caret.index("^") == text_start + problem.column - 1
    assert source[text_start:] == (problem.source_line or "").expandtabs(1)


def test_without_deep_the_deep_corpus_files_load() -> None:
    for case in CASES:
        if case.deep:
            spec = load_pipeline(case.file, deep=False, env=case.env)
            assert spec.name == case.file.stem
