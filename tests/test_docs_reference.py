"""The generated reference pages: committed as the code writes them, and complete."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import typer
from pydantic import BaseModel

from tools import docs_reference
from vascl_scale.cli import app
from vascl_scale.config import LossConfig, RunConfig
from vascl_scale.data.registry import load_registry

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(docs_reference.PAGES))
def test_committed_page_is_what_the_code_writes(name: str) -> None:
    path = REPO / "docs" / "reference" / name
    written = path.read_text(encoding="utf-8") if path.is_file() else None
    assert written == docs_reference.PAGES[name](), (
        f"docs/reference/{name} differs from the code; regenerate it from the repository root with "
        f"`{docs_reference.REGENERATE}` and commit the result"
    )


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> list[tuple[str, typing.Any]]:
    keys = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys += _leaf_keys(annotation, f"{prefix}{name}.")
        else:
            keys.append((f"{prefix}{name}", field))
    return keys


def test_configuration_page_has_every_key_with_its_docstring() -> None:
    page = docs_reference.configuration_page()
    keys = _leaf_keys(RunConfig) + [(f"data.train[i].{name}", f) for name, f in _leaf_keys(docs_reference.MixSource)]
    undocumented = [key for key, field in keys if not field.description]
    assert not undocumented, f"config keys without a docstring under the field: {undocumented}"
    for key, _ in keys:
        assert f"| `{key}` |" in page, key
    assert sum(line.startswith("| `") for line in page.splitlines()) == len(keys)  # no other rows
    # The description is the docstring under the field, and the row has type, default and bounds.
    assert LossConfig.model_fields["k"].description.startswith(
        "neighbours per anchor, searched over the whole global batch"
    )
    assert "| `loss.k` | integer | `16` |   | neighbours per anchor" in page
    assert "| `train.precision` | string | `auto` | `auto`, `no`, `bf16`, `fp16` |" in page
    assert "| `data.augment_fraction` | number | `0.1` | > 0, <= 1 |" in page
    assert (
        "| `objective` | string | `vascl` | `vascl`, `simcse`, `simcse_sup`, `pairsupcon`, `distill_kl`, `margin_mse` |"
        in page
    )
    assert "| `model.path` | string | required | not empty |" in page


def _visible_commands(
    command: typing.Any, path: str, parent: typing.Any = None
) -> list[tuple[str, typing.Any, typing.Any]]:
    ctx = command.context_class(command, info_name=path.rsplit(" ", 1)[-1], parent=parent)
    found = [(path, command, ctx)]
    for name in getattr(command, "commands", {}):
        sub = command.commands[name]
        if not sub.hidden:
            found += _visible_commands(sub, f"{path} {name}", ctx)
    return found


def test_commands_page_has_every_command_and_visible_option() -> None:
    page = docs_reference.commands_page()
    sections: dict[str, str] = {}  # command path -> its section
    for part in page.split("\n## `")[1:]:
        heading, _, body = part.partition("`\n")
        sections[heading] = body
    commands = _visible_commands(typer.main.get_command(app), "vascl-scale")
    assert list(sections) == [path for path, _, _ in commands]
    for path, command, ctx in commands:
        help_option = command.get_help_option(ctx)
        for param in command.get_params(ctx):
            names = (
                [*param.opts, *param.secondary_opts]
                if param.param_type_name == "option"
                else [param.metavar or param.name]
            )
            shown = f"| `{names[0]}`" in sections[path]
            assert shown == (param is not help_option and not getattr(param, "hidden", False)), (path, names)
    # Flags are flags, not options taking a boolean; a value's kind and bounds are given.
    assert "| `--resume` | flag | off | Continue from the latest complete checkpoint" in sections["vascl-scale train"]
    assert "| `--batch-size` | integer >= 1 | `64` |" in sections["vascl-scale eval sts"]
    assert "| `--model` | path, repeatable, required |" in sections["vascl-scale eval sts"]
    assert "--worker-output" not in page  # hidden


def test_data_registry_page_has_every_dataset_source_and_file() -> None:
    page = docs_reference.data_registry_page()
    datasets = load_registry().datasets
    for dataset in datasets:
        assert f"\n### {dataset.name}\n" in page
        assert f"- **family**: `{dataset.family}`\n" in page
        for source in dataset.sources:
            assert f"| <{source.url}> | {f'`{source.sha256}`' if source.sha256 else 'not pinned'} |" in page
        for path, digest in dataset.outputs.items():
            assert f"| `{path}` | {f'`{digest}`' if digest else 'not pinned'} |" in page


def test_check_mode_names_the_pages_to_regenerate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert docs_reference.main(["--check", "--to", str(tmp_path)]) == 1
    assert docs_reference.stale_pages(tmp_path) == list(docs_reference.PAGES)
    assert docs_reference.main(["--to", str(tmp_path)]) == 0
    assert docs_reference.main(["--check", "--to", str(tmp_path)]) == 0
    (tmp_path / "commands.md").write_text("# edited by hand\n", encoding="utf-8")
    assert docs_reference.stale_pages(tmp_path) == ["commands.md"]
    assert docs_reference.main(["--check", "--to", str(tmp_path)]) == 1
    assert f"commands.md differs from the code; regenerate with: {docs_reference.REGENERATE}" in capsys.readouterr().err
