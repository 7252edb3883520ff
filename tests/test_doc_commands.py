"""Every ``vascl-scale`` command line in the README and docs/ resolves in the CLI's command tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.doc_commands import check_pages, command_problem, documented_commands

REPO = Path(__file__).resolve().parents[1]


def _documentation_pages() -> list[Path]:
    # Globbed at run time: a page added to docs/ is checked without touching this test.
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_every_documented_command_resolves() -> None:
    count, problems = check_pages(_documentation_pages(), REPO)
    assert count >= 50, f"only {count} vascl-scale command lines found in README.md and docs/: is the reader broken?"
    assert not problems, f"{len(problems)} documented command line(s) the CLI would refuse:\n" + "\n".join(problems)


def _page(*lines: str, language: str = "bash") -> str:
    return "# A page\n\nSome text.\n\n```" + language + "\n" + "\n".join(lines) + "\n```\n"


def test_reader_joins_lines_and_strips_the_shell_around_commands() -> None:
    page = _page(
        "VASCL_DATA=data time vascl-scale train --config c.yaml \\",
        '  --max-steps "$STEPS" --output "$(mktemp -d)" 2>&1 | tee log   # a comment',
        'OPTS="--task stsb --task sickr"',
        "vascl-scale eval sts --model m $OPTS && vascl-scale eval compare a.json b.json; echo done",
        "torchrun --nproc_per_node 2 -m vascl_scale train --config c.yaml > out.txt",
        "for s in a b; do vascl-scale sweep collect sweeps/$s; done",
        "pip install vascl-scale  # not an invocation",
    ) + _page("$ vascl-scale data download --list", "dataset registry (output, not a command)", language="console")
    page += _page("vascl-scale not --a --command", language="python")
    commands, unreadable = documented_commands(page, "page.md")
    assert unreadable == []
    assert [(c.line, c.argv) for c in commands] == [
        (6, ("train", "--config", "c.yaml", "--max-steps", "$STEPS", "--output", "$(mktemp -d)")),
        (9, ("eval", "sts", "--model", "m", "--task", "stsb", "--task", "sickr")),
        (9, ("eval", "compare", "a.json", "b.json")),
        (10, ("train", "--config", "c.yaml")),
        (11, ("sweep", "collect", "sweeps/$s")),
        (19, ("data", "download", "--list")),
    ]
    assert all(command_problem(c.argv) is None for c in commands)


@pytest.mark.parametrize(
    "line, expected",
    [
        ("vascl-scale trian --config c.yaml", "No such command 'trian'"),  # unknown sub-command
        ("vascl-scale eval stss --model m", "No such command 'stss'"),
        ("vascl-scale eval sts --modle m", "No such option: --modle"),  # unknown option
        ("vascl-scale --config c.yaml train", "No such option: --config"),  # an option of train before it
        ("vascl-scale train --config c.yaml --max-steps", "'--max-steps' requires an argument"),  # missing value
        (
            "vascl-scale train --config c.yaml --max-steps ten",
            "'--max-steps': Input should be a valid integer",
        ),  # not an integer
        ("vascl-scale bench data shards --seconds fast", "'--seconds': Input should be a valid number"),  # not a number
        (
            "vascl-scale eval sts --model m --batch-size 0",
            "'--batch-size': Input should be greater than or equal to 1",
        ),  # below the option's minimum
        ("vascl-scale train --config c.yaml --resume=yes", "does not take a value"),  # a flag given a value
        ("vascl-scale train --config c.yaml --resume yes", "unexpected extra argument(s) yes"),
        ("vascl-scale train --max-steps 3", "missing option --config"),
        ("vascl-scale eval compare a.json", "missing argument candidate"),
        ("vascl-scale eval --task stsb", "No such option: --task"),
        ("vascl-scale sweep --config c.yaml $UNSET", "$UNSET stands where a sub-command"),
    ],
)
def test_checker_reports_a_broken_line_with_its_file_and_line(tmp_path: Path, line: str, expected: str) -> None:
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(_page("echo first", line), encoding="utf-8")
    count, problems = check_pages([page], tmp_path)
    assert count == 1
    assert len(problems) == 1 and problems[0].startswith("docs/page.md:7: "), problems
    assert expected in problems[0], problems[0]


@pytest.mark.parametrize(
    "line",
    [
        "vascl-scale train --config c.yaml --max-steps $STEPS --resume",  # a variable for an integer
        "vascl-scale train --help",  # --help makes --config optional
        "vascl-scale data prepare a.txt b.txt -o shards --shard-size 10",
        "vascl-scale sweep --config c.yaml --grid loss.k=4,16 --output s --eval-args '--task stsb'",
        "vascl-scale --log-level DEBUG eval sts --model m --task stsb",
        "vascl-scale eval sts --model `ls -d runs/*` --batch-size ${BATCH} > scores.txt",  # backticks, ${...}
    ],
)
def test_checker_accepts_a_valid_line(tmp_path: Path, line: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(_page(line), encoding="utf-8")
    assert check_pages([page], tmp_path) == (1, [])


def test_unreadable_block_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(_page('vascl-scale train --config "c.yaml'), encoding="utf-8")
    assert check_pages([page], tmp_path)[1] == ['page.md:6: unclosed " on line 6']
