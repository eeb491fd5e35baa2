"""bench/common_ttft.py: the common-set comparison on given figures."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench_module import load_bench


def _bench() -> ModuleType:
    return load_bench("common_ttft")


def test_the_common_set_leaves_out_what_only_one_policy_served() -> None:
    m = _bench()
    ours = {"a": 1.0, "b": 2.0, "c": 30.0}  # c: a slow request only conductor served
    theirs = {"a": 3.0, "b": 4.0, "d": 0.5}  # d: one only the peer served
    out = m.compare_sets(ours, theirs, "sglang")
    assert out == {
        "completed": {"conductor": 3, "sglang": 3, "both": 2},
        "mean_ttft_s": {"conductor": 11.0, "sglang": 2.5},
        "common_mean_ttft_s": {"conductor": 1.5, "sglang": 3.5},
        "common_p50_ttft_s": {"conductor": 1.5, "sglang": 3.5},
    }


def test_no_request_in_common_is_an_error() -> None:
    m = _bench()
    with pytest.raises(ValueError, match="no request in common"):
        m.compare_sets({"a": 1.0}, {"b": 1.0}, "llmd")
