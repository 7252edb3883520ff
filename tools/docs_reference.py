"""The reference pages of the documentation site, generated from the code so that they cannot drift.

Three pages of ``docs/reference/``, one function each returning its Markdown:

- :func:`configuration_page`: every key of the config tree (:class:`vascl_scale.config.RunConfig`)
  with its type, default, allowed values (a ``Literal``'s values, a field's bounds) and its
  description, the docstring written under the field;
- :func:`commands_page`: every command and sub-command of the Typer app
  (:data:`vascl_scale.cli.app`) with its help and every argument and option, hidden ones left out;
- :func:`data_registry_page`: every dataset of ``vascl_scale/data/registry.toml`` as
  :func:`vascl_scale.data.registry.load_registry` reads it.

The text depends on the code alone (no clock, path, environment or terminal width), so a page
regenerated from unchanged code is byte for byte the committed one; ``tests/test_docs_reference.py``
fails when a committed page differs. From the repository root::

    python -m tools.docs_reference           # rewrite docs/reference/*.md
    python -m tools.docs_reference --check   # exit 1, naming the pages that differ
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import annotated_types
import typer
from pydantic import BaseModel

from vascl_scale.cli import app
from vascl_scale.config import MixSource, RunConfig
from vascl_scale.data.registry import FAMILIES, Dataset, load_registry
from vascl_scale.losses.spec import OBJECTIVES

REGENERATE = "python -m tools.docs_reference"
PAGES_DIR = Path("docs/reference")  # from the repository root

# Keys whose allowed values a rule checks rather than the type (objective_spec, in RunConfig._rules).
_ALLOWED_BY_RULE = {"objective": tuple(OBJECTIVES)}
_TYPE_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}
_PLURALS = {
    "boolean": "booleans",
    "integer": "integers",
    "number": "numbers",
    "string": "strings",
    "mapping": "mappings",
}
_BOUNDS = (
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Ge, "ge", ">="),
    (annotated_types.Lt, "lt", "<"),
    (annotated_types.Le, "le", "<="),
)
_RST_LITERAL = re.compile(r"``(.+?)``")
_RST_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_CODE_SPAN = re.compile(r"(`[^`]*`)")


def _generated(source: str) -> str:
    return f"<!-- Generated from {source} by `{REGENERATE}`: edit that, not this page. -->\n"


def _markdown(text: str, in_table: bool = True) -> str:
    """Docstring or help text as Markdown: reST literals and roles become code spans, lines are
    joined, and outside code spans ``<`` is escaped (Markdown would read ``<name>`` as an HTML
    tag); in a table cell ``|`` is escaped everywhere (a code span does not protect it)."""
    text = " ".join(inspect.cleandoc(text).split())
    text = _RST_ROLE.sub(r"`\1`", _RST_LITERAL.sub(r"`\1`", text))
    parts = _CODE_SPAN.split(text)  # odd indices: code spans
    for index in range(0, len(parts), 2):
        parts[index] = parts[index].replace("<", "&lt;")
    text = "".join(parts)
    return text.replace("|", r"\|") if in_table else text


def _code(value: str) -> str:
    """``value`` as a code span (a table cell's pipes escaped)."""
    assert "`" not in value, value
    return f"`{value}`".replace("|", r"\|") if value else '`""`'


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell or " " for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ---- configuration.md ----------------------------------------------------------------------


def _unwrapped(annotation: Any) -> Any:
    """``annotation`` without ``Annotated[...]`` around it."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _type_name(annotation: Any) -> str:
    """A YAML reader's name for the values an annotation takes: "integer", "string or null", "list of numbers"."""
    annotation = _unwrapped(annotation)
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return " or ".join(dict.fromkeys(_TYPE_NAMES[type(value)] for value in typing.get_args(annotation)))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(annotation))
    if origin is list:
        item = _type_name(typing.get_args(annotation)[0])
        return f"list of {_PLURALS.get(item, item)}"
    if origin is dict:
        item = _type_name(typing.get_args(annotation)[1])
        return f"mapping to {_PLURALS.get(item, item)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return _TYPE_NAMES[annotation]


