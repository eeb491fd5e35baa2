"""``conductor compile``: build the hot modules with mypyc, in place (see :mod:`conductor.native`).

The package is copied to a temporary directory, mypyc compiles the modules
:func:`~conductor.native.compiled_sources` lists there (so a failed build leaves the
installed package as it was), and the extensions are then copied beside their sources with
a manifest of the sources' hashes. ``remove`` deletes what the manifest lists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from conductor.native import (
    MANIFEST,
    PACKAGE_DIR,
    Manifest,
    compiled_sources,
    extension_files,
    module_name,
    read_manifest,
    source_hash,
)


class BuildError(RuntimeError):
    """mypyc is missing or its build failed; the message says which and why."""


def mypyc_version() -> str:
    try:
        return metadata.version("mypy")
    except metadata.PackageNotFoundError:
        raise BuildError(
            "conductor compile needs mypy (which ships mypyc) and a C compiler: pip install mypy"
        ) from None


def remove(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Delete the build the manifest lists (and the manifest), or without a manifest the
    extension modules beside the compiled sources; returns the files removed."""
    manifest = read_manifest(package_dir)
    if manifest is None:  # extensions a build left without its manifest, if any
        orphans = extension_files(package_dir)
        for path in orphans:
            path.unlink()
        return [p.relative_to(package_dir.parent).as_posix() for p in orphans]
    removed = []
    for rel in manifest.files:
        path = package_dir.parent / rel
        if path.exists():
            path.unlink()
            removed.append(rel)
    (package_dir / MANIFEST).unlink()
    return removed


def build(package_dir: Path = PACKAGE_DIR, opt_level: int = 3) -> Manifest:
    """Compile the hot modules of the package at ``package_dir`` in place."""
    version = mypyc_version()
    sources = compiled_sources(package_dir)
    with tempfile.TemporaryDirectory(prefix="conductor-compile-") as tmp:
        root = Path(tmp)
        shutil.copytree(
            package_dir,
            root / package_dir.name,
            ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", MANIFEST),
        )
        rel = [s.relative_to(package_dir.parent).as_posix() for s in sources]
        env = dict(os.environ, MYPYC_OPT_LEVEL=str(opt_level))
        proc = subprocess.run(
            [sys.executable, "-m", "mypyc", *rel],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            raise BuildError("mypyc failed:\n" + "\n".join(tail))
        built = sorted(
            p.relative_to(root).as_posix()
            for p in root.rglob("*")
            if p.suffix in (".so", ".pyd") and "build" not in p.relative_to(root).parts
        )
        if not built:
            raise BuildError("mypyc built no extension modules")
        digests = {
            module_name(s, package_dir): source_hash(root / r)
            for s, r in zip(sources, rel, strict=True)
        }
        remove(package_dir)
        for f in built:
            shutil.copy2(root / f, package_dir.parent / f)
    manifest = Manifest(
        mypyc=version,
        python=sys.version.split()[0],
        sources=digests,
        files=built,
    )
    (package_dir / MANIFEST).write_text(manifest.to_json())
    return manifest
