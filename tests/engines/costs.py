"""The tiny model's cost files (there is no hand-typed preset for it):

* :data:`COMMITTED` (``tests/engines/tiny-cpu.cost.toml``): written by ``conductor profile``
  against a real vLLM CPU engine serving ``.tiny-model`` on this project's 2-core machine
  (``tests/engines/profile_tiny_model.py``); the deterministic tests that need exact timings
  use it, so their expectations do not move when CI's machine is faster or slower.
* :data:`PROFILED` (``.tiny-model/cost.toml``): written by ``make cost-file`` (run by ``make
  test``) on the machine the tests run on; the real-engine tests use it when it is there.
"""

from __future__ import annotations

from pathlib import Path

from conductor.core.cost_file import parse_cost_file
from conductor.core.costmodel import CostModel
from tests.engines.fixtures import TINY_MODEL

COMMITTED = Path(__file__).with_name("tiny-cpu.cost.toml")
PROFILED = TINY_MODEL / "cost.toml"


def committed_cost() -> CostModel:
    return parse_cost_file(COMMITTED.read_text()).cost


def profiled_cost_file() -> Path:
    """The cost file profiled here if ``make cost-file`` ran, else the committed one."""
    return PROFILED if PROFILED.exists() else COMMITTED


def profiled_cost() -> CostModel:
    return parse_cost_file(profiled_cost_file().read_text()).cost
