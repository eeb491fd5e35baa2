from __future__ import annotations

import pytest

from conductor.core.costmodel import (
    LLAMA3_70B,
    PRESETS,
    LinearDecode,
    PolynomialPrefill,
    preset,
)
from conductor.core.errors import InvalidInput


def test_mooncake_eq1_flops() -> None:
    # l (a n^2 d + b n d^2) with FAST Table 1: l=80, d=8192, a=4, b=22
    n = 8192
    assert LLAMA3_70B.flops(n) == 80 * (4 * n * n * 8192 + 22 * n * 8192 * 8192)
    assert LLAMA3_70B.kv_bytes_per_token == 327_680  # 320 KB, FAST §5.3.1


def test_roofline_prefill_reuse_saves_prefix_flops() -> None:
    c = preset("llama3-70b-a800x8")
    full = c.prefill_s(8192, 0)
    half = c.prefill_s(8192, 4096)
    m = LLAMA3_70B
    g = 8 * 312e12 * 0.5
    assert full == pytest.approx(0.02 + m.flops(8192) / g)
    assert half == pytest.approx(0.02 + (m.flops(8192) - m.flops(4096)) / g)
    # everything cached still computes the last token
    assert c.prefill_s(8192, 8192) == c.prefill_s(8192, 8191)


def test_polynomial_fit_recovers_coefficients() -> None:
    truth = PolynomialPrefill(0.02, 8e-5, 3e-6, 7e-10)
    samples = [
        (n, p, truth.time_s(n, p))
        for n in (512, 1024, 4096, 8192, 16384, 65536)
        for p in (0, 256, n // 2)
    ]
    fit = PolynomialPrefill.fit(samples)
    assert fit.c0 == pytest.approx(truth.c0, rel=1e-6)
    assert fit.c1 == pytest.approx(truth.c1, rel=1e-6)
    assert fit.c2 == pytest.approx(truth.c2, rel=1e-6)
    assert fit.c3 == pytest.approx(truth.c3, rel=1e-6)


def test_decode_fit_recovers_coefficients() -> None:
    truth = LinearDecode(0.044, 0.00035, 3.3e-8)
    samples = [
        (b, ctx, truth.step_s(b, ctx)) for b in (1, 8, 32, 64) for ctx in (1000, 10**5, 10**6)
    ]
    fit = LinearDecode.fit(samples)
    assert (fit.c0, fit.c1, fit.c2) == pytest.approx((truth.c0, truth.c1, truth.c2), rel=1e-6)


def test_transfer_time() -> None:
    c = preset("llama3-70b-a800x8")
    assert c.transfer_s(0) == 0.0
    assert c.transfer_s(8192) == pytest.approx(0.001 + 8192 * 327_680 / 87e9)
    assert c.transfer_s(1000, 1e9) == pytest.approx(0.001 + 1000 * 327_680 / 1e9)


def test_presets_and_errors() -> None:
    assert {"llama3-70b-a800x8", "llama3-8b-h100", "llama3-70b-h200x8"} <= set(PRESETS)
    assert all(p.source for p in PRESETS.values())
    with pytest.raises(InvalidInput, match="preset='nope'"):
        preset("nope")
    with pytest.raises(InvalidInput, match="prompt_tokens=0"):
        preset("llama3-8b-h100").prefill_s(0, 0)
    with pytest.raises(InvalidInput, match="cached_tokens=-1"):
        preset("llama3-8b-h100").prefill_s(10, -1)
    with pytest.raises(InvalidInput, match="samples=2"):
        PolynomialPrefill.fit([(1, 0, 1.0), (2, 0, 2.0)])
