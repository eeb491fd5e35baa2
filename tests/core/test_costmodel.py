from __future__ import annotations

import pytest

from conductor.core.costmodel import (
    LLAMA3_70B,
    PRESETS,
    SPLITWISE_A100_TP8_DECODE,
    SPLITWISE_A100_TP8_PREFILL,
    LinearDecode,
    PolynomialPrefill,
    RooflinePrefill,
    preset,
)
from conductor.core.errors import InvalidInput
from conductor.core.shapes import A800X8, mooncake_eq1_flops


def test_exact_flops_of_llama3_70b() -> None:
    m = LLAMA3_70B
    # 80 x (Q, O: 8192x8192; K, V: 8192x1024 (8 KV heads); gate/up/down: 8192x28672)
    assert m.linear_params == 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672)
    assert m.linear_params == 68_451_041_280
    lm_head = 2 * 8192 * 128_256
    assert m.linear_flops(1000) == 2 * m.linear_params * 1000 + lm_head
    # causal: token i attends to i + 1 keys; QK^T and AV cost 2 * 64 * 128 FLOPs a key each
    n, p = 8192, 4096
    keys = sum(i + 1 for i in range(p, n))
    assert m.attention_flops(n, p) == 80 * 4 * 64 * 128 * keys
    assert m.prefill_flops(n, p) == m.linear_flops(n - p) + m.attention_flops(n, p)
    assert m.kv_bytes_per_token == 327_680  # 320 KB, FAST §5.3.1


def test_mooncake_eq1_counts_the_attention_square_and_fewer_linear_flops() -> None:
    m = LLAMA3_70B
    n = 8192
    assert mooncake_eq1_flops(m, n) == 80 * (4 * n * n * 8192 + 22 * n * 8192 * 8192)
    eq1_attention = 80 * 4 * n * n * 8192
    assert eq1_attention / m.attention_flops(n, 0) == pytest.approx(2.0, rel=1e-3)
    eq1_linear = 80 * 22 * 8192 * 8192
    assert 2 * m.linear_params / eq1_linear == pytest.approx(1.159, abs=1e-3)


def test_roofline_prefill_reuse_saves_prefix_flops() -> None:
    c = preset("llama3-70b-a800x8")
    assert isinstance(c.prefill, RooflinePrefill)
    mfu, overhead = c.prefill.mfu, c.prefill.overhead_s
    m = LLAMA3_70B
    g = 8 * 312e12 * mfu
    assert c.prefill_s(8192, 0) == pytest.approx(overhead + m.prefill_flops(8192, 0) / g)
    assert c.prefill_s(8192, 4096) == pytest.approx(overhead + m.prefill_flops(8192, 4096) / g)
    # everything cached still computes the last token
    assert c.prefill_s(8192, 8192) == c.prefill_s(8192, 8191)


def test_a800_preset_is_the_fit_to_splitwise_a100_profile() -> None:
    c = preset("llama3-70b-a800x8")
    assert isinstance(c.prefill, RooflinePrefill)
    assert c.prefill.mfu == pytest.approx(0.3747, abs=1e-4)
    assert c.prefill.overhead_s == pytest.approx(0.0111, abs=1e-4)
    # residuals quoted in conductor.core.costmodel: -7%, +5%, +16%, -4%, -16%
    errors = [c.prefill_s(n, 0) / t - 1 for n, t in SPLITWISE_A100_TP8_PREFILL]
    assert [round(e, 2) for e in errors] == [-0.07, 0.05, 0.16, -0.04, -0.16]
    steps = [c.decode_step_s(b, ctx) / t - 1 for b, ctx, t in SPLITWISE_A100_TP8_DECODE]
    assert [round(e, 2) for e in steps] == [-0.03, -0.01, 0.07, -0.02]
    assert preset("llama3-70b-a100x8").prefill_s(8192, 0) == c.prefill_s(8192, 0)


def test_roofline_fit_recovers_overhead_and_mfu() -> None:
    truth = RooflinePrefill(LLAMA3_70B, A800X8, mfu=0.42, overhead_s=0.02)
    fit = RooflinePrefill.fit(
        LLAMA3_70B, A800X8, [(n, truth.time_s(n, 0)) for n in (512, 2048, 8192, 32768)]
    )
    assert (fit.mfu, fit.overhead_s) == pytest.approx((0.42, 0.02), rel=1e-9)
    with pytest.raises(InvalidInput, match="samples=1"):
        RooflinePrefill.fit(LLAMA3_70B, A800X8, [(512, 0.1)])


def test_prefill_mfu_knob() -> None:
    c = preset("llama3-70b-a800x8")
    slow = c.with_prefill_mfu(0.35)
    assert slow.name == "llama3-70b-a800x8@mfu0.35"
    assert slow.decode_step_s(8, 8000) == c.decode_step_s(8, 8000)
    assert (
        slow.prefill_s(8192, 0) > c.prefill_s(8192, 0) > c.with_prefill_mfu(0.5).prefill_s(8192, 0)
    )
    with pytest.raises(InvalidInput, match="prefill_mfu=0"):
        c.with_prefill_mfu(0.0)
    with pytest.raises(InvalidInput, match=r"prefill_mfu=0\.4"):
        c.with_(prefill=PolynomialPrefill(0.01, 1e-5, 0.0, 0.0)).with_prefill_mfu(0.4)


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
