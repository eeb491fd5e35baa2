"""Compiled (mypyc) builds of the hot modules, and the guard that keeps them honest.

``conductor compile`` (:mod:`conductor.native_build`) compiles the core and the simulator
with mypyc into C extensions beside their sources (the simulator runs about 1.5x faster,
a decision about as much) and writes a manifest of the sources it compiled. Python prefers
an extension to a ``.py`` of the same name, so an extension older than its source would
run stale code: at ``import conductor`` :func:`guard` hashes the compiled modules'
sources, and when one differs from the manifest (or ``CONDUCTOR_PURE=1`` is set, or
extensions lie there without a manifest) every compiled module is imported from its source
instead, with a warning naming the module. Without a build (the default install) it only
lists the three compiled directories. The frozen dataclasses of a build are registered for
pickling as they load (:func:`register_frozen`).
"""

from __future__ import annotations

import copyreg
import dataclasses
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent
MANIFEST = "native.json"
"""The manifest's file name, in the package directory."""
PURE_ENV = "CONDUCTOR_PURE"
"""Set to 1 to import every module from source even where a current build exists."""

COMPILED_GLOBS = ("sim/*.py", "core/*.py", "core/policies/*.py")
"""What ``conductor compile`` compiles (relative to the package), less ``SKIPPED``."""
SKIPPED = frozenset(
    {
        # exceptions subclassing builtins (mypyc: "inheriting from most builtin types")
        "core/errors.py",
        # the config validators: compiled, an int passed as a ``float`` comes back a float
        # (messages would read "0.0"); they run once per config
        "core/checks.py",
        # mypyc 2.4 fails (an internal error) on a closure in a method of these peers'
        # registered classes; they are baselines, not on conductor's path
        "core/policies/least_loaded.py",
        "core/policies/lmetric.py",
        "core/policies/preble.py",
        "core/policies/sglang.py",
    }
)

log = logging.getLogger("conductor")


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What one ``conductor compile`` built: each module's source hash, and the files it
    installed (relative to the directory holding the package). Standard library only: the
    package is imported by tools that run without its dependencies."""

    mypyc: str
    python: str
    sources: dict[str, str]
    files: list[str]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw = json.loads(text)
        m = cls(str(raw["mypyc"]), str(raw["python"]), dict(raw["sources"]), list(raw["files"]))
        if not all(isinstance(v, str) for v in (*m.sources, *m.sources.values(), *m.files)):
            raise ValueError("sources and files must be strings")
        return m


def compiled_sources(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """The sources ``conductor compile`` compiles, sorted."""
    out = {
        p
        for g in COMPILED_GLOBS
        for p in package_dir.glob(g)
        if p.name != "__init__.py" and p.relative_to(package_dir).as_posix() not in SKIPPED
    }
    return sorted(out)


def module_name(source: Path, package_dir: Path = PACKAGE_DIR) -> str:
    rel = source.relative_to(package_dir.parent).with_suffix("")
    return ".".join(rel.parts)


def source_hash(source: Path) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def read_manifest(package_dir: Path = PACKAGE_DIR) -> Manifest | None:
    path = package_dir / MANIFEST
    if not path.is_file():
        return None
    return Manifest.from_json(path.read_text())


def extension_files(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """The extension modules beside a source in the compiled directories (a build's, or
    one left by a build whose manifest is gone)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    out = []
    for pattern in COMPILED_GLOBS:
        folder = package_dir / pattern.rpartition("/")[0]
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            stem = entry.name.split(".", 1)[0]
            if entry.name.endswith(suffixes) and (folder / f"{stem}.py").is_file():
                out.append(folder / entry.name)
    return sorted(out)


def _extensions(package_dir: Path) -> list[str]:
    """The modules :func:`extension_files` names."""
    return sorted(
        module_name(f.with_name(f.name.split(".", 1)[0] + ".py"), package_dir)
        for f in extension_files(package_dir)
    )


