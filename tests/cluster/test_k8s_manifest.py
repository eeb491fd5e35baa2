"""docs/k8s/conductor-cluster.yaml is valid Kubernetes (offline schemas, strict: unknown
fields fail), and it runs the replicas the way docs/cluster.md says."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from conductor.cli.serve_config import KEYS

MANIFEST = Path(__file__).resolve().parents[2] / "docs" / "k8s" / "conductor-cluster.yaml"
K8S_VERSION = "1.30.0"


def docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


@pytest.mark.parametrize("index", range(5))
def test_every_resource_validates(index: int) -> None:
    doc = docs()[index]
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_replicas_sync_over_the_nats_service() -> None:
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs()}
    assert len(by_kind) == 5
    toml = tomllib.loads(by_kind["ConfigMap", "conductor-config"]["data"]["conductor.toml"])
    assert set(toml["gateway"]) <= set(KEYS)
    assert toml["gateway"]["cluster"] == "nats://conductor-nats:4222"
    nats_port = by_kind["Service", "conductor-nats"]["spec"]["ports"][0]["port"]
    assert toml["gateway"]["cluster"].endswith(f":{nats_port}")
    gw = by_kind["Deployment", "conductor"]["spec"]
    assert gw["replicas"] == 3
    [c] = gw["template"]["spec"]["containers"]
    argv = c["command"] + c["args"]
    assert argv[:2] == ["conductor", "serve"] and "--replica-id" in argv
    assert shlex.join(argv).count("$(POD_NAME)") == 1
    assert c["ports"][0]["containerPort"] == toml["gateway"]["port"]
