"""Reading a training config: YAML with a hardened safe loader, ``--set`` overrides, and the
messages that name the file, line and column of what is wrong.

yaml's safe loader, which here also refuses a key written twice in one mapping, a key that is
not a name, and aliases that expand past :data:`MAX_YAML_VALUES` values; ``--set
section.key=value`` overrides any leaf (the value is parsed as YAML, so ``--set
loss.detach=false`` gives a bool). The result is validated by the schema
(:func:`vascl_scale.config.schema.config_from_dict`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from vascl_scale.config.schema import FsdpConfig, RunConfig, _first_error, config_from_dict
from vascl_scale.log import shown, shown_name

# Values a config document may hold once its YAML aliases are expanded. A real config holds a
# few hundred; a "billion laughs" document (aliases of lists of aliases) turns a few lines into
# 10**9 values, which would fill memory and every message quoting them.
MAX_YAML_VALUES = 100_000


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one ``section.key=value`` to a nested mapping in place; the value is parsed as YAML."""
    if "=" not in assignment:
        raise ValueError(f"--set expects key=value (e.g. loss.k=32); got {shown(assignment)}")
    if "\n" in assignment or "\r" in assignment:  # YAML would fold it into a space
        raise ValueError(f"--set {shown(assignment)}: the value holds a line break; write it on one line")
    dotted, raw = assignment.split("=", 1)
    parts = dotted.strip().split(".")
    if not all(parts):
        raise ValueError(f"--set key {dotted!r} is not a dotted key like loss.k")
    node = data
    model: type[BaseModel] = RunConfig
    for i, part in enumerate(parts):
        names = model.model_fields
        where = ".".join(parts[:i]) or "the config"
        if part not in names:
            raise ValueError(
                f"unknown key {'.'.join(map(shown_name, parts[: i + 1]))}; allowed keys in {where}: {', '.join(sorted(names))}"
            )
        annotation = names[part].annotation
        last = i == len(parts) - 1
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if last:
                raise ValueError(
                    f"--set {dotted} names a section; set one of its keys, e.g. {dotted}.{next(iter(annotation.model_fields))}"
                )
            node = node.setdefault(part, {})
            if not isinstance(node, dict):  # the file's value, which validation would refuse as this
                raise ValueError(f"{'.'.join(parts[: i + 1])} must be a mapping of keys to values; got {shown(node)}")
            model = annotation
        elif not last:
            raise ValueError(f"{'.'.join(parts[: i + 1])} is a value, not a section")
        else:
            node[part] = _parse_yaml(raw, f"--set {shown(assignment)}", in_file=False) if raw.strip() else ""


class _RefusedYAML(yaml.MarkedYAMLError):
    """A document :class:`_ConfigLoader` refuses; its mark says where."""


class _ConfigLoader(yaml.SafeLoader):
    """yaml's safe loader, refusing a key written twice in one mapping (yaml keeps the last one
    silently), a key that is not a name (``1:``, ``null:``, a list) and aliases that expand past
    :data:`MAX_YAML_VALUES` values. All are checked on the composed node graph, before any value
    is built."""

    def compose_mapping_node(self, anchor: str | None) -> yaml.MappingNode:
        node = super().compose_mapping_node(anchor)
        lines: dict[tuple[str, str], int] = {}  # each key's (tag, text): the line it is first on
        for key, _ in node.value:
            # "<<" merges a mapping whose keys the ones after it override: no duplicate.
            if isinstance(key, yaml.ScalarNode) and key.tag == "tag:yaml.org,2002:merge":
                continue
            # A key YAML reads as a number, null, a date, ... would reach a section as a keyword
            # argument that is no string (a TypeError), never as an unknown key.
            if not isinstance(key, yaml.ScalarNode) or key.tag != "tag:yaml.org,2002:str":
                scalar = isinstance(key, yaml.ScalarNode)
                what = f"{shown(key.value)} reads as {key.tag.rpartition(':')[2]}" if scalar else "is a list or mapping"
                problem = f"the key {what}, not a name; config keys are names such as loss or k"
                raise _RefusedYAML(problem=problem, problem_mark=key.start_mark)
            name = (key.tag, key.value)
            if name in lines:
                problem = f"duplicate key {shown(key.value)} (also on line {lines[name]})"
                raise _RefusedYAML(problem=problem, problem_mark=key.start_mark)
            lines[name] = key.start_mark.line + 1
        return node

    def compose_document(self) -> yaml.Node:
        node = super().compose_document()
        _expanded_size(node, {})
        return node


