"""The mypyc build (``conductor compile``, :mod:`conductor.native`): the compiled modules give
the same results as the sources, a stale build falls back to the sources, ``--remove`` leaves
nothing behind. The build runs on a copy of the package (about 1.5 minutes on 2 cores)."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

import conductor
from conductor import native, native_build

SRC = Path(conductor.__file__).resolve().parent

COMPARE = [
    "compare",
    "--trace",
    "{trace}",
    "--policies",
    "conductor,mooncake,dynamo,sglang,weighted",
    "--admission",
    "early",
    "--no-bundle",
    "--prefill",
    "4",
    "--decode",
    "4",
    "--cost-error",
    "0.2",
    "--json",
    "{out}",
]


def _run(root: Path, args: list[str], pure: bool) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(root), **{native.PURE_ENV: "1" if pure else "0"})
    return subprocess.run(
        [sys.executable, "-c", "from conductor.cli.main import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _mode(root: Path, pure: bool) -> tuple[str, str]:
    env = dict(os.environ, PYTHONPATH=str(root), **{native.PURE_ENV: "1" if pure else "0"})
    code = (
        "import conductor, conductor.core.scheduler as s; print(conductor.NATIVE_MODE, s.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    mode, path = out.stdout.split()
    return mode, path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A copy of the package, compiled."""
    try:
        native_build.mypyc_version()
    except native_build.BuildError as exc:
        pytest.skip(str(exc))
    if not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler (cc, gcc or clang) for mypyc")
    root = tmp_path_factory.mktemp("native")
    shutil.copytree(SRC, root / "conductor", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (root / "conductor" / native.MANIFEST).unlink(missing_ok=True)
    native_build.build(root / "conductor")
    yield root


def test_the_compiled_build_gives_the_sources_results(built: Path, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    synth = ["trace", "synth", "--kind", "mixed", "--requests", "400", "--rate", "6"]
    done = _run(built, [*synth, "--seed", "3", "--out", str(trace)], pure=True)
    assert done.returncode == 0, done.stderr
    results = {}
    for pure in (True, False):
        out = tmp_path / f"{pure}.json"
        args = [a.format(trace=trace, out=out) for a in COMPARE]
        done = _run(built, args, pure=pure)
        assert done.returncode == 0, done.stderr
        rows = json.loads(out.read_text())
        for row in rows:
            assert row.pop("sim_wall_s") > 0  # the one field that may differ
        results[pure] = rows
    assert _mode(built, pure=False)[0] == "compiled"
    assert _mode(built, pure=False)[1].endswith(".so")
    assert _mode(built, pure=True) == ("forced-pure", str(built / "conductor/core/scheduler.py"))
    assert results[False] == results[True]


PICKLE = """
import copy, pickle
import conductor
from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import CostModel
from conductor.sim import SimConfig
assert conductor.NATIVE_MODE == "compiled", conductor.NATIVE_MODE
objs = [SchedulerConfig(block_size_tokens=32), SimConfig(policy="mooncake", n_prefill=3)]
objs.append(objs[1].cost)
assert type(objs[2]) is CostModel
for o in objs:
    assert pickle.loads(pickle.dumps(o)) == o and copy.deepcopy(o) == o, o
print("ok")
"""


def test_compiled_frozen_configs_pickle_and_copy(built: Path) -> None:
    """``serve --workers`` sends its configuration to the workers by pickle; a compiled
    frozen dataclass needs :func:`conductor.native.register_frozen` for that."""
    env = dict(os.environ, PYTHONPATH=str(built), **{native.PURE_ENV: "0"})
    out = subprocess.run(
        [sys.executable, "-c", PICKLE], env=env, capture_output=True, text=True, check=False
    )
    assert (out.returncode, out.stdout) == (0, "ok\n"), out.stderr


def test_a_stale_build_runs_the_sources_and_remove_deletes_it(built: Path) -> None:
    manifest = native.read_manifest(built / "conductor")
    assert manifest is not None
    assert {f.endswith(".so") for f in manifest.files} == {True}
    assert "conductor.sim.engine" in manifest.sources
    assert "conductor.core.errors" not in manifest.sources
    status = _run(built, ["compile", "--status"], pure=False)
    assert status.stdout.endswith(": current; this process runs compiled\n"), status.stdout
    engine = built / "conductor/sim/engine.py"
    engine.write_text(engine.read_text() + "\n# edited\n")
    status = _run(built, ["compile", "--status"], pure=False)
    assert ": stale: 1 changed since (conductor.sim.engine); this process runs stale" in (
        status.stdout
    )
    env = dict(os.environ, PYTHONPATH=str(built), **{native.PURE_ENV: "0"})
    code = "import conductor, conductor.sim.engine as e; print(conductor.NATIVE_MODE, e.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["stale", str(engine)]
    assert "(conductor.sim.engine changed)" in out.stderr
    removed = native_build.remove(built / "conductor")
    assert sorted(removed) == sorted(manifest.files)
    assert not list(built.rglob("*.so"))
    assert not (built / "conductor" / native.MANIFEST).exists()
    assert _mode(built, pure=False) == ("pure", str(built / "conductor/core/scheduler.py"))
    status = _run(built, ["compile", "--status"], pure=False)
    assert status.stdout == "no compiled build; running the sources (pure)\n"


# -- the guard, without a compiler ------------------------------------------------------------


@pytest.fixture
def fake_pkg(tmp_path: Path) -> Iterator[Path]:
    """A package ``fakepkg`` whose ``core/mod`` has a source and an unloadable extension."""
    pkg = tmp_path / "fakepkg"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "mod.py").write_text("WHERE = 'source'\n")
    ext = importlib.machinery.EXTENSION_SUFFIXES[0]
    (pkg / "core" / f"mod{ext}").write_bytes(b"not an extension")
    meta = list(sys.meta_path)
    sys.path.insert(0, str(tmp_path))
    yield pkg
    sys.path.remove(str(tmp_path))
    sys.meta_path[:] = meta
    for name in [n for n in sys.modules if n.startswith("fakepkg")]:
        del sys.modules[name]


def _manifest(pkg: Path, digest: str) -> None:
    m = native.Manifest("x", "3", {"fakepkg.core.mod": digest}, ["fakepkg/core/mod.so"])
    (pkg / native.MANIFEST).write_text(m.to_json())


def test_guard_without_a_manifest_or_extensions_does_nothing(fake_pkg: Path) -> None:
    for ext in (fake_pkg / "core").glob("mod.*"):
        if ext.suffix != ".py":
            ext.unlink()
    meta = list(sys.meta_path)
    assert native.guard(fake_pkg) == "pure"
    assert sys.meta_path == meta


def test_guard_with_extensions_but_no_manifest_imports_the_sources(
    fake_pkg: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="conductor"):
        assert native.guard(fake_pkg) == "stale"
    assert "extension modules without a native.json (fakepkg.core.mod)" in caplog.text
    assert importlib.import_module("fakepkg.core.mod").WHERE == "source"
    ext = importlib.machinery.EXTENSION_SUFFIXES[0]
    assert native_build.remove(fake_pkg) == [f"fakepkg/core/mod{ext}"]
    assert sorted(p.name for p in (fake_pkg / "core").iterdir()) == ["__init__.py", "mod.py"]


def test_guard_with_a_current_manifest_keeps_the_build(
    fake_pkg: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    _manifest(fake_pkg, native.source_hash(fake_pkg / "core" / "mod.py"))
    meta = list(sys.meta_path)
    assert native.guard(fake_pkg) == "compiled"
    first = sys.meta_path[0]
    assert isinstance(first, native.CompiledFirst) and sys.meta_path[1:] == meta
    assert first.names == {"fakepkg.core.mod"}
    with pytest.raises(ImportError):  # the (fake) extension is what Python would load
        importlib.import_module("fakepkg.core.mod")


def test_guard_with_a_stale_manifest_imports_the_source(
    fake_pkg: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    _manifest(fake_pkg, "0" * 16)
    with caplog.at_level(logging.WARNING, logger="conductor"):
        assert native.guard(fake_pkg) == "stale"
    assert "(fakepkg.core.mod changed)" in caplog.text
    assert importlib.import_module("fakepkg.core.mod").WHERE == "source"


def test_guard_forced_pure(fake_pkg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.PURE_ENV, "1")
    _manifest(fake_pkg, native.source_hash(fake_pkg / "core" / "mod.py"))
    assert native.guard(fake_pkg) == "forced-pure"
    assert importlib.import_module("fakepkg.core.mod").WHERE == "source"


def test_guard_with_an_unreadable_manifest_imports_the_sources(
    fake_pkg: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (fake_pkg / native.MANIFEST).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="conductor"):
        assert native.guard(fake_pkg) == "stale"
    assert "unreadable native.json" in caplog.text
    assert importlib.import_module("fakepkg.core.mod").WHERE == "source"


def test_compile_without_mypy_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(native_build.metadata, "version", missing)
    with pytest.raises(native_build.BuildError, match=r"needs mypy .* pip install mypy"):
        native_build.build(SRC)


def test_import_conductor_needs_only_the_standard_library() -> None:
    """Tools run in other environments (the vLLM one) import ``conductor.*`` modules from
    the source tree: the package's ``__init__`` and the guard must import nothing else."""
    code = f"import sys; sys.path.insert(0, {str(SRC.parent)!r}); import conductor; print('ok')"
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=False
    )
    assert (out.returncode, out.stdout) == (0, "ok\n"), out.stderr
