"""Scheduling policies, one module each, chosen by name from the registry."""

from conductor.core.policies import (  # noqa: F401  (imports register the policies)
    cache_aware_local,
    conductor_policy,
    dynamo,
    least_loaded,
    llmd,
    lmetric,
    mooncake,
    preble,
    random_policy,
    round_robin,
    sglang,
    weighted,
)
from conductor.core.policies.base import (
    DecodeChoice,
    DecodePolicy,
    PrefillChoice,
    PrefillPolicy,
    SchedulingContext,
)
from conductor.core.policies.registry import (
    DEFAULT_POLICY,
    check_policy,
    make_policy,
    policy_config_defaults,
    policy_names,
    register,
)

__all__ = [
    "DEFAULT_POLICY",
    "DecodeChoice",
    "DecodePolicy",
    "PrefillChoice",
    "PrefillPolicy",
    "SchedulingContext",
    "check_policy",
    "make_policy",
    "policy_config_defaults",
    "policy_names",
    "register",
]
