"""``--help`` over the whole command tree: a flag renders as a flag, never with a value
placeholder after it (``--resume <bool>`` reads as if it took a value); an option that takes a
value still shows its type."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from vascl_scale.cli import app


def _command_tree(command, path: list[str]):
    """(path, command) of ``command`` and of every command below it."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _command_tree(sub, [*path, name])


COMMANDS = list(_command_tree(typer.main.get_command(app), []))


def _after_the_names(lines: list[str], option) -> str:
    """What the help row of ``option`` shows after its names (long, short, negative): the value
    placeholder, if any, then the help text. The row is the one that starts with the option's
    long name, after the box edge and the required mark, not one whose text mentions it."""
    long_name = next(name for name in option.opts if name.startswith("--"))
    pattern = re.compile(rf"^[\s│*]*{re.escape(long_name)}(?![\w-])")
    rows = [line for line in lines if pattern.search(line)]
    assert len(rows) == 1, f"{long_name}: {len(rows)} rows of the help start with it"
    tokens = rows[0].lstrip(" │*").split(" ")
    while tokens and (tokens[0].startswith("-") or tokens[0] == ""):
        tokens.pop(0)
    return " ".join(tokens)


def test_the_tree_is_walked_to_its_leaves() -> None:
    paths = {" ".join(path) for path, _ in COMMANDS}
    assert {"", "train", "eval", "eval neighbours", "data prepare", "sweep collect"} <= paths


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(path) or "vascl-scale" for path, _ in COMMANDS])
def test_flags_render_without_a_value_and_valued_options_with_their_type(path: list[str], command) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "250"}, prog_name="vascl-scale")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    options = [p for p in command.params if p.param_type_name == "option" and not p.hidden]
    options.append(command.get_help_option(command.make_context(" ".join(path), [], resilient_parsing=True)))
    for option in options:
        shown = _after_the_names(lines, option)
        if option.is_flag or option.count:
            assert not shown.startswith("<"), f"flag {option.opts} renders with a value placeholder: {shown}"
        else:  # the control: the check above reads the column where a placeholder would be
            assert shown.startswith(option.metavar or "<"), f"{option.opts} takes a value but shows none: {shown}"
