"""``--cost-file``: the cost model of a command from a file ``conductor profile`` wrote,
instead of a ``--preset`` (the two are mutually exclusive). Reading the file happens here;
its format and checks are :mod:`conductor.core.cost_file`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from conductor.core.cost_file import CostFile, parse_cost_file
from conductor.core.costmodel import CostModel
from conductor.core.errors import InvalidInput

CostFileOpt = Annotated[
    Path | None,
    typer.Option("--cost-file", help="cost model from `conductor profile` (not with --preset)"),
]


def read_cost_file(path: Path, name: str = "cost_file") -> CostFile:
    """The cost file at ``path``; :class:`InvalidInput` named ``name`` (the option or key
    the path came from) when it cannot be read or is invalid, the key at fault in the
    reason."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInput(name, str(path), f"cannot read: {exc.strerror}") from None
    try:
        return parse_cost_file(text)
    except InvalidInput as exc:
        raise InvalidInput(name, str(path), str(exc)) from None


def cost_from_options(
    ctx: typer.Context, cost_file: Path | None, preset_param: str = "preset_name"
) -> CostModel | None:
    """The model of ``--cost-file`` (None without one); exits with status 2 naming the
    option when it is bad or ``--preset`` was given too."""
    if cost_file is None:
        return None
    source = ctx.get_parameter_source(preset_param)
    if source is not None and source.name != "DEFAULT":
        typer.echo(
            "error: invalid --cost-file: --cost-file and --preset exclude each other", err=True
        )
        raise typer.Exit(2)
    try:
        return read_cost_file(cost_file, "--cost-file").cost
    except InvalidInput as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
