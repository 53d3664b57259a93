"""The scheduler over a manager with several KV-cache groups (hybrid models: full attention beside
sliding windows). Every token takes a slot in each group, so admission must predict pages over all of
them: the page model is checked against the manager's own pages in use, and the scheduler against a
plain manager of the same capacity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore import KVCacheManager
from kvcore.exceptions import RequestRejected
from kvcore.scheduler import Request, Scheduler
from kvcore.scheduler.admission import PageModel

PS = 16
LAYOUTS = [
    [None, None],
    [64, 64, 64, 64, 64, None],  # Gemma-style: five windowed groups, one full
    [1024, 1024, 1024, 1024, 1024, None],  # windows longer than the requests
    [100, None],  # a window that is not a whole number of pages
    [16, 33, None],
    [64],  # every group windowed
    [100, 33],
]


@settings(max_examples=40, deadline=None)
@given(
    groups=st.lists(st.one_of(st.none(), st.integers(1, 200)), min_size=1, max_size=4),
    prompt=st.integers(1, 200),
    steps=st.integers(1, 150),
)
def test_held_is_what_the_manager_holds_for_a_decoding_sequence(
    groups: list[int | None], prompt: int, steps: int
) -> None:
    m = KVCacheManager(4000, PS, groups=groups)
    pages = PageModel(groups, PS, 2048)
    m.add_sequence(1, np.arange(1, prompt + 1, dtype=np.int32), cache_prompt=False)
    m.commit(1, prompt)
    most = 0
    for n in range(prompt + 1, prompt + steps + 1):
        assert m.append(1, [n])
        used = m.stats().num_pages_in_use
        assert used == pages.held(n), (groups, n)
        # A window group's count dips where a page leaves its window before the next one fills:
        # peak bounds every length up to n, as planning an answer must.
        most = max(most, used)
        assert most <= pages.peak(n), (groups, n)
    have = np.arange(prompt + 1, prompt + steps + 1, dtype=np.int64)
    assert pages.held_array(have).tolist() == [pages.held(int(n)) for n in have]
    assert pages.peak_array(have).tolist() == [pages.peak(int(n)) for n in have]


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_peak_and_prompt_bounds_are_reached(page_size: int) -> None:
    """The window caps are exact, not only bounds: a long enough decode holds peak's count at some
    length, a long enough chunked prefill prompt's (one page more reserved costs an admission)."""
    for w in range(1, 3 * page_size + 3):
        for chunk in (1, 2, page_size + 1):
            pages = PageModel([w], page_size, chunk)
            length = w + 3 * page_size + 2 * chunk
            tokens = np.arange(1, length + 1, dtype=np.int32)
            reached = 0
            for first in range(1, page_size + chunk + 1):  # chunks at every offset in a page
                m = KVCacheManager(400, page_size, groups=[w])
                m.add_sequence(1, tokens, cache_prompt=False, reserve=first)
                done, most = first, m.stats().num_pages_in_use
                while done < length:
                    m.commit(1, done)
                    n = min(chunk, length - done)
                    assert m.reserve(1, n)
                    done += n
                    most = max(most, m.stats().num_pages_in_use)
                assert most <= pages.prompt(length) or first > chunk, (w, chunk, first)
                reached = max(reached, most if first <= chunk else 0)
                if chunk == 1 and first == 1:  # then decoding: the same bound, reached
                    m.commit(1, length)
                    for t in range(length, 2 * length):
                        assert m.append(1, [t])
                        most = max(most, m.stats().num_pages_in_use)
                    assert most == pages.peak(2 * length), w
            assert reached == pages.prompt(length), (w, chunk)


