"""The pure decision core: no asyncio, sockets, files, environment reads or wall clock.

Everything here takes ``now`` as an argument and returns decisions and events as data.
"""

from conductor.core.errors import ConductorError, InvalidInput, UnknownInstance, UnknownPolicy
from conductor.core.types import BlockHash, InstanceId, RequestId, Role, Tier

__all__ = [
    "BlockHash",
    "ConductorError",
    "InstanceId",
    "InvalidInput",
    "RequestId",
    "Role",
    "Tier",
    "UnknownInstance",
    "UnknownPolicy",
]
