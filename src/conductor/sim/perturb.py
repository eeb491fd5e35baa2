"""The simulated engines' own cost: the scheduler's nominal model, perturbed.

The scheduler predicts with ``SimConfig.cost``; the simulated engines take their time from an
:class:`EngineCost`, the one attribute (``engine_cost``) the prefill and decode sides read:

* ``bias`` B: every engine is ``1 + B`` times the nominal model (``0.3`` = 30% slower,
  ``-0.2`` = 20% faster);
* ``error`` sigma: each job is further multiplied by a lognormal factor
  ``exp(sigma z - sigma^2 / 2)``, ``z ~ N(0, 1)`` — **mean-preserving** (the factor's mean is 1,
  its median ``exp(-sigma^2 / 2)``), so on average an engine is exactly ``1 + B`` times the
  model and the bias is the only systematic error.

A job is one request: its factor is drawn from its request id and the seed (the same
request gets the same factor whatever else runs). A prefill takes its request's factor; a
decode iteration takes the mean factor of the requests in its batch (a request is as much
slower to decode as to prefill, and the iteration time moves only as requests join and
leave, as a real step time does, rather than jittering per iteration). KV transfers keep
their nominal time. With ``bias = error = 0`` the engines run the nominal model exactly.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from conductor.core.chunked_pipeline import pipelined_prefill_s
from conductor.core.costmodel import CostModel
from conductor.core.types import RequestId
from conductor.sim.config import SimConfig


class EngineCost:
    """The engines' timing (see the module docstring); stateless and deterministic."""

    def __init__(self, nominal: CostModel, *, bias: float, error: float, seed: int) -> None:
        self.nominal = nominal
        self.bias = bias
        self.error = error
        self.seed = seed
        self.scale = 1.0 + bias
        self.exact = bias == 0.0 and error == 0.0

    @classmethod
    def of(cls, cfg: SimConfig) -> EngineCost:
        return cls(cfg.cost, bias=cfg.cost_bias, error=cfg.cost_error, seed=cfg.seed)

    def job_factor(self, request_id: RequestId) -> float:
        """The request's own lognormal factor, ``exp(sigma z - sigma^2 / 2)`` (mean 1)."""
        s = self.error
        if s == 0:
            return 1.0
        z = random.Random(f"{self.seed}:job:{request_id}").gauss(0.0, 1.0)
        return math.exp(s * z - 0.5 * s * s)

    def prefill_s(self, request_id: RequestId, prompt_tokens: int, cached_tokens: int) -> float:
        t = self.nominal.prefill_s(prompt_tokens, cached_tokens)
        return t if self.exact else t * self.scale * self.job_factor(request_id)

    def pipelined_prefill_s(
        self,
        request_id: RequestId,
        prompt_tokens: int,
        cached_tokens: int,
        chunks: Sequence[int],
        stages: int,
        bytes_per_s: float,
    ) -> float:
        """A chunked-pipeline prefill's time: the nominal pipeline, scaled like one job."""
        t = pipelined_prefill_s(
            self.nominal, prompt_tokens, cached_tokens, chunks, stages, bytes_per_s
        )
        return t if self.exact else t * self.scale * self.job_factor(request_id)

    def decode_step_s(self, batch: int, context_tokens: int, factor_sum: float) -> float:
        """One iteration of ``batch`` requests whose job factors sum to ``factor_sum``."""
        t = self.nominal.decode.step_s(batch, context_tokens)
        return t if self.exact or batch <= 0 else t * self.scale * factor_sum / batch
