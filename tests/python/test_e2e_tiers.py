"""End to end through the lower tiers: the tiny decoder of ``test_e2e_decoder`` generates over a paged
cache whose pages also live in a host and a disk tier, and matches the no-cache run.

A prefix is computed in HBM and stored (write-through, ``store_policy="all"``) by a
:class:`kvcore.tiers.Mover`, evicted from HBM and reloaded from the host tier; then other traffic
pushes it out of the (small) host tier, and it comes back from the disk tier. Unquantized tiers
move the pool's bytes, so the logits equal the no-cache ones to float rounding (``check``);
quantized tiers (int8, int4) are held to measured bounds; a flipped byte in a disk file makes the
load a miss (the hit shrinks, the engine recomputes) and never wrong K/V.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from kv_helpers import _scramble
from test_e2e_decoder import VOCAB, PagedRunner, TinyDecoder, check

import kvcore
from kvcore.tiers import DiskTier, HostTier, Mover, codec

FINGERPRINT = b"tiny-decoder/e2e-tiers"
DISK_BYTES = 1 << 20  # ~180 slot files of the tiny geometry: the disk tier never runs out here


class TieredRunner(PagedRunner):
    """A :class:`PagedRunner` whose manager keeps copies of cached pages in lower tiers.

    Transfers follow the engine's rule: after every step, ``mover.run()`` stores what the step wrote
    (and starts any queued loads); an admission with a lower-tier hit runs its loads only
    (``run(stores=False)``) before the step that needs them, since the pages it cached are not
    computed yet.
    """

    def __init__(
        self,
        model: TinyDecoder,
        num_pages: int,
        page_size: int,
        *,
        host_slots: int | None = None,
        disk_dir: Path | None = None,
        quantize: str | None = None,
    ) -> None:
        super().__init__(model, num_pages, page_size)
        self.host = None if host_slots is None else HostTier(self.pool, host_slots, quantize=quantize)
        self.disk = None if disk_dir is None else DiskTier(disk_dir, DISK_BYTES, self.pool, quantize=quantize)
        tiers = [t for t in (self.host, self.disk) if t is not None]
        self.manager = kvcore.KVCacheManager(
            num_pages, page_size, lower_tiers=tiers, store_policy="all", fingerprint=FINGERPRINT
        )
        _scramble(self.manager, num_pages, page_size, seed=7)  # partial pages only: nothing stored
        assert not self.manager.take_transfers()
        self.mover = Mover(self.manager, self.pool, tiers)

    def admit(self, seq_id: int, prompt: list[int]) -> int:
        """Add a request and complete its loads; returns the prompt tokens it found cached (in HBM
        or loaded from a tier; a failed load shrinks it to the pages before the failure)."""
        m = self.manager
        hit = m.add_sequence(seq_id, prompt)
        assert hit is not None and hit < len(prompt)
        self.tokens[seq_id] = list(prompt)
        if not m.is_ready(seq_id):
            moved = self.mover.run(stores=False)
            assert moved.stored == moved.store_failed == 0 and moved.loaded + moved.load_failed > 0
            assert m.is_ready(seq_id)
        got = m.hit_tokens(seq_id)
        assert got["hbm"] + sum(got.get(t.name, 0) for t in self.mover.tiers) <= hit
        self.hits[seq_id] = sum(got.values())
        return self.hits[seq_id]

    def step(
        self, work: dict[int, int], *, decode: bool = False, upto: dict[int, int] | None = None
    ) -> dict[int, np.ndarray]:
        logits = super().step(work, decode=decode, upto=upto)
        self.mover.run()  # the stores of what this step wrote
        return logits

    def prefill(self, seq_id: int) -> dict[int, np.ndarray]:
        """Compute the prompt tokens after the hit."""
        return self.step({seq_id: len(self.tokens[seq_id]) - self.hits[seq_id]})

    def decode(self, seq_id: int, logits: np.ndarray, steps: int) -> Iterator[np.ndarray]:
        """Greedy decode ``steps`` tokens from ``logits``, yielding each step's logits (lazily: at
        each yield ``self.tokens[seq_id]`` ends with the token just computed)."""
        for _ in range(steps):
            self.append(seq_id, int(np.argmax(logits)))
            logits = self.step({seq_id: 1}, decode=True)[seq_id]
            yield logits

    def drop_from_hbm(self, seq_id: int) -> None:
        """Free a finished sequence and evict every unreferenced cached page from HBM."""
        prompt = self.tokens[seq_id]
        self.free(seq_id)
        self.manager.evict(1 << 20)
        assert self.manager.peek_prefix_len(prompt) == 0


def generate_checked(runner: TieredRunner, seq_id: int, steps: int) -> None:
    """Prefill after the hit, then decode ``steps`` tokens; every logit equals the no-cache one."""
    logits = runner.prefill(seq_id)
    check(runner, logits)
    for step_logits in runner.decode(seq_id, logits[seq_id], steps):
        check(runner, {seq_id: step_logits})


@pytest.mark.parametrize(("kv_dtype", "page_size"), [("fp16", 4), ("bf16", 3)])
def test_prefix_goes_hbm_host_disk_and_back_exactly(tmp_path: Path, kv_dtype: str, page_size: int) -> None:
    """HBM -> host -> HBM, then HBM -> (host lost) -> disk -> HBM; the logits equal the no-cache run's."""
    model = TinyDecoder(seed=11, kv_dtype=kv_dtype)
    runner = TieredRunner(model, 64, page_size, host_slots=8, disk_dir=tmp_path / "disk")
    m = runner.manager
    rng = np.random.default_rng(12)
    prefix_len = 4 * page_size
    prompt = rng.integers(0, VOCAB, prefix_len + 2).tolist()

    # Computed in HBM; the step's mover run stores its 4 full pages into both tiers.
    assert runner.admit(0, prompt) == 0
    check(runner, runner.prefill(0))
    stats = m.tier_stats()
    assert stats["host"]["num_slots_cached"] == 4 and stats["disk"]["num_slots_cached"] == 4
    assert runner.host is not None and runner.host.stats()["stores"] == 4
    assert runner.disk is not None and runner.disk.stats()["stores"] == 4
    runner.drop_from_hbm(0)

    # Back from the host tier (the faster one holding it).
    assert runner.admit(1, prompt) == prefix_len
    assert m.hit_tokens(1) == {"hbm": 0, "host": prefix_len, "disk": 0}
    generate_checked(runner, 1, 4)
    assert runner.host.stats()["loads"] == 4 and runner.disk.stats()["loads"] == 0
    runner.drop_from_hbm(1)

    # Two other prompts of 4 full pages each fill the 8 host slots: the prefix (least recently
    # used) is evicted from the host tier, leaf first, and stays on disk.
    for seq_id in (2, 3):
        other = rng.integers(0, VOCAB, prefix_len + 1).tolist()
        assert runner.admit(seq_id, other) == 0
        check(runner, runner.prefill(seq_id))
        runner.drop_from_hbm(seq_id)
    assert m.tier_stats()["host"]["num_evicted_slots"] >= 4

    # Back from the disk tier, under a new tail; the loads complete before the prefill.
    again = prompt[:prefix_len] + rng.integers(0, VOCAB, 3).tolist()
    assert runner.admit(4, again) == prefix_len
    assert m.hit_tokens(4) == {"hbm": 0, "host": 0, "disk": prefix_len}
    assert runner.disk.stats()["loads"] == 4
    generate_checked(runner, 4, 6)
    # The reloaded prefix is cached in HBM again: a second request shares it from there.
    assert runner.admit(5, again) == prefix_len
    assert m.hit_tokens(5) == {"hbm": prefix_len, "host": 0, "disk": 0}
    generate_checked(runner, 5, 2)
    m._check_invariants()


