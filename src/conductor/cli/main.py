"""The ``conductor`` command: a root Typer app that the command groups attach to."""

from __future__ import annotations

import typer

from conductor.cli import (
    compile_cmd,
    demo_cmd,
    emulate_cmd,
    profile_cmd,
    replay_cmd,
    serve_cmd,
    sim_cmd,
)
from conductor.cli.bench_cmd import bench_app
from conductor.cli.trace_cmd import trace_app

app = typer.Typer(
    name="conductor",
    help="KVCache-centric global scheduler for P/D-disaggregated LLM serving.",
    no_args_is_help=True,
    add_completion=False,
    # Plain Click messages (no Rich panels): stable, greppable errors on any terminal width.
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
app.add_typer(trace_app, name="trace")
sim_cmd.register(app)
app.add_typer(bench_app, name="bench")
emulate_cmd.register(app)
serve_cmd.register(app)
demo_cmd.register(app)
profile_cmd.register(app)
replay_cmd.register(app)
compile_cmd.register(app)


def main() -> None:
    """Entry point of the ``conductor`` console script."""
    app()


if __name__ == "__main__":
    main()
