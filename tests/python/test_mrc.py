"""The online miss-ratio curve (``KVCacheManager(..., miss_ratio_curve=)``) against the real thing: the
hit rate the same workload gets from LRU managers of each size, replayed one by one."""

from __future__ import annotations

import numpy as np
import pytest

import kvcore
from kvcore import InvalidArgumentError, InvalidDTypeError, KVCacheManager, MissRatioCurve

PS = 16


def conversations(
    seed: int = 0, n: int = 500, public: bool = False
) -> list[tuple[list[int], str | None, list[int]]]:
    """Multi-turn chats over Zipf-popular system prompts, some tenants' (namespaces) and, with
    ``public``, system prompts declared public: ``(prompt, namespace, answer)`` per request, each
    turn's prompt the previous turn's context and answer plus a new message."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 30_000, int(rng.integers(40, 400))).tolist() for _ in range(20)]
    chats: list[dict] = []
    out = []
    for _ in range(n):
        if chats and rng.random() < 0.6:
            c = chats[int(rng.integers(0, len(chats)))]
        else:
            s = systems[min(int(rng.zipf(1.3)) - 1, len(systems) - 1)]
            ns = None if rng.random() < 0.6 else f"tenant{int(rng.integers(0, 3))}"
            c = {"ctx": list(s), "ns": ns}
            chats.append(c)
        c["ctx"] = c["ctx"] + rng.integers(0, 30_000, int(rng.integers(8, 120))).tolist()
        answer = rng.integers(0, 30_000, int(rng.integers(8, 80))).tolist()
        out.append((list(c["ctx"]), c["ns"], answer))
        c["ctx"] = c["ctx"] + answer
    if public:  # the two most popular system prompts are declared public first, and pinned
        out = [(s, "*", []) for s in systems[:2]] + out
    return out


def replay(num_pages: int, requests, **kwargs) -> KVCacheManager:
    """Admit, decode (one token per append) and free each request in turn."""
    m = KVCacheManager(num_pages + 1, PS, **kwargs)
    for i, (prompt, ns, answer) in enumerate(requests):
        assert m.add_sequence(i, prompt, ns) is not None
        for t in answer:
            assert m.append(i, [t])
        m.free_sequence(i)
        if ns == "*":
            assert m.pin(prompt, 1e6, "*") > 0
    return m


def sizes_for(requests) -> list[int]:
    biggest = max((len(p) + len(a)) // PS + 2 for p, _, a in requests)
    return [s for s in (128, 256, 512, 1024, 2048, 4096, 8192) if s >= biggest]


@pytest.mark.parametrize("public", [False, True])
def test_an_exact_curve_is_the_hit_rate_of_lru_caches_of_every_size(public: bool) -> None:
    reqs = conversations(public=public)
    one = replay(100_000, reqs, miss_ratio_curve=1_000_000)
    # Pinned pages are never evicted, where the curve's LRU model would: a small cache differs.
    sizes = [s for s in sizes_for(reqs) if not public or s >= 512]
    curve = one.miss_ratio_curve(sizes)
    assert isinstance(curve, MissRatioCurve)
    assert curve.sample_rate == 1.0
    assert curve.prompt_tokens == one.stats().prefix_query_tokens
    # A cache as large as the largest reuse distance is the infinite cache.
    assert one.miss_ratio_curve([curve.max_distance_pages]).hit_rate[0] == pytest.approx(one.stats().hit_rate)
    real = [replay(s, reqs).stats().hit_rate for s in sizes]
    assert real[0] < real[-1] - 0.15  # the sizes matter on this workload
    np.testing.assert_allclose(curve.hit_rate, real, atol=0.004)
    assert np.all(np.diff(curve.hit_rate) >= 0)


def test_a_sampled_curve_stays_close_in_bounded_memory() -> None:
    reqs = conversations(seed=1, n=900)
    m = replay(100_000, reqs, miss_ratio_curve=600)
    sizes = sizes_for(reqs)
    curve = m.miss_ratio_curve(sizes)
    assert curve.num_samples <= 600 and curve.max_samples == 600
    assert curve.sample_rate < 0.1
    real = [replay(s, reqs).stats().hit_rate for s in sizes]
    np.testing.assert_allclose(curve.hit_rate, real, atol=0.05)


def test_forks_and_rejected_drafts_keep_the_curve_on_the_cache() -> None:
    """Parallel samples fork a request; speculative decoding appends drafts and truncates some of
    them back, across page boundaries: the pages that fill are the ones the real cache holds."""
    rng = np.random.default_rng(3)
    base = rng.integers(0, 30_000, 200).tolist()
    sizes = [32, 64, 128, 1024]

    def run(num_pages: int, curve: bool) -> KVCacheManager:
        m = KVCacheManager(num_pages + 1, PS, miss_ratio_curve=1_000_000 if curve else None)
        rng = np.random.default_rng(4)
        sid = 0
        for turn in range(60):
            prompt = base[: 40 + 7 * (turn % 20)] + [turn % 5] * 20
            assert m.add_sequence(sid, prompt) is not None
            kids = [sid]
            for k in range(2):
                m.fork(sid, sid + 1 + k)
                kids.append(sid + 1 + k)
            for kid in kids:
                for _ in range(6):
                    drafts = rng.integers(0, 7, 5).tolist()
                    assert m.append(kid, drafts)
                    m.take_pending_copies()  # the engine copies shared pages every step
                    keep = m.seq_len(kid) - int(rng.integers(0, 5))
                    m.truncate(kid, keep)
            for kid in kids:
                m.free_sequence(kid)
            sid += 3
        return m

    curve = run(100_000, True).miss_ratio_curve(sizes)
    real = [run(s, False).stats().hit_rate for s in sizes]
    np.testing.assert_allclose(curve.hit_rate, real, atol=0.01)


def test_defaults_cover_hbm_and_the_lower_tiers() -> None:
    m = KVCacheManager(801, PS, miss_ratio_curve=True, lower_tiers=[("host", 1600), ("disk", 6400)])
    c = m.miss_ratio_curve()
    assert c.max_samples == 8192 and c.prompt_tokens == 0
    assert {100, 200, 400, 800, 1600, 3200, 6400, 12800, 2400, 8800} <= set(c.sizes_pages.tolist())
    assert np.all(np.diff(c.sizes_pages) > 0) and np.all(c.hit_rate == 0)
    assert c.sizes_pages.dtype == np.int64 and c.hit_rate.dtype == np.float64


def test_reset_and_off() -> None:
    assert KVCacheManager(10).miss_ratio_curve() is None
    assert KVCacheManager(10).reset_miss_ratio_curve() is False
    assert KVCacheManager(10, miss_ratio_curve=False).miss_ratio_curve() is None
    m = replay(1000, conversations(n=50), miss_ratio_curve=True)
    assert m.miss_ratio_curve([10_000]).hit_rate[0] > 0.3
    assert m.reset_miss_ratio_curve() is True
    c = m.miss_ratio_curve([10_000])
    assert c.prompt_tokens == 0 and c.hit_rate[0] == 0 and c.num_samples == 0


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, InvalidArgumentError),
        (-1, InvalidArgumentError),
        (2**22 + 1, InvalidArgumentError),
        ("yes", InvalidDTypeError),
        (1.5, InvalidDTypeError),
        (np.bool_(True), InvalidDTypeError),
    ],
)
def test_bad_curve_arguments_are_refused(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="miss_ratio_curve"):
        KVCacheManager(10, miss_ratio_curve=value)


def test_bad_sizes_are_refused() -> None:
    m = KVCacheManager(10, miss_ratio_curve=True)
    with pytest.raises(InvalidArgumentError):
        m.miss_ratio_curve([-1])
    with pytest.raises(InvalidDTypeError):
        m.miss_ratio_curve(["a"])
    assert m.miss_ratio_curve([]).hit_rate.shape == (0,)
    assert m.miss_ratio_curve(np.array([5, 1], np.int32)).sizes_pages.tolist() == [5, 1]


def test_the_curve_is_exported_to_prometheus() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from kvcore.metrics import KVCoreCollector, metrics_text

    m = replay(500, conversations(n=40), miss_ratio_curve=True)
    curve = m.miss_ratio_curve()
    for text in (m.metrics_text(), metrics_text(m.stats(), mrc=curve)):
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        got = {s.labels["size_pages"]: s.value for s in fams["kvcore_mrc_hit_rate"].samples}
        assert got == {
            str(s): pytest.approx(h) for s, h in zip(curve.sizes_pages, curve.hit_rate, strict=True)
        }
        assert fams["kvcore_mrc_sample_rate"].samples[0].value == 1.0
    names = {f.name for f in KVCoreCollector(m).collect()}
    assert "kvcore_mrc_hit_rate" in names
    assert "kvcore_mrc_hit_rate" not in {f.name for f in KVCoreCollector(KVCacheManager(10)).collect()}
    assert kvcore.MissRatioCurve is MissRatioCurve


def test_a_long_lived_sequence_s_prefix_is_recent_when_it_ends() -> None:
    """The tree stamps a path when its last sequence releases it (deepest first): a request that
    lived through a churn of others leaves its prefix the most recent. The curve uses the path
    again at the release, so a cache too small for the churn still hits it, as the real one does."""
    rng = np.random.default_rng(5)
    long_prompt = rng.integers(0, 30_000, 8 * PS + 3).tolist()
    churn = [rng.integers(0, 30_000, 6 * PS + 1).tolist() for _ in range(30)]

    def run(num_pages: int, curve: bool) -> KVCacheManager:
        m = KVCacheManager(num_pages + 1, PS, miss_ratio_curve=1_000_000 if curve else None)
        assert m.add_sequence(0, long_prompt) is not None
        for i, p in enumerate(churn):  # admitted and freed while sequence 0 lives
            assert m.add_sequence(1 + i, p) is not None
            m.free_sequence(1 + i)
        m.free_sequence(0)
        assert m.add_sequence(99, [*long_prompt, 1, 2]) is not None
        return m

    sizes = [32, 64, 128]
    real = [run(s, False).stats().hit_rate for s in sizes]
    assert all(r == real[-1] > 0.03 for r in real)  # the long prefix hits at every size
    np.testing.assert_allclose(run(10_000, True).miss_ratio_curve(sizes).hit_rate, real, atol=1e-9)
