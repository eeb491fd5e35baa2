"""The /metrics line scan reads vLLM's three load gauges exactly as a full Prometheus
parser would."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conductor.gateway.engines.kind import ReportedLoad
from conductor.gateway.engines.vllm import parse_vllm_metrics

PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a } b"} 4.0 1700000000000
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_count{model_name="m"} 12.0
vllm:num_requests_running_total 99
process_cpu_seconds_total 1.5
"""


def reference(text: str) -> ReportedLoad:
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
    values: dict[str, list[float]] = {n: [] for n in names}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in values:
                values[sample.name].append(float(sample.value))
    usage = values[names[2]]
    return ReportedLoad(
        round(sum(values[names[0]])),
        round(sum(values[names[1]])),
        sum(usage) / len(usage) if usage else 0.0,
    )


def test_gauges_are_summed_like_a_full_parser_does() -> None:
    assert parse_vllm_metrics(PAGE) == ReportedLoad(5, 4, 0.5)
    assert parse_vllm_metrics(PAGE) == reference(PAGE)


def test_missing_gauges_count_as_zero() -> None:
    assert parse_vllm_metrics("# nothing here\nother_metric 1\n") == ReportedLoad(0, 0, 0.0)
    assert parse_vllm_metrics("vllm:num_requests_running 7\n") == ReportedLoad(7, 0, 0.0)


@pytest.mark.parametrize(
    "text",
    ["<html><body>Not Found</body></html>", 'vllm:num_requests_running{engine="0"}\n'],
)
def test_not_prometheus_text_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_vllm_metrics(text)
