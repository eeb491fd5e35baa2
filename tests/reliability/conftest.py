"""The reliability suite (``pytest -m reliability``; ``make test`` runs it with the rest):
the gateway as separate processes in front of emulated engines, attacked with hostile HTTP,
fuzzed bodies and KV payloads, chaos and overload. Every test here is marked
``reliability`` and bounded in time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.cluster import Cluster, cluster, make_model_dir


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.reliability)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("reliability") / "model")


@pytest.fixture(scope="session")
def gateway_cluster(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("logs"), model_dir) as c:
        yield c
