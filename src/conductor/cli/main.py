"""The ``conductor`` command: a root Typer app that mounts one sub-app per area."""

from __future__ import annotations

import typer

from conductor.cli.bench_cmd import bench_app

app = typer.Typer(no_args_is_help=True, help="KVCache-centric global scheduler for P/D serving.")
app.add_typer(bench_app, name="bench")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
