"""The scheduler with the tiny engine's pool on CuPy (the CUDA kernels): preempted and resumed requests
(swap through a pinned host tier, and recompute) generate what the no-cache model does. fp16 attention on
the device can move a logit by about 1e-3, so an answer may differ from the float64 reference at a
near-tie; the test asks for most of them to match exactly and every one to start the same way."""

from __future__ import annotations

import numpy as np
import pytest

import kvcore
from kvcore.pool._cupy import gpu_available
from kvcore.scheduler import OutputLengthEstimator, Request, Scheduler, SwapCost
from kvcore.tiers import HostTier, Mover
from kvcore.tiny import TinyDecoder, TinyEngine

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")]


@pytest.mark.parametrize("swap", [False, True])
def test_preempted_requests_on_the_gpu_match_the_model(swap: bool) -> None:
    model = TinyDecoder(1, "fp16")
    pool = TinyEngine.make_pool(model, 12, 4, backend="cupy")
    host = HostTier(pool, 256) if swap else None
    m = kvcore.KVCacheManager(12, 4, lower_tiers=[host] if host else None)
    engine = TinyEngine(model, pool, Mover(m, pool, [host]) if host else None)
    est = OutputLengthEstimator(0.5, min_samples=1)
    est.observe("default", 1)
    cost = SwapCost(1 << 16, 100.0, 25.0) if swap else None
    sched = Scheduler(m, max_num_batched_tokens=32, swap=cost, estimator=est)
    rng = np.random.default_rng(3)
    head = rng.integers(0, 64, 5).tolist()
    prompts = [head + rng.integers(0, 64, int(rng.integers(3, 18))).tolist() for _ in range(6)]
    for i, p in enumerate(prompts):
        sched.submit(Request(i, p, max_new_tokens=10))
    outs: dict[int, list[int]] = {i: [] for i in range(6)}
    t = 0
    while sched.has_work():
        plan = sched.step(float(t))
        toks = engine.forward(plan)
        for rid, tok in toks.items():
            outs[rid].append(tok)
        sched.update(plan, toks)
        t += 1
        assert t < 5000
    assert sched.stats().num_preemptions > 0
    exact = sum(outs[i] == model.generate_no_cache(p, 10) for i, p in enumerate(prompts))
    assert exact >= 5
    assert all(outs[i][:3] == model.generate_no_cache(p, 3) for i, p in enumerate(prompts))