def _allowed(dotted: str, field: Any) -> str:
    """A field's fixed values (a Literal's, or a rule's) or its bounds, as one cell."""
    values = _ALLOWED_BY_RULE.get(dotted) or (
        typing.get_args(_unwrapped(field.annotation))
        if typing.get_origin(_unwrapped(field.annotation)) is Literal
        else ()
    )
    if values:
        return ", ".join(_code(str(value)) for value in values)
    bounds = []
    for constraint in field.metadata:
        for kind, attribute, sign in _BOUNDS:
            if isinstance(constraint, kind):
                bounds.append(f"{sign} {_yaml(getattr(constraint, attribute))}")
        if isinstance(constraint, annotated_types.MinLen):
            bounds.append("not empty" if constraint.min_length == 1 else f"at least {constraint.min_length} long")
    return ", ".join(bounds)


def _yaml(value: Any) -> str:
    """A default as a config file would write it: true, null, 5e-06, [0.9, 0.999]."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_yaml(item)}" for key, item in value.items()) + "}"
    return str(value)


def _section_model(annotation: Any) -> type[BaseModel] | None:
    annotation = _unwrapped(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _key_rows(model: type[BaseModel], prefix: str) -> list[tuple[str, ...]]:
    """One row per leaf key of ``model`` (its sections are tables of their own)."""
    rows = []
    for name, field in model.model_fields.items():
        if _section_model(field.annotation) is not None:
            continue
        dotted = f"{prefix}{name}"
        default = "required" if field.is_required() else _code(_yaml(field.default))
        rows.append(
            (
                _code(dotted),
                _type_name(field.annotation),
                default,
                _allowed(dotted, field),
                _markdown(field.description or ""),
            )
        )
    return rows


_KEY_HEADER = ("key", "type", "default", "allowed", "description")


def configuration_page() -> str:
    """Every key of a training config, section by section, from the pydantic models."""
    out = [
        "# Configuration reference\n\n",
        _generated("the pydantic models of `vascl_scale/config/schema.py`"),
        "\nA training run reads one YAML file of sections (`vascl-scale train --config FILE`); "
        "`--set section.key=value` overrides any key of this page, its value read as YAML. Types are strict "
        '(`loss.k: 3.5` or `"3"` is refused; a number also takes an integer or a numeric string), numbers '
        "must be finite, and an unknown key, a missing required key or a value outside the allowed ones is "
        "an error naming the key and what it allows. Rules between keys (`loss.k` below the global batch, "
        "`data.augment: ctxt` with a `data.augment_model`) are checked when the file is loaded.\n\n",
        "## Top level\n\n",
        _table(_KEY_HEADER, _key_rows(RunConfig, "")),
    ]
    for name, field in RunConfig.model_fields.items():
        section = _section_model(field.annotation)
        if section is None:
            continue
        out += [f"\n## `{name}`\n\n", _markdown(section.__doc__, in_table=False), "\n\n"]
        out.append(_table(_KEY_HEADER, _key_rows(section, f"{name}.")))
        for key, subfield in section.model_fields.items():  # a section within the section (model.lora)
            inner = _section_model(subfield.annotation)
            if inner is not None:
                out += [f"\n### `{name}.{key}`\n\n", _markdown(inner.__doc__, in_table=False), "\n\n"]
                out.append(_table(_KEY_HEADER, _key_rows(inner, f"{name}.{key}.")))
        if name == "data":
            out += [
                "\n### Each source of a list `data.train`\n\n",
                _markdown(MixSource.__doc__, in_table=False),
                "\n\n",
            ]
            out.append(_table(_KEY_HEADER, _key_rows(MixSource, "data.train[i].")))
    return "".join(out)


# ---- commands.md -----------------------------------------------------------------------------


def _anchor(path: str) -> str:
    """The heading id MkDocs (Python-Markdown's toc) gives a heading of ``path`` in backticks."""
    return path.replace(" ", "-")


def _value_kind(param: Any) -> str:
    """What an option or argument takes: "flag", "integer >= 1", "path, repeatable"..."""
    if getattr(param, "is_flag", False):
        return "flag"
    descriptor = param.type_descriptor
    annotation = descriptor.annotation
    if descriptor.is_list:
        annotation = typing.get_args(annotation)[0]
    if descriptor.choices is not None:
        kind = "one of " + ", ".join(_code(str(choice)) for choice in descriptor.choices)
    else:
        kind = {int: "integer", float: "number", str: "text", Path: "path"}[annotation]
    bounds = [f">= {param.min}"] if getattr(param, "min", None) is not None else []
    bounds += [f"<= {param.max}"] if getattr(param, "max", None) is not None else []
    parts = [" ".join([kind, *bounds])]
    if param.metavar is not None and param.param_type_name == "option":  # an argument is named by it
        parts[0] += f" ({_code(param.metavar)})"
    if param.multiple:
        parts.append("repeatable")
    if param.nargs == -1:
        parts.append("one or more" if param.required else "any number")
    if param.required and param.nargs != -1:
        parts.append("required")
    return ", ".join(parts)


def _option_names(param: Any) -> str:
    return ", ".join(_code(name) for name in [*param.opts, *param.secondary_opts])


def _default(param: Any) -> str:
    if getattr(param, "is_flag", False):
        return "on" if param.default else "off"
    if param.default is None or param.default == [] or param.required:
        return ""
    values = param.default if isinstance(param.default, (list, tuple)) else [param.default]
    return ", ".join(_code(str(value)) for value in values)


def _command_section(command: Any, ctx: Any, help_option: Any) -> str:
    path = ctx.command_path
    out = [f"\n## `{path}`\n\n"]
    if command.help:
        out += [_markdown(_help_text(command), in_table=False), "\n\n"]
    out += ["```text\n", " ".join([path, *command.collect_usage_pieces(ctx)]), "\n```\n"]
    params = [p for p in command.get_params(ctx) if p is not help_option and not getattr(p, "hidden", False)]
    arguments = [p for p in params if p.param_type_name == "argument"]
    options = [p for p in params if p.param_type_name == "option"]
    if arguments:
        rows = [(_code(p.metavar or p.name), _value_kind(p), _markdown(p.help or "")) for p in arguments]
        out += ["\n", _table(("argument", "takes", "description"), rows)]
    if options:
        rows = [(_option_names(p), _value_kind(p), _default(p), _markdown(p.help or "")) for p in options]
        out += ["\n", _table(("option", "takes", "default", "description"), rows)]
    subcommands = _visible_subcommands(command, ctx)
    if subcommands:
        rows = [
            (f"[`{name}`](#{_anchor(f'{path} {name}')})", _markdown(_help_text(sub).partition("\n\n")[0]))
            for name, sub in subcommands
        ]
        out += ["\n", _table(("command", "does"), rows)]
    return "".join(out)


def _help_text(command: Any) -> str:
    """A command's help as ``--help`` prints it: its docstring up to a form feed."""
    return inspect.cleandoc(command.help or "").partition("\f")[0]


def _visible_subcommands(command: Any, ctx: Any) -> list[tuple[str, Any]]:
    if not hasattr(command, "list_commands"):
        return []
    return [
        (name, command.get_command(ctx, name))
        for name in command.list_commands(ctx)
        if not command.get_command(ctx, name).hidden
    ]


def commands_page() -> str:
    """Every visible command of ``vascl-scale``, depth first in the order they are registered."""
    out = [
        "# Command reference\n\n",
        _generated("the Typer app `vascl_scale.cli:app`"),
        "\nEvery command also takes `--help`. The options of `vascl-scale` itself (`--log-level`) come before "
        "the command, a command's own after it, in any order; a repeatable option is given once per value "
        "(`--task stsb --task sickr`).\n",
    ]

    def visit(command: Any, name: str, parent: Any) -> None:
        ctx = command.context_class(command, info_name=name, parent=parent)
        out.append(_command_section(command, ctx, command.get_help_option(ctx)))
        for sub_name, sub in _visible_subcommands(command, ctx):
            visit(sub, sub_name, ctx)

    visit(typer.main.get_command(app), "vascl-scale", None)
    return "".join(out)


# ---- data-registry.md ------------------------------------------------------------------------


def _digest(digest: str | None) -> str:
    return _code(digest) if digest else "not pinned"


def _dataset_section(dataset: Dataset) -> str:
    # files / splits map originals onto the outputs listed below: the other options are settings.
    options = {key: value for key, value in dataset.options.items() if key not in ("files", "splits")}
    out = [f"\n### {dataset.name}\n\n", _markdown(dataset.description, in_table=False), "\n\n"]
    facts = [
        ("family", _code(dataset.family)),
        ("licence", _markdown(dataset.licence, in_table=False)),
        ("original format", _markdown(dataset.format, in_table=False)),
        (
            "converter",
            _code(dataset.converter)
            + "".join(f", {_code(f'{k}={json.dumps(v)}')}" for k, v in sorted(options.items())),
        ),
        ("checked", _markdown(dataset.checked, in_table=False)),
        ("withheld", _markdown(dataset.withheld, in_table=False)),
        ("notes", _markdown(dataset.notes, in_table=False)),
    ]
    out += [f"- **{label}**: {text}\n" for label, text in facts if text]
    out += [
        "\n",
        _table(("original", "sha256"), [(f"<{source.url}>", _digest(source.sha256)) for source in dataset.sources]),
    ]
    out += [
        "\n",
        _table(
            ("converted file", "sha256"), [(_code(path), _digest(digest)) for path, digest in dataset.outputs.items()]
        ),
    ]
    return "".join(out)


def data_registry_page() -> str:
    """Every dataset of the registry, by family: sources, licence, converter and every file's sha256."""
    datasets = load_registry().datasets
    out = [
        "# Data registry\n\n",
        _generated("`vascl_scale/data/registry.toml`"),
        "\n`vascl-scale data download NAME... --to DIR` fetches these datasets (by name, by family, or all), "
        "converts each into the data directory's layout and checks every converted file against its sha256 "
        "below; `vascl-scale data download --list` shows the same registry in the terminal.\n\n",
    ]
    summary = [
        (f"[{d.name}](#{d.name})", _code(d.family), str(len(d.outputs)), _markdown(d.licence))
        for family in FAMILIES
        for d in datasets
        if d.family == family
    ]
    out.append(_table(("dataset", "family", "files", "licence"), summary))
    for family in FAMILIES:
        out.append(f"\n## {family}\n")
        out += [_dataset_section(d) for d in datasets if d.family == family]
    return "".join(out)


PAGES: dict[str, Callable[[], str]] = {
    "configuration.md": configuration_page,
    "commands.md": commands_page,
    "data-registry.md": data_registry_page,
}


def stale_pages(directory: Path = PAGES_DIR) -> list[str]:
    """The pages of :data:`PAGES` that ``directory`` lacks or holds with other text than the code gives now."""
    return [
        name
        for name, page in PAGES.items()
        if not (directory / name).is_file() or (directory / name).read_text(encoding="utf-8") != page()
    ]


def write_pages(directory: Path = PAGES_DIR) -> list[Path]:
    """Write every page of :data:`PAGES` into ``directory``; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, page in PAGES.items():
        path = directory / name
        path.write_text(page(), encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__name__}", description="Write the generated reference pages of the docs."
    )
    parser.add_argument(
        "--to",
        type=Path,
        default=PAGES_DIR,
        help=f"the pages' directory (default {PAGES_DIR}, from the repository root)",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 naming the pages that differ from the code"
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages(args.to)
        for name in stale:
            typer.echo(f"{args.to / name} differs from the code; regenerate with: {REGENERATE}", err=True)
        return 1 if stale else 0
    for path in write_pages(args.to):
        typer.echo(str(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
