"""The ``vascl-scale`` command lines of Markdown pages, and their check against the CLI's command tree.

:func:`documented_commands` reads a page's fenced shell blocks (```` ```bash ````, ``sh``,
``shell``, ``console``: only its ``$ `` lines) as one shell session: continuation lines are joined,
quotes and comments read as bash reads them, commands split at ``|``, ``&&``, ``||``, ``;``, ``&``
and parentheses, redirections dropped, and a variable assigned earlier on the page
(``SCORES="..."``, ``export X=...``) expanded, split into words where it stands unquoted. A
command is ``vascl-scale ...`` after environment assignments (``VASCL_DATA=x``) and wrappers
(``time``, ``env``, ``nohup``, ``exec``, ``do``), or a launcher's ``-m vascl_scale`` /
``--module vascl_scale``. A variable the page never assigns, or a ``$(...)``, stays a
``$``-word: a value of any kind.

:func:`command_problem` resolves the words after ``vascl-scale`` against the Typer app with the
parser its own commands parse with (``make_parser``, ``resolve_command``), running nothing: each
sub-command must exist, each option too, an option taking a value must get one, a flag none, and
a literal value must convert to the option's type (``process_value``); a required option or
argument must be there (unless ``--help`` is).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import typer

from vascl_scale.cli import app

SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
PROGRAM = "vascl-scale"
MODULE = "vascl_scale"
_WRAPPERS = {"time", "env", "nohup", "exec", "command", "do", "then", "else", "!"}
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]")
# Every error the parser and the parameters raise derives from the UsageError of the click that
# typer runs on (vendored since typer 0.26); typer exports only BadParameter, one of them.
UsageError = next(base for base in typer.BadParameter.__mro__ if base.__name__ == "UsageError")


class ShellSyntaxError(ValueError):
    """A shell block this reader cannot split into words (an unclosed quote or ``$(``)."""


@dataclass(frozen=True)
class DocumentedCommand:
    """One documented invocation: where it starts and the words after ``vascl-scale``."""

    path: str
    line: int
    text: str
    argv: tuple[str, ...]


# A word is a list of parts: ("text", value, quoted) or ("var", name, quoted) or ("subst", source).
_Part = tuple


def _read_subst(text: str, start: int, close: str) -> int:
    """The index just past the ``)`` (or backtick) that closes the substitution opened before ``start``."""
    depth, i = 1, start
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char in "'\"" and close == ")":
            end = text.find(char, i + 1)
            if end < 0:
                break
            i = end + 1
            continue
        if close == ")" and char == "(":
            depth += 1
        elif char == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ShellSyntaxError(f"unclosed {'$(' if close == ')' else '`'}")


def _read_expansion(text: str, i: int, quoted: bool) -> tuple[_Part, int]:
    """The expansion starting at the ``$`` or backtick at ``i``, and the index after it."""
    if text[i] == "`":
        end = _read_subst(text, i + 1, "`")
        return ("subst", text[i:end]), end
    if text.startswith("$(", i):
        end = _read_subst(text, i + 2, ")")
        return ("subst", text[i:end]), end
    if text.startswith("${", i):
        end = text.find("}", i)
        if end < 0:
            raise ShellSyntaxError("unclosed ${")
        return ("var", text[i + 2 : end], quoted), end + 1
    match = _NAME.match(text, i + 1)
    if match is None:
        return ("text", "$", quoted), i + 1
    return ("var", match.group(), quoted), match.end()


def _simple_commands(text: str, first_line: int) -> list[tuple[int, list[list[_Part]]]]:
    """``text`` split as bash splits it into simple commands: (line of the first word, words)."""
    commands: list[tuple[int, list[list[_Part]]]] = []
    words: list[list[_Part]] = []
    word: list[_Part] | None = None
    start_line, line, i = first_line, first_line, 0
    drop_next = False  # the next word is a redirection's target

    def end_word() -> None:
        nonlocal word, drop_next, start_line
        if word is not None:
            if drop_next:
                drop_next = False
            else:
                if not words:
                    start_line = line
                words.append(word)
        word = None

    def end_command() -> None:
        nonlocal words
        end_word()
        if words:
            commands.append((start_line, words))
        words = []

    def add(part: _Part) -> None:
        nonlocal word
        word = (word or []) + [part]

    while i < len(text):
        char = text[i]
        if char == "\\":
            if text.startswith("\n", i + 1):  # a continuation line
                line += 1
            elif i + 1 < len(text):
                add(("text", text[i + 1], True))
            i += 2
        elif char in " \t":
            end_word()
            i += 1
        elif char == "\n":
            end_command()
            line += 1
            i += 1
        elif char == "#" and word is None:
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
        elif char == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise ShellSyntaxError(f"unclosed ' on line {line}")
            line += text.count("\n", i, end)
            add(("text", text[i + 1 : end], True))
            i = end + 1
        elif char == '"':
            add(("text", "", True))  # "" is a word even when empty
            i, opened = i + 1, line
            while True:
                if i >= len(text):
                    raise ShellSyntaxError(f'unclosed " on line {opened}')
                char = text[i]
                if char == '"':
                    i += 1
                    break
                if char == "\\" and text[i + 1 : i + 2] in ('"', "\\", "$", "`", "\n"):
                    if text[i + 1] == "\n":
                        line += 1
                    else:
                        add(("text", text[i + 1], True))
                    i += 2
                elif char in "$`":
                    part, i = _read_expansion(text, i, quoted=True)
                    add(part)
                else:
                    line += char == "\n"
                    add(("text", char, True))
                    i += 1
        elif char in "$`":
            part, i = _read_expansion(text, i, quoted=False)
            add(part)
        elif char in "<>" or (char == "&" and text[i + 1 : i + 2] == ">"):
            if word is not None and all(p[0] == "text" and not p[2] and p[1].isdigit() for p in word):
                word = None  # a file descriptor: 2>
            end_word()
            operator = re.match(r"&>>?|<<<|<<-?|<>|<&|>>|>&|>\||<|>", text[i:]).group()
            drop_next, i = True, i + len(operator)
        elif char in "|&;()":
            end_command()
            i += 2 if text[i : i + 2] in ("||", "&&", ";;", "|&") else 1
        else:
            add(("text", char, False))
            i += 1
    end_command()
    return commands


def _expand(word: list[_Part], variables: dict[str, str]) -> list[str]:
    """A word's fields: known variables substituted (split at whitespace where unquoted); an
    unknown variable or a command substitution kept as written, a ``$``-word."""
    fields: list[str] = [""]
    quoted_empty = False
    for part in word:
        if part[0] == "var" and part[1] in variables:
            value = variables[part[1]]
            if part[2]:
                fields[-1] += value
                quoted_empty = True
            else:  # field splitting
                pieces = re.split(r"\s+", value)
                fields[-1] += pieces[0]
                fields += pieces[1:]
        elif part[0] == "var":
            fields[-1] += f"${{{part[1]}}}" if not _NAME.fullmatch(part[1]) else f"${part[1]}"
        elif part[0] == "subst":
            fields[-1] += part[1]
        else:
            fields[-1] += part[1]
            quoted_empty = quoted_empty or part[2]
    fields = [field for index, field in enumerate(fields) if field or (quoted_empty and index == 0)]
    return fields


def _assignment(word: list[_Part]) -> str | None:
    """The variable a word assigns (``NAME=...`` with the ``=`` unquoted), if it is one."""
    head = "".join(p[1] for p in word[: next((k for k, p in enumerate(word) if p[0] != "text" or p[2]), len(word))])
    match = _ASSIGNMENT.match(head)
    return match.group(1) if match else None


def _assigned_value(word: list[_Part], variables: dict[str, str]) -> str:
    """The value of an assignment word (no field splitting, as bash assigns)."""
    text = "".join(_expand([(p[0], p[1], True) if p[0] != "subst" else p for p in word], variables))
    return text.split("=", 1)[1]


def _invocation(words: list[str]) -> tuple[str, ...] | None:
    """The words after the program in a command that runs ``vascl-scale``, else None."""
    index = 0
    while index < len(words) and (_ASSIGNMENT.match(words[index]) or words[index] in _WRAPPERS):
        index += 1
    if index < len(words) and (words[index] == PROGRAM or words[index].endswith(f"/{PROGRAM}")):
        return tuple(words[index + 1 :])
    for position in range(index, len(words) - 1):
        if words[position] in ("-m", "--module") and words[position + 1] == MODULE:
            return tuple(words[position + 2 :])
    return None


def shell_blocks(markdown: str) -> list[tuple[str, int, str]]:
    """The fenced blocks of a shell language in ``markdown``: (language, line of its first
    line, text); a console block keeps only its ``$ `` lines (other lines left empty)."""
    blocks, lines, index = [], markdown.splitlines(), 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        index += 1
        if opening is None:
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        language = opening["info"].strip().split(" ")[0].strip("{}.").lower()
        body, first = [], index + 1
        while index < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[index]):
            body.append(lines[index][indent:] if lines[index][:indent].isspace() else lines[index].lstrip())
            index += 1
        index += 1  # the closing fence
        if language not in SHELL_LANGUAGES:
            continue
        if language == "console":
            kept, continued = [], False
            for text in body:
                if text.startswith("$ ") or continued:
                    text = text[2:] if text.startswith("$ ") and not continued else text
                    kept.append(text)
                    continued = text.endswith("\\")
                else:
                    kept.append("")
            body = kept
        blocks.append((language, first, "\n".join(body) + "\n"))
    return blocks


def documented_commands(markdown: str, path: str) -> tuple[list[DocumentedCommand], list[str]]:
    """Every invocation of ``vascl-scale`` in the shell blocks of ``markdown``, and the blocks
    that could not be read (``path:line: problem``)."""
    variables: dict[str, str] = {}
    found, unreadable = [], []
    source_lines = markdown.splitlines()
    for _, first, text in shell_blocks(markdown):
        try:
            commands = _simple_commands(text, first)
        except ShellSyntaxError as err:
            unreadable.append(f"{path}:{first}: {err}")
            continue
        for line, words in commands:
            names = [_assignment(word) for word in words]
            if words and all(names):
                variables.update((name, _assigned_value(word, variables)) for name, word in zip(names, words))
                continue
            if words and _expand(words[0], variables) == ["export"]:
                for name, word in zip(names[1:], words[1:]):
                    if name:
                        variables[name] = _assigned_value(word, variables)
                continue
            expanded = [field for word in words for field in _expand(word, variables)]
            argv = _invocation(expanded)
            if argv is not None:
                found.append(DocumentedCommand(path, line, source_lines[line - 1].strip(), argv))
    return found, unreadable


def _message(err: Exception) -> str:
    return " ".join(err.format_message().split())


def command_problem(argv: tuple[str, ...] | list[str]) -> str | None:
    """What is wrong with ``vascl-scale ARGV`` in the CLI's command tree, or None."""
    command, name, args, parent = typer.main.get_command(app), PROGRAM, list(argv), None
    while True:
        ctx = command.context_class(command, info_name=name, parent=parent)
        try:
            opts, rest, _ = command.make_parser(ctx).parse_args(args=list(args))
        except UsageError as err:
            return f"{ctx.command_path}: {_message(err)}"
        help_option = command.get_help_option(ctx)
        if help_option is not None and opts.get(help_option.name):
            return None  # --help ends parsing: the rest is not checked
        for param in command.get_params(ctx):
            value = opts.get(param.name)
            if getattr(param, "is_flag", False):
                continue  # the parser took no value for it ("--flag=x" failed above)
            if value is None or param.value_is_missing(value):
                if param.required:
                    what = "/".join(param.opts) if param.param_type_name == "option" else (param.metavar or param.name)
                    return f"{ctx.command_path}: missing {param.param_type_name} {what}"
                continue
            values = value if isinstance(value, (list, tuple)) else [value]
            if any("$" in str(item) for item in values):
                continue  # set by the shell: any kind of value
            try:
                param.process_value(ctx, value)
            except UsageError as err:
                return f"{ctx.command_path}: {_message(err)}"
        is_group = hasattr(command, "list_commands")
        if not is_group:
            return f"{ctx.command_path}: unexpected extra argument(s) {' '.join(rest)}" if rest else None
        if not rest:
            if args and not command.invoke_without_command:
                return f"{ctx.command_path}: missing a sub-command (one of {', '.join(command.list_commands(ctx))})"
            return None
        if rest[0].startswith("$"):
            return (
                f"{ctx.command_path}: {rest[0]} stands where a sub-command or option is expected and is not assigned "
                "earlier on the page, so what it passes cannot be checked; assign it or write the options out"
            )
        try:
            name, command, args = command.resolve_command(ctx, rest)
        except UsageError as err:
            return f"{ctx.command_path}: {_message(err)}"
        parent = ctx


def check_pages(paths: list[Path], root: Path) -> tuple[int, list[str]]:
    """The invocations found in ``paths`` and one ``path:line: problem`` per bad one (or unreadable block)."""
    count, problems = 0, []
    for path in paths:
        shown = str(path.relative_to(root))
        commands, unreadable = documented_commands(path.read_text(encoding="utf-8"), shown)
        problems += unreadable
        count += len(commands)
        for command in commands:
            problem = command_problem(command.argv)
            if problem is not None:
                problems.append(f"{command.path}:{command.line}: {problem}\n    {command.text}")
    return count, problems