def test_a_prefix_split_between_host_and_disk_loads_from_both(tmp_path: Path) -> None:
    """The host tier keeps only the prefix's first 2 pages (its leaves went first): the hit takes
    those from the host and the next 2 from the disk; the logits equal the no-cache run's, and the
    loaded pages are stored into the host again (write-through), so the next hit is all host."""
    page_size = 4
    model = TinyDecoder(seed=17, kv_dtype="fp16")
    runner = TieredRunner(model, 64, page_size, host_slots=6, disk_dir=tmp_path / "disk")
    m = runner.manager
    rng = np.random.default_rng(18)
    prompt = rng.integers(0, VOCAB, 4 * page_size + 2).tolist()
    other = rng.integers(0, VOCAB, 4 * page_size + 1).tolist()
    for seq_id, tokens in ((0, prompt), (1, other)):  # the other prompt's 4 pages evict 2 of ours
        runner.admit(seq_id, tokens)
        check(runner, runner.prefill(seq_id))
        runner.drop_from_hbm(seq_id)
    assert m.tier_stats()["host"]["num_evicted_slots"] == 2

    assert runner.admit(2, prompt) == 4 * page_size
    assert m.hit_tokens(2) == {"hbm": 0, "host": 2 * page_size, "disk": 2 * page_size}
    generate_checked(runner, 2, 4)
    runner.drop_from_hbm(2)
    assert runner.admit(3, prompt) == 4 * page_size
    assert m.hit_tokens(3) == {"hbm": 0, "host": 4 * page_size, "disk": 0}
    generate_checked(runner, 3, 2)
    m._check_invariants()


def _slot_file(disk: DiskTier, key: bytes) -> Path:
    """The disk tier's file holding the page of this key."""
    for path in sorted(Path(disk.path).glob("slot-*.kv")):
        if codec.parse_header(path.read_bytes()[: disk.header_len]).key == key:
            return path
    raise AssertionError("no file holds the page")