@pytest.mark.parametrize("groups", LAYOUTS)
@pytest.mark.parametrize("chunk", [1, 17, 64, 500])
@pytest.mark.parametrize("length", [50, 333, 1000])
def test_prompt_bounds_a_chunked_prefill_holding_and_hit_are_exact(
    groups: list[int | None], chunk: int, length: int
) -> None:
    m = KVCacheManager(8000, PS, groups=groups)
    pages = PageModel(groups, PS, chunk)
    tokens = np.arange(1, length + 1, dtype=np.int32)
    m.add_sequence(1, tokens, cache_prompt=False, reserve=min(chunk, length))
    done, peak = min(chunk, length), m.stats().num_pages_in_use
    while done < length:
        m.commit(1, done)
        assert m.stats().num_pages_in_use == pages.holding(done, done)
        n = min(chunk, length - done)
        assert m.reserve(1, n)
        assert m.stats().num_pages_in_use == pages.holding(done + n, done)
        done += n
        peak = max(peak, m.stats().num_pages_in_use)
    assert peak <= pages.prompt(length)
    m.commit(1, length)
    m.free_sequence(1)
    # A second admission of the same prompt takes the hit's pages from the cache: what it holds
    # beyond them, it allocated.
    before = m.stats()
    hit = m.add_sequence(2, tokens, cache_prompt=False)
    assert hit is not None and hit > 0
    after = m.stats()
    taken = before.num_pages_cached - after.num_pages_cached
    assert taken == pages.hit(hit), (groups, hit)


def serve(sched: Scheduler, n: int, max_steps: int = 30000) -> int:
    rng = np.random.default_rng(0)
    for i in range(n):
        sched.submit(Request(i, rng.integers(1, 1000, 300).astype(np.uint32), max_new_tokens=400))
    steps = 0
    while sched.has_work():
        plan = sched.step(steps * 0.02)
        sched.update(plan, rng.integers(1, 1000, int(plan.sample.sum())).astype(np.int64))
        steps += 1
        assert steps < max_steps
    return steps


@pytest.mark.parametrize("groups", LAYOUTS)
def test_admission_predicts_every_group_so_nothing_is_preempted(groups: list[int | None]) -> None:
    # Every answer is max_new_tokens long, which the estimator plans for until it has seen answers,
    # then learns: admission that counts every group's pages never runs out. Counting one group,
    # it admitted 2-6x too much and preempted (18 to 61 recomputes, up to 39 % of the work).
    n = 30 if 1024 in groups else 60  # (one request at a time fits there: 30 are enough, and quicker)
    sched = Scheduler(KVCacheManager(400, PS, groups=groups))
    serve(sched, n)
    s = sched.stats()
    assert s.finished_by_reason == {"length": n}
    assert s.preemptions_by_kind == {"swap": 0, "recompute": 0}
    assert s.num_failed_reservations == 0
    assert s.recomputed_tokens == 0


def test_two_full_groups_schedule_as_a_plain_cache_of_half_the_pages() -> None:
    grouped = serve(Scheduler(KVCacheManager(401, PS, groups=[None, None])), 30)
    plain = serve(Scheduler(KVCacheManager(201, PS)), 30)
    assert grouped == plain


def test_submit_judges_the_size_over_every_group() -> None:
    # 100 pages: a 60-page prompt fits one group, not two.
    sched = Scheduler(KVCacheManager(101, PS, groups=[None, None]))
    with pytest.raises(RequestRejected) as e:
        sched.submit(Request(1, np.arange(1, 60 * PS + 1, dtype=np.uint32), max_new_tokens=4))
    assert e.value.reason == "too_large"
    assert e.value.needed_pages == 2 * 61
    # Windows bound what a long prompt holds once computed: 61 full pages and at most 5 per 64-token
    # window. Computed in one chunk, it holds all 60 window pages too: refused at submit (it was
    # accepted, then refused by the first step); in chunks of 64 tokens it fits, and runs to the end.
    prompt = np.arange(1, 60 * PS + 1, dtype=np.uint32)
    sched = Scheduler(KVCacheManager(101, PS, groups=[64, None]))
    with pytest.raises(RequestRejected) as e:
        sched.submit(Request(2, prompt, max_new_tokens=4))
    assert e.value.reason == "too_large" and e.value.needed_pages == 120
    sched = Scheduler(KVCacheManager(101, PS, groups=[64, None]), long_prefill_token_threshold=64)
    sched.submit(Request(2, prompt, max_new_tokens=4))
    t = 0
    while sched.has_work():
        plan = sched.step(t)
        assert not plan.rejected
        sched.update(plan, np.full(int(plan.sample.sum()), 7, np.int64))
        t += 1
    assert sched.stats().finished_by_reason == {"length": 1}


