"""Deterministic discrete-event simulator of a P/D-disaggregated cluster.

It drives the real :class:`conductor.core.scheduler.Scheduler` (the same code the gateway
uses) with arrivals from a trace, executes its plans on simulated prefill instances (FCFS,
LRU KV caches, network fetches), decode instances (continuous batching at iteration
granularity) and reports per-request TTFT / TBT and the cluster-level metrics.
"""

from conductor.sim.config import SimConfig
from conductor.sim.simulator import SimResult, max_tokens_outputs, simulate

__all__ = ["SimConfig", "SimResult", "max_tokens_outputs", "simulate"]