@pytest.mark.parametrize(
    ("where", "reason"), [("payload", "load_failed_checksum"), ("header", "load_failed_corrupt")]
)
def test_flipped_disk_byte_is_a_miss_and_the_engine_recomputes(
    tmp_path: Path, where: str, reason: str
) -> None:
    """A flipped byte in page 2's file: the load fails, the hit shrinks to pages 0-1, the engine
    recomputes from there and the logits still equal the no-cache run's (nothing wrong is read)."""
    page_size = 4
    model = TinyDecoder(seed=13, kv_dtype="fp16")
    runner = TieredRunner(model, 64, page_size, disk_dir=tmp_path / "disk")
    m, disk = runner.manager, runner.disk
    assert disk is not None
    prompt = np.random.default_rng(14).integers(0, VOCAB, 4 * page_size + 2).tolist()
    runner.admit(0, prompt)
    check(runner, runner.prefill(0))
    keys = kvcore.page_keys(np.asarray(prompt, dtype=np.int32), page_size, fingerprint=FINGERPRINT)
    assert bytes(m.page_keys(0)[2]) == bytes(keys[2])
    runner.drop_from_hbm(0)

    path = _slot_file(disk, bytes(keys[2]))
    raw = bytearray(path.read_bytes())
    raw[disk.header_len + 5 if where == "payload" else 40] ^= 0x10
    path.write_bytes(bytes(raw))

    assert m.add_sequence(1, prompt) == 4 * page_size  # the whole hit, until the loads say otherwise
    m.free_sequence(1)  # nothing taken yet: its loads are cancelled
    assert runner.admit(1, prompt) == 2 * page_size
    assert m.hit_tokens(1) == {"hbm": 0, "disk": 2 * page_size}
    assert disk.stats()[reason] == 1 and not path.exists()
    assert m.tier_stats()["disk"]["num_load_failed_pages"] == 1
    # The bad slot went with page 3's behind it (a later store can put them back).
    assert m.tier_stats()["disk"]["num_slots_bad"] == 0
    assert m.tier_stats()["disk"]["num_dropped_bad_slots"] == 2
    generate_checked(runner, 1, 4)  # recomputes tokens 8.. into the pages the sequence holds
    runner.drop_from_hbm(1)

    # The recomputed pages were stored again: the disk gives the whole prefix, right.
    assert runner.admit(2, prompt) == 4 * page_size
    assert m.hit_tokens(2) == {"hbm": 0, "disk": 4 * page_size}
    generate_checked(runner, 2, 2)
    m._check_invariants()


# Measured on this scenario (fp16 pool, page size 4, 3 prompts whose 4-page prefix is reloaded from
# the tier, then 12 greedy decode steps: 39 logit vectors of magnitude ~2-4): max |logit error|
# int8 0.0084, int4 0.17; top-1 agreement 38/39 for both (the one flip is a near-tie, whose top-2
# margin in the no-cache logits is below the error). Bounds: ~3x the error, and 0.9 agreement.
QUANT_BOUNDS = {"int8": (0.025, 0.9), "int4": (0.5, 0.9)}  # max abs logit error, min top-1 agreement


@pytest.mark.parametrize("kind", ["host", "disk"])
@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_quantized_tiers_stay_within_measured_bounds(tmp_path: Path, kind: str, quantize: str) -> None:
    """Pages that come back from an int8/int4 tier are close, not equal: the logits of the prefill
    after the hit and of greedy decoding stay within a measured bound of the no-cache run's, the
    top-1 token agrees but at near-ties, and the error is not zero (the tier did quantize)."""
    page_size = 4
    model = TinyDecoder(seed=15, kv_dtype="fp16")
    runner = TieredRunner(
        model,
        64,
        page_size,
        host_slots=64 if kind == "host" else None,
        disk_dir=tmp_path / "disk" if kind == "disk" else None,
        quantize=quantize,
    )
    rng = np.random.default_rng(16)
    max_err, min_agree = QUANT_BOUNDS[quantize]
    errors, agree = [], []
    for i in range(3):
        prompt = rng.integers(0, VOCAB, 4 * page_size + 2).tolist()
        computed, reloaded = 2 * i, 2 * i + 1
        runner.admit(computed, prompt)
        check(runner, runner.prefill(computed))  # computed in HBM: exact
        runner.drop_from_hbm(computed)
        assert runner.admit(reloaded, prompt) == 4 * page_size
        assert runner.manager.hit_tokens(reloaded)[kind] == 4 * page_size
        logits = runner.prefill(reloaded)[reloaded]
        for got in itertools.chain([logits], runner.decode(reloaded, logits, 12)):
            want = model.no_cache_logits(runner.tokens[reloaded])
            errors.append(np.abs(got - want).max())
            agree.append(int(np.argmax(got)) == int(np.argmax(want)))
        runner.drop_from_hbm(reloaded)
    assert 1e-4 < max(errors) < max_err, max(errors)
    assert np.mean(agree) >= min_agree, np.mean(agree)
