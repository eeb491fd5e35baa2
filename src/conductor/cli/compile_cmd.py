"""``conductor compile``: build (or ``--remove``) the mypyc-compiled hot modules in place."""

from __future__ import annotations

import time
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("compile")
    def compile_cmd(
        remove: Annotated[
            bool, typer.Option("--remove", help="delete the compiled build instead")
        ] = False,
        status: Annotated[
            bool, typer.Option("--status", help="say whether a build exists and is current")
        ] = False,
        opt_level: Annotated[
            int, typer.Option("--opt-level", min=0, max=3, help="mypyc's (C) optimisation level")
        ] = 3,
    ) -> None:
        """Compile the core and the simulator with mypyc (needs mypy and a C compiler; about
        1.5 minutes on 2 cores). Later imports use the build while its sources are unchanged;
        after an edit they run the sources again, with a warning, until the next compile."""
        import conductor
        from conductor import native, native_build

        if status:
            manifest = native.read_manifest()
            if manifest is None:
                typer.echo(f"no compiled build; running the sources ({conductor.NATIVE_MODE})")
                return
            stale = native.stale_modules(manifest)
            state = (
                f"stale: {len(stale)} changed since ({', '.join(stale[:5])})"
                if stale
                else "current"
            )
            typer.echo(
                f"compiled build of {len(manifest.sources)} modules (mypyc {manifest.mypyc}, "
                f"Python {manifest.python}): {state}; this process runs {conductor.NATIVE_MODE}"
            )
            return
        if remove:
            removed = native_build.remove()
            typer.echo(f"removed {len(removed)} compiled files" if removed else "no compiled build")
            return
        t0 = time.perf_counter()
        try:
            manifest = native_build.build(opt_level=opt_level)
        except native_build.BuildError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        typer.echo(
            f"compiled {len(manifest.sources)} modules with mypyc {manifest.mypyc} in "
            f"{time.perf_counter() - t0:.0f} s into {native.PACKAGE_DIR} "
            f"({len(manifest.files)} files); `conductor compile --remove` deletes them"
        )