def test_tenant_ceilings_count_every_group() -> None:
    # A 300-token request with its 400-token answer holds 44 pages per group: a ceiling of 100 pages
    # holds two of them counted on one group, one counted on both (88). The tenant's second request
    # waits, the other tenant's runs. A prompt of 55 pages (110 on both groups) never fits.
    sched = Scheduler(KVCacheManager(801, PS, groups=[None, None]), tenant_max_pages={"a": 100})
    with pytest.raises(RequestRejected) as e:
        sched.submit(Request(9, np.arange(1, 55 * PS, dtype=np.uint32), max_new_tokens=4, namespace="a"))
    assert e.value.reason == "tenant_quota"
    rng = np.random.default_rng(1)
    for i, ns in enumerate(["a", "a", "b"]):
        sched.submit(
            Request(i, rng.integers(1, 1000, 300).astype(np.uint32), max_new_tokens=400, namespace=ns)
        )
    sched.step(0.0)
    assert sorted(sched.running_ids) == [0, 2]


def test_a_sequence_of_windowed_groups_only_grows_past_the_pool() -> None:
    """Every group windowed: a sequence holds a window's pages whatever its length, so append must
    not refuse it at pool size x page size (a request the model said fit ended with ``capacity``,
    and a stuck one preempted all the others)."""
    m = KVCacheManager(21, PS, groups=[64])  # 20 usable pages
    m.add_sequence(1, np.arange(1, 101, dtype=np.int32), cache_prompt=False)
    m.commit(1, 100)
    for t in range(100, 1000):  # 63 pages of tokens through a 20-page pool
        assert m.append(1, [t]), t
        assert m.stats().num_pages_in_use <= 6
    assert not m.append(1, [], num_lookahead=21 * PS)  # what this call adds must still fit
    assert m.append(1, [], num_lookahead=10 * PS)
    m._check_invariants()
    sched = Scheduler(KVCacheManager(21, PS, groups=[64]))
    sched.submit(Request(1, np.arange(1, 101, dtype=np.uint32), max_new_tokens=300))
    sched.submit(Request(2, np.arange(1000, 1100, dtype=np.uint32), max_new_tokens=50))
    t = 0
    while sched.has_work():
        plan = sched.step(t)
        sched.update(plan, np.full(int(plan.sample.sum()), 7, np.int64))
        t += 1
    s = sched.stats()
    assert s.finished_by_reason == {"length": 2} and s.recomputed_tokens == 0


def test_a_prompt_whose_one_chunk_cannot_fit_is_refused_at_submit() -> None:
    sched = Scheduler(KVCacheManager(41, PS, groups=[64, None]))  # 40 usable pages
    with pytest.raises(RequestRejected) as e:  # 25 full + 25 window pages in its one chunk
        sched.submit(Request(1, np.arange(1, 401, dtype=np.uint32), 4))
    assert e.value.reason == "too_large" and e.value.needed_pages == 50
    sched = Scheduler(KVCacheManager(21, PS, groups=[64]))
    with pytest.raises(RequestRejected):
        sched.submit(Request(1, np.arange(1, 400, dtype=np.uint32), 3))


def test_needed_pages_of_a_request_refused_in_a_step_count_every_group() -> None:
    sched = Scheduler(KVCacheManager(101, PS, groups=[None, None]), max_queue_wait_s=1.0)
    sched.submit(Request(1, np.arange(1, 601, dtype=np.uint32), 100), 0.0)  # runs, fills the cache
    sched.submit(Request(2, np.arange(5000, 5320, dtype=np.uint32), 4), 0.0)
    plan = sched.step(0.0)
    assert plan.rejected == [] and 2 not in plan.request_ids.tolist()
    sched.update(plan, np.full(int(plan.sample.sum()), 7, np.int64))
    expired = [e for e in sched.step(5.0).rejected if e.request_id == 2]
    assert [e.needed_pages for e in expired] == [2 * 21]  # held(321) on both groups, not 21