def _expanded_size(node: yaml.Node, sizes: dict[int, int | None]) -> int:
    """The number of values in ``node`` with its aliases expanded. An alias is the node it names,
    so counting each node once (``sizes``, by id) sizes a bomb without expanding it."""
    if id(node) in sizes:
        size = sizes[id(node)]
        if size is None:  # still being counted: the alias is inside the value it names
            raise _RefusedYAML(problem="an alias refers to a value that holds it", problem_mark=node.start_mark)
        return size
    sizes[id(node)] = None
    if isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    else:
        children = node.value if isinstance(node, yaml.SequenceNode) else []
    size = 1 + sum(_expanded_size(child, sizes) for child in children)
    if size > MAX_YAML_VALUES:
        raise _RefusedYAML(
            problem=f"aliases expand to more than {MAX_YAML_VALUES} values here; write the config with fewer aliases",
            problem_mark=node.start_mark,
        )
    sizes[id(node)] = size
    return size


def _parse_yaml(text: str, where: str, in_file: bool = True) -> Any:
    """YAML read with :class:`_ConfigLoader`, with errors that name the file, line and column (or the option)."""
    try:
        return yaml.load(text, Loader=_ConfigLoader)
    except RecursionError:
        raise ValueError(f"{where}: invalid YAML: values nested too deeply") from None
    except yaml.reader.ReaderError as err:  # no mark and a str() of two lines; its position is an offset in text
        line, column = text.count("\n", 0, err.position) + 1, err.position - text.rfind("\n", 0, err.position)
        position = f":{line}:{column}" if in_file else ""
        raise ValueError(
            f"{where}{position}: invalid YAML: unacceptable character #x{err.character:04x} ({err.reason}); remove it"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        position = f":{mark.line + 1}:{mark.column + 1}" if in_file and mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        hint = (
            "; configs are read with a safe loader, so write plain values (no !!python tags)"
            if isinstance(err, yaml.constructor.ConstructorError)
            else ""
        )
        raise ValueError(f"{where}{position}: invalid YAML: {problem}{hint}") from err


def load_config(path: str | os.PathLike | None, overrides: list[str] = ()) -> RunConfig:
    """Read a YAML file (safe loader), apply ``--set`` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"config file {path} does not exist")
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:  # a ValueError whose message names neither the file nor the line
            line = raw.count(b"\n", 0, err.start) + 1
            raise ValueError(
                f"{path}:{line}: not UTF-8 text (byte 0x{raw[err.start]:02x}); save the config as UTF-8"
            ) from None
        loaded = _parse_yaml(text, str(path))
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"{path}: the top level must be a mapping of sections")
        data = loaded or {}
    for assignment in overrides:
        apply_override(data, assignment)
    return config_from_dict(data)


def load_fsdp_config(path: str | os.PathLike) -> FsdpConfig:
    """The FSDP2 settings of ``--fsdp FILE`` (YAML, safe loader), validated; errors name the file."""
    path = Path(path)
    where = f"--fsdp {path}"
    if not path.is_file():
        raise ValueError(f"{where}: no such file (see configs/fsdp/ for examples)")
    try:
        loaded = _parse_yaml(path.read_text(encoding="utf-8"), where)
    except UnicodeDecodeError:
        raise ValueError(f"{where}: not UTF-8 text; save it as UTF-8") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ValueError(f"{where}: the top level must be a mapping of FSDP2 settings")
    try:
        return FsdpConfig.model_validate(loaded or {})
    except ValidationError as err:
        raise ValueError(f"{where}: {_first_error(err, FsdpConfig)}") from None


def save_config(config: RunConfig, path: str | os.PathLike) -> None:
    """Write the config as YAML (readable by :func:`load_config`), its paths as the user wrote them."""
    text = yaml.safe_dump(config.as_written().to_dict(), sort_keys=False, default_flow_style=None)
    Path(path).write_text(text, encoding="utf-8")
