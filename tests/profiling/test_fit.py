"""The profile's arithmetic: non-negative fits recover exact models, decode windows, plans."""

from __future__ import annotations

import pytest

from conductor.core.errors import InvalidInput
from conductor.profiling.config import ProfileConfig
from conductor.profiling.fit import (
    fit,
    fit_decode,
    fit_prefill,
    measured_table,
    nonnegative_lstsq,
    rms,
)
from conductor.profiling.measure import (
    DecodeSample,
    Measurements,
    PrefillSample,
    ProfileError,
    cached_prefix,
    decode_gaps,
    planned_steps,
)
from conductor.web.sse_client import StreamResult


def _prefill(n: int, p: int, t: float) -> PrefillSample:
    return PrefillSample("new" if p == 0 else "cached", n, p, t, (t,))


def test_exact_samples_give_back_the_model() -> None:
    def t(n: int, p: int) -> float:
        m = n - p
        return 0.01 + 2e-5 * m + 1e-6 * n + 3e-9 * m * n

    points = [(32, 0), (256, 0), (256, 128), (1024, 0), (1024, 512), (1024, 896), (2048, 0)]
    got = fit_prefill([_prefill(n, p, t(n, p)) for n, p in points])
    assert got.c0 == pytest.approx(0.01, rel=1e-9)
    assert got.c1 == pytest.approx(2e-5, rel=1e-9)
    assert got.c2 == pytest.approx(1e-6, rel=1e-9)
    assert got.c3 == pytest.approx(3e-9, rel=1e-9)
    dec = fit_decode(
        [
            DecodeSample(b, c, b * c, 0.004 + 1e-4 * b + 2e-8 * b * c, 3)
            for b in (1, 4)
            for c in (64, 512)
        ]
    )
    assert (dec.c0, dec.c1, dec.c2) == pytest.approx((0.004, 1e-4, 2e-8), rel=1e-9)


def test_noisy_samples_never_get_negative_terms() -> None:
    # Falls with length: the unconstrained least squares would give a negative slope.
    c = nonnegative_lstsq([(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)], [3.0, 2.0, 1.0])
    assert c[1] == 0.0 and c[0] > 0
    with pytest.raises(ProfileError, match="must be > 0"):
        nonnegative_lstsq([(1.0,), (1.0,)], [1.0, 0.0])


def test_fit_needs_enough_samples_and_reports_residuals() -> None:
    pre = tuple(_prefill(n, 0, 0.01 + n * 1e-5) for n in (32, 64, 128, 256))
    dec = tuple(DecodeSample(b, 1, b, 0.004 + b * 1e-4, 1) for b in (1, 2, 4))
    f = fit(Measurements(pre, dec, 10, True))
    assert [r.what for r in f.prefill_residuals][:2] == ["prefill 32 new", "prefill 64 new"]
    assert rms(f.prefill_residuals) == pytest.approx(0.0, abs=1e-9)
    table = measured_table(
        Measurements(pre, dec, 10, True), f, at="now", url="u", served_model="m", extra={}
    )
    assert table["prefill_samples"][0] == [32, 0, 0.01032]
    assert table["cached_tokens_from"] == "engine usage"
    with pytest.raises(ProfileError, match="3 prefill and 3 decode samples; need 4 and 3"):
        fit(Measurements(pre[:3], dec, 10, True))


def _stream(times: list[float], counts: list[int] | None = None) -> StreamResult:
    return StreamResult(sent_s=0.0, status=200, token_times_s=times, token_counts=counts or [])


def test_decode_gaps_use_only_the_window_where_all_streams_decode() -> None:
    a = _stream([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    b = _stream([3.0, 3.5, 4.0, 4.5, 5.0])
    # window [3, 5]: a has 3 events (2 tokens in 2 s), b 5 events (4 tokens in 2 s)
    assert decode_gaps([a, b]) == [1.0, 0.5]
    # coalesced events reporting their token counts
    c = _stream([1.0, 1.0, 2.0], counts=[1, 3, 5])
    assert decode_gaps([c]) == [0.25]
    assert decode_gaps([_stream([1.0, 2.0]), _stream([3.0, 4.0])]) == []


def test_cached_prefix_is_whole_blocks_and_leaves_a_token() -> None:
    assert cached_prefix(128, 0.5, 32) == 64
    assert cached_prefix(128, 0.9, 32) == 96
    assert cached_prefix(64, 0.99, 32) == 32
    assert cached_prefix(32, 0.5, 32) == 0


def test_plan_and_its_checks() -> None:
    cfg = ProfileConfig(url="http://x", prefill_lengths=(32, 64), repeats=2, warmup=1)
    assert planned_steps(cfg) == 1 + 2 * 2 * 3 + 4 * 3
    for kwargs, message in [
        ({"url": "ftp://x"}, "invalid url='ftp://x': must be an http:// URL"),
        ({"prefill_lengths": (32, 32)}, "need 2 distinct lengths"),
        ({"cached_fractions": (1.0,)}, "invalid cached_fractions=1.0: must be in (0, 1)"),
        ({"batch_sizes": (1,), "decode_contexts": (8, 9)}, "need 3 decode points"),
        ({"repeats": 0}, "invalid repeats=0: must be >= 1"),
        ({"transfer_bytes_per_s": 0.0}, "invalid transfer_bytes_per_s=0.0: must be > 0"),
    ]:
        with pytest.raises(InvalidInput) as info:
            ProfileConfig(**{"url": "http://x", **kwargs})  # type: ignore[arg-type]
        assert message in str(info.value)
