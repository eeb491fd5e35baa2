"""Workloads: trace reading and writing, synthetic workload generation, trace analysis."""
