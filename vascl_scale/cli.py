"""The ``vascl-scale`` command line: a thin layer over the importable library."""

from __future__ import annotations

import logging

import typer

from vascl_scale import __version__
from vascl_scale.log import setup_logging


def _render_flags_without_a_value() -> None:
    """Typer's rich help prints every option's type after its name, flags too (``--resume
    <bool>``), as if they took a value; its plain help already leaves a flag's type out
    (``TyperOption.get_help_record``). The rich column is made to follow the plain help. Typer
    versions whose options have no ``display_type_rich`` render flags bare already."""
    from typer.core import TyperOption

    typed = getattr(TyperOption, "display_type_rich", None)
    if typed is None or getattr(typed, "renders_flags_bare", False):
        return

    def display_type_rich(self: TyperOption, ctx) -> str | None:
        return None if self.is_flag or self.count else typed(self, ctx)

    display_type_rich.renders_flags_bare = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_render_flags_without_a_value()

app = typer.Typer(
    name="vascl-scale",
    help="Train VaSCL / SimCSE sentence encoders over a global batch, and evaluate them.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"vascl-scale {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version and exit."
    ),
) -> None:
    try:
        setup_logging(log_level)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--log-level") from err


# Sub-commands register here, one line each.
from vascl_scale.bench.cli import app as bench_app  # noqa: E402
from vascl_scale.data.cli import app as data_app  # noqa: E402
from vascl_scale.eval.cli import app as eval_app  # noqa: E402
from vascl_scale.sweep.cli import app as sweep_app  # noqa: E402
from vascl_scale.train.cli import train_command  # noqa: E402

app.add_typer(bench_app, name="bench")
app.add_typer(data_app, name="data")
app.add_typer(eval_app, name="eval")
app.command("train")(train_command)
app.add_typer(sweep_app, name="sweep")


def main() -> None:
    from vascl_scale.train.launch import StoppedBySignal  # standard library only: --help stays light

    try:
        app()
    except StoppedBySignal as err:  # a launcher whose workers were stopped (train says what it kept)
        logging.getLogger("vascl_scale").error("stopped by %s", err)
        raise SystemExit(128 + err.signum) from None


if __name__ == "__main__":
    main()
