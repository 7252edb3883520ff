"""The package's layers, checked on its import graph (every import, a function's lazy ones included).

From the bottom: the shared modules (communication, file system, logging, precision, ...), then
``losses``, ``data`` and ``config`` (losses read data's column names), then ``eval``, then
``train``, then ``bench`` and ``sweep``, then the command line. No module imports from a layer above its own (docs/architecture.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vascl_scale"

# A package (or module) -> the packages of the layers above it, which it must never import.
ABOVE = {
    "vascl_scale.losses": ("vascl_scale.train", "vascl_scale.eval", "vascl_scale.bench", "vascl_scale.sweep"),
    "vascl_scale.data": ("vascl_scale.eval", "vascl_scale.train", "vascl_scale.bench", "vascl_scale.sweep"),
    "vascl_scale.config": ("vascl_scale.eval", "vascl_scale.train", "vascl_scale.bench", "vascl_scale.sweep"),
    "vascl_scale.eval": ("vascl_scale.train", "vascl_scale.bench", "vascl_scale.sweep"),
    "vascl_scale.train": ("vascl_scale.bench", "vascl_scale.sweep"),
    "vascl_scale.distributed": ("vascl_scale.losses", "vascl_scale.train", "vascl_scale.data"),
}
# Every command module imports vascl_scale.cli's siblings only through the top-level app.
COMMANDS = ("vascl_scale.cli",)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The absolute names ``path`` imports (relative imports resolved), at any depth of its code."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


GRAPH = {_module_name(path): _imports(path) for path in sorted(PACKAGE.rglob("*.py"))}


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("layer", sorted(ABOVE))
def test_no_module_imports_from_a_layer_above_it(layer: str) -> None:
    offences = sorted(
        f"{module} imports {name}"
        for module, names in GRAPH.items()
        if _within(module, layer)
        for name in names
        if any(_within(name, above) for above in ABOVE[layer])
    )
    assert not offences, "\n".join(offences)


def test_loss_maths_never_imports_torch_distributed_and_the_step_never_imports_the_loader() -> None:
    losses = [m for m in GRAPH if _within(m, "vascl_scale.losses")]
    assert losses, "no loss modules found"
    assert not [m for m in losses if any(_within(n, "torch.distributed") for n in GRAPH[m])]
    assert not any(_within(name, "vascl_scale.data.loader") for name in GRAPH["vascl_scale.train.step"])
    assert any(_within(name, "vascl_scale.data.batch") for name in GRAPH["vascl_scale.train.step"])


def test_only_the_command_line_imports_the_command_line() -> None:
    offences = sorted(
        f"{module} imports {name}"
        for module, names in GRAPH.items()
        if not module.endswith(".cli") and module not in ("vascl_scale.__main__",)
        for name in names
        if name in COMMANDS or (name.endswith(".cli") and name.startswith("vascl_scale."))
    )
    assert not offences, "\n".join(offences)


def test_the_graph_sees_lazy_imports() -> None:
    """The check is only as good as its parser: a function-level import counts."""
    assert "vascl_scale.train.trainer" in GRAPH["vascl_scale.train.cli"]