@pytest.mark.parametrize("groups", [[None, 10], [None, 10, 33], [None, None, 10]])
def test_a_recomputed_cached_prefix_holds_no_second_copy(groups: list[int | None]) -> None:
    """A prefix whose window pages were evicted is recomputed (hit 0): once computed, the tree takes
    the sequence's full-group pages and frees its own, so the sequence holds what the model says
    (the tree's copies stayed locked beside the sequence's for its whole life: a lone request the
    model said fit ended with ``capacity``)."""
    m = KVCacheManager(301, 1, groups=groups)
    pages = PageModel(groups, 1, 8)
    prefix = np.arange(1, 51, dtype=np.int32)
    m.add_sequence(1, prefix, cache_prompt=False)
    m.commit(1, 50)
    m.free_sequence(1)
    m.evict(60)  # the window pages go first: the full group's prefix stays, unusable alone
    prompt = np.concatenate([prefix, np.arange(500, 530, dtype=np.int32)])
    assert m.add_sequence(2, prompt, cache_prompt=False, reserve=8) == 0
    done = 8
    while done < len(prompt):
        m.commit(2, done)
        n = min(8, len(prompt) - done)
        assert m.reserve(2, n)
        done += n
    m.commit(2, len(prompt))
    for t in range(len(prompt), len(prompt) + 28):
        assert m.append(2, [t])
        assert m.stats().num_pages_in_use == pages.held(t + 1), t
    m._check_invariants()
    if groups != [None, 10]:
        return
    sched = Scheduler(KVCacheManager(121, 1, groups=groups), long_prefill_token_threshold=8)
    cache = sched.cache
    cache.add_sequence(1, prefix, cache_prompt=False)
    cache.commit(1, 50)
    cache.free_sequence(1)
    cache.evict(60)
    sched.submit(Request(2, prompt.astype(np.uint32), max_new_tokens=28))
    t = 0
    while sched.has_work():
        plan = sched.step(t)
        sched.update(plan, np.full(int(plan.sample.sum()), 7, np.int64))
        t += 1
    assert sched.stats().finished_by_reason == {"length": 1}


@pytest.mark.parametrize("pool", [116, 120, 124])
def test_admission_counts_the_hit_add_sequence_takes_not_the_uncapped_one(pool: int) -> None:
    """A page-aligned prompt cached whole in the tree, whose window pages before its capped hit point
    (add_sequence looks up len - 1 tokens) were evicted: peek_prefix_len says 40 tokens, admission
    takes none. The scheduler took 12 pages off its demand for that hit, admitted it into the room
    kept for the running request's answer, and preempted (1-2 preemptions, up to 6 failed
    admissions); it now waits until that room is free, and nothing is preempted."""
    ps = 4
    m = KVCacheManager(pool, ps, groups=[8, None])
    s = Scheduler(m, max_num_batched_tokens=4096)
    s.submit(Request(10, list(range(5000, 5040)), max_new_tokens=200))
    plan = s.step()
    s.update(plan, np.full(int(plan.sample.sum()), 3, np.int64))
    # Beside the scheduler's request, the manager's own traffic: the prompt's tokens cached whole.
    m.add_sequence(1, list(range(1, 30)))
    for t in range(12):
        m.append(1, [100 + t])
    m.free_sequence(1)
    prompt = list(range(1, 30)) + [100 + t for t in range(11)]  # 40 tokens, 10 pages
    m.add_sequence(5, [900 + i for i in range(60)])
    m.free_sequence(5)
    assert m.add_sequence(2, [*prompt, 7]) == 40
    m.free_sequence(2)
    m.evict(28)
    assert (m.peek_prefix_len(prompt), m.peek_prefix_len(prompt[:-1])) == (40, 0)
    s.submit(Request(7, prompt, max_new_tokens=200))
    admitted_at = {}
    for step in range(1000):
        if not s.has_work():
            break
        plan = s.step()
        admitted_at.update((e.request_id, step) for e in plan.events if e.kind == "admitted")
        s.update(plan, np.full(int(plan.sample.sum()), 3, np.int64))
    assert admitted_at[7] > 0  # it waited for the room
    st = s.stats()
    assert (st.num_preemptions, st.num_failed_admissions) == (0, 0)
    assert st.generated_tokens == 400