def stale_modules(manifest: Manifest, package_dir: Path = PACKAGE_DIR) -> list[str]:
    """The compiled modules whose source is not the one compiled (or is gone)."""
    out = []
    for name, digest in manifest.sources.items():
        source = package_dir.parent.joinpath(*name.split(".")).with_suffix(".py")
        if not source.is_file() or source_hash(source) != digest:
            out.append(name)
    return out


class SourceFirst(importlib.abc.MetaPathFinder):
    """Imports the named modules from their ``.py`` even where an extension is beside it."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        leaf = fullname.rpartition(".")[2] + ".py"
        for entry in path or ():
            source = Path(entry) / leaf
            if source.is_file():
                return importlib.util.spec_from_file_location(fullname, source)
        return None


def _rebuild(cls: Any, items: tuple[tuple[str, object], ...]) -> object:
    obj = cls.__new__(cls)
    for name, value in items:
        object.__setattr__(obj, name, value)
    return obj


def _reduce_frozen(obj: Any) -> Any:
    items = tuple((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return (_rebuild, (type(obj), items))


def register_frozen(module: ModuleType) -> None:
    """Make ``module``'s frozen dataclasses picklable and copyable when compiled: pickle
    restores a compiled class's attributes one ``setattr`` at a time, which a frozen
    dataclass refuses (``serve --workers`` sends its configuration to the workers so)."""
    for obj in list(vars(module).values()):
        if (
            isinstance(obj, type)
            and obj.__module__ == module.__name__
            and dataclasses.is_dataclass(obj)
            and obj.__dataclass_params__.frozen  # type: ignore[attr-defined]
            and obj not in copyreg.dispatch_table
        ):
            copyreg.pickle(obj, _reduce_frozen)


class _Registering(importlib.abc.Loader):
    """Loads a compiled module with ``inner``, then has ``finder`` register what loaded."""

    def __init__(self, inner: importlib.abc.Loader, finder: CompiledFirst) -> None:
        self.inner = inner
        self.finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.finder.sweep()


class CompiledFirst(importlib.abc.MetaPathFinder):
    """Finds the named (compiled) modules as usual and, once one has loaded, runs
    :func:`register_frozen` on every compiled module loaded by then: a compiled module
    loads the others of its build directly, not through this finder."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def sweep(self) -> None:
        # every time, whole: a module may have been half-initialised at the last sweep
        for name in self.names:
            module = sys.modules.get(name)
            if module is not None:
                register_frozen(module)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Registering(spec.loader, self)
        return spec


def _some(names: list[str]) -> str:
    """The first three ``names`` for a warning, and how many more."""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


def guard(package_dir: Path = PACKAGE_DIR) -> str:
    """Decide, at ``import conductor``, whether the compiled modules are used; returns
    ``"pure"`` (no build), ``"compiled"``, ``"stale"`` or ``"forced-pure"``."""
    try:
        manifest = read_manifest(package_dir)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning(
            "conductor: running every module from source (unreadable %s: %s)", MANIFEST, exc
        )
        names = frozenset(module_name(p, package_dir) for p in compiled_sources(package_dir))
        sys.meta_path.insert(0, SourceFirst(names))
        return "stale"
    if manifest is None:
        orphans = _extensions(package_dir)
        if not orphans:
            return "pure"
        sys.meta_path.insert(0, SourceFirst(frozenset(orphans)))
        log.warning(
            "conductor: extension modules without a %s (%s); running their sources "
            "(`conductor compile` rebuilds)",
            MANIFEST,
            _some(orphans),
        )
        return "stale"
    names = frozenset(manifest.sources)
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        sys.meta_path.insert(0, SourceFirst(names))
        return "forced-pure"
    stale = stale_modules(manifest, package_dir)
    if not stale:
        sys.meta_path.insert(0, CompiledFirst(names))
        return "compiled"
    sys.meta_path.insert(0, SourceFirst(names))
    log.warning(
        "conductor: the compiled build is older than its sources (%s changed); running "
        "every module from source (`conductor compile` rebuilds, `--remove` deletes it)",
        _some(stale),
    )
    return "stale"
