"""The mover: executes a cache's transfer batches between the pool and its lower tiers.

The Rust core decides what moves where (:meth:`KVCacheManager.take_transfers`); the mover copies
the bytes through each tier's ``store`` / ``load`` and reports every op back
(:meth:`KVCacheManager.complete_transfers`), so a page never stays held by a transfer that
nobody completes, even when a tier raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from kvcore.exceptions import ConfigError, InvalidArgumentError
from kvcore.manager import PUBLIC_NAMESPACE, TransferBatch

__all__ = ["MoveResult", "Mover", "Tier"]

# Tries at failing a batch that an interrupt left unreported, each cut short by a new interrupt.
_FAIL_ATTEMPTS = 100


class Tier(Protocol):
    """What the mover needs of a lower tier (``HostTier``, ``DiskTier`` implement it)."""

    name: str
    num_slots: int

    def store(
        self,
        pool: Any,
        pages: npt.NDArray[np.int32],
        slots: npt.NDArray[np.int32],
        keys: npt.NDArray[np.uint8],
        parent_keys: npt.NDArray[np.uint8],
        tokens: npt.NDArray[np.uint32],
        namespaces: list[str | None],
    ) -> npt.NDArray[np.bool_]: ...

    def load(
        self,
        pool: Any,
        slots: npt.NDArray[np.int32],
        pages: npt.NDArray[np.int32],
        keys: npt.NDArray[np.uint8],
    ) -> npt.NDArray[np.bool_]: ...

    def stats(self) -> dict[str, int]: ...


@dataclass(frozen=True)
class MoveResult:
    """What one :meth:`Mover.run` did, in pages."""

    stored: int
    store_failed: int
    loaded: int
    load_failed: int

    @property
    def idle(self) -> bool:
        """Nothing was queued."""
        return not (self.stored or self.store_failed or self.loaded or self.load_failed)


class Mover:
    """Moves a cache's pages between ``pool`` and ``tiers`` (one tier object per lower tier of the
    cache, matched by name; each with the cache's slot count).

    Raises:
        ConfigError: a cache tier has no tier object (or a different slot count), a tier object is
            not one of the cache's, or the pool's page count or page size is not the cache's.
    """

    def __init__(self, cache: Any, pool: Any, tiers: Sequence[Tier]) -> None:
        names = list(cache.tier_names)
        by_name = {t.name: t for t in tiers}
        if len(by_name) != len(tiers):
            raise ConfigError("Mover: two tiers share a name")
        missing = [n for n in names if n not in by_name]
        extra = [n for n in by_name if n not in names]
        if missing or extra:
            raise ConfigError(
                f"Mover: the cache's lower tiers are {names}; missing tier objects {missing}, "
                f"unknown ones {extra}"
            )
        for n in names:
            got = by_name[n].num_slots
            stats = cache.tier_stats()[n]
            if got != stats["num_slots"]:
                raise ConfigError(
                    f"Mover: tier {n!r} has {got} slots, the cache was built with {stats['num_slots']}"
                )
        if pool.num_pages != cache.num_pages or pool.page_size != cache.page_size:
            raise ConfigError(
                f"Mover: the pool has {pool.num_pages} pages of {pool.page_size} tokens, the cache "
                f"{cache.num_pages} of {cache.page_size}"
            )
        self.cache = cache
        self.pool = pool
        self.tiers: list[Tier] = [by_name[n] for n in names]

    def storage_stats(self) -> dict[str, dict[str, int]]:
        """``{tier name: tier.stats()}``: each storage tier's own counters (bytes held and moved,
        checksum mismatches, I/O failures by reason), beside the cache's ``tier_stats()``."""
        return {t.name: t.stats() for t in self.tiers}

    def metrics_text(self, prefix: str = "kvcore") -> str:
        """The cache's Prometheus text with the lower tiers' series, the storage counters included."""
        from kvcore.metrics import metrics_text

        return metrics_text(self.cache.stats(), prefix, self.cache.tier_stats(), self.storage_stats())

    def lookup(self, tokens: Any, namespace: str | None = None) -> int:
        """Ask each shared tier (one with ``exists(keys) -> int``, e.g. ``RedisTier``) which pages of
        ``tokens`` it holds beyond those the cache already indexes there, and index them
        (``KVCacheManager.mark_tier_pages``), so that the next ``add_sequence`` of this prompt loads
        them instead of recomputing them. No bytes move. Returns the pages newly indexed.

        A prompt may start with a public prefix (a system prompt shared as ``"*"``): a cache stores
        it once for every namespace, under its public keys, and the namespace's pages after it
        chained from them. So a shared tier is asked, in one round trip (``exists_runs``, or two
        ``exists`` calls for a tier without it), for the namespace's chain and for the key of the
        prompt's next public page; only if that one is there, for the whole public prefix, then for
        the namespace's pages after it. The public question is skipped for a ``"*"`` prompt, and when
        the cache's index already holds the namespace's own pages after the prompt's public ones (the
        public prefix ends there).

        A tier's answer is trusted up to the keys asked (a larger count is cut there). Pages of the
        tiers before a failing one stay indexed.

        Raises:
            ConfigError: a tier whose ``exists`` answers something other than a count >= 0 (None, a
                float, a bool), or whose ``exists_runs`` answers another number of runs.
        """
        added = 0
        for tier in self.tiers:
            if getattr(tier, "exists", None) is None:
                continue
            name = tier.name
            known = self.cache.tier_prefix_len(name, tokens, namespace)
            if namespace == PUBLIC_NAMESPACE:
                found = self._ask(tier, [(tokens, namespace, 0, known)])[0]
                added += self._mark(name, tokens, namespace, known, found)
                continue
            # The index's public pages on this path (visible from the namespace: known >= public).
            public = self.cache.tier_prefix_len(name, tokens, PUBLIC_NAMESPACE)
            if known > public:  # the namespace's own pages follow them: the public prefix ends there
                found = self._ask(tier, [(tokens, namespace, public, known)])[0]
                added += self._mark(name, tokens, namespace, known, found, public)
                continue
            # Most prompts continue no longer public prefix: its next page's key only, beside the
            # namespace's chain, in the same round trip.
            ps = self.cache.page_size
            next_public, found = self._ask(
                tier,
                [
                    (tokens[: (public + 1) * ps], PUBLIC_NAMESPACE, 0, public),
                    (tokens, namespace, public, known),
                ],
            )
            if next_public:  # a longer public prefix: how long, then the namespace's pages after it
                more_public = self._ask(tier, [(tokens, PUBLIC_NAMESPACE, 0, public)])[0]
                added += self._mark(name, tokens, PUBLIC_NAMESPACE, public, more_public)
                cap = getattr(tier, "max_lookup_keys", None)
                if cap is not None and more_public >= cap:
                    continue  # it may go on past what one question reaches: the next lookup asks on
                public = self.cache.tier_prefix_len(name, tokens, PUBLIC_NAMESPACE)
                known = self.cache.tier_prefix_len(name, tokens, namespace)
                found = self._ask(tier, [(tokens, namespace, public, known)])[0]
            added += self._mark(name, tokens, namespace, known, found, public)
        return added

    def _ask(self, tier: Any, runs: list[tuple[Any, str | None, int, int]]) -> list[int]:
        """The leading keys ``tier`` holds of each run ``(tokens, namespace, public pages, known)``:
        the prompt's keys over that many public pages, from page ``known`` on. One round trip for all
        the runs with ``exists_runs`` (else one ``exists`` call per run)."""
        keys = [
            self.cache.prompt_keys(tokens, ns, public_pages=public)[known:]
            for tokens, ns, public, known in runs
        ]
        many = getattr(tier, "exists_runs", None)
        answers = list(many(keys)) if many is not None else [tier.exists(k) for k in keys]
        name = getattr(tier, "name", "?")
        if len(answers) != len(keys):
            raise ConfigError(
                f"tier {name!r}: exists_runs answered {len(answers)} counts for {len(keys)} runs"
            )
        return [_leading(name, x, len(k)) for x, k in zip(answers, keys, strict=True)]

    def _mark(
        self, tier: str, tokens: Any, namespace: str | None, known: int, found: int, public: int = 0
    ) -> int:
        """Index ``found`` more pages of ``tokens`` after the ``known`` ones ``tier`` indexes, keyed
        over ``public`` public pages as they were asked (nothing if the tier's path is otherwise)."""
        if not found:
            return 0
        return self.cache.mark_tier_pages(tier, tokens, known + found, namespace, public_pages=public)

    def run(self, *, stores: bool = True, loads: bool = True) -> MoveResult:
        """Take the cache's queued transfers (stores, loads or both), copy them, and complete every op.

        Call it after each step (both kinds: the stores copy what the step wrote; sequences
        waiting on loads join the next step). ``run(stores=False)`` before a step starts the
        loads of sequences admitted for it; never take stores before the step that writes them.

        Interrupt-safe: the batch is handed over through a list before the native call returns (a
        signal handler's exception, KeyboardInterrupt, is raised right there), and an exception that
        escapes before its ops are reported fails them, so no page or slot stays held.
        """
        taken: list[TransferBatch] = []
        try:
            self.cache.take_transfers(stores=stores, loads=loads, sink=taken)
            return self.execute(taken[0])
        except BaseException:
            if taken:
                self._fail_unreported(taken[0])
            raise

    def _fail_unreported(self, batch: TransferBatch) -> None:
        """Fail a batch's ops if nothing reported them (an interrupt before ``execute``'s ``finally``
        did); a batch reported already is refused whole by the cache, which changes nothing. Tried
        again when another interrupt cuts it short (a burst of signals), a bounded number of times."""
        ops = np.concatenate([np.unique(batch.store_ops), batch.load_ops]).astype(np.int64)
        if not len(ops):
            return
        for attempt in range(_FAIL_ATTEMPTS):
            try:
                self.cache.complete_transfers(ops, False)
                return
            except InvalidArgumentError:
                return  # reported (complete_transfers is all or nothing)
            except BaseException:  # interrupted again before the call: try once more
                if attempt == _FAIL_ATTEMPTS - 1:
                    raise

    def _forget_orphans(self, batch: TransferBatch, written: npt.NDArray[np.bool_]) -> None:
        """Drop the rows a tier wrote for store ops that failed as a whole (another row of the op
        failed): the cache frees their slots, so their bytes would only take room (a disk's files)
        until the slots are reused. Done before the ops are reported, while the slots are still this
        batch's; best effort (a tier that cannot forget keeps them until they are overwritten)."""
        if not written.any():
            return
        for t, tier in enumerate(self.tiers):
            forget = getattr(tier, "forget", None)
            slots = batch.store_slots[written & (batch.store_tiers == t)]
            if forget is not None and len(slots):
                try:
                    forget(slots)
                except Exception:  # the op is failed either way
                    pass

    def execute(self, batch: TransferBatch) -> MoveResult:
        """Copy one batch and complete its ops (an op a tier failed, or that raised, fails).

        A tier that raises fails its own rows; the other tiers' rows are still tried, every op is
        reported, and then the first tier's exception is raised. An interrupt (any BaseException
        that is not an Exception) stops at once; the ops are reported all the same.

        A batch whose ops are not all in flight (executed or completed already) is refused with
        ``InvalidArgumentError`` before any byte moves: its pages and slots went back to the cache
        and may hold another sequence's K/V now.
        """
        ops = np.unique(batch.store_ops)
        self.cache.check_transfers(np.concatenate([ops, batch.load_ops]).astype(np.int64))
        store_ok = np.zeros(len(batch.store_ops), dtype=bool)
        load_ok = np.zeros(len(batch.load_ops), dtype=bool)
        unknown = np.zeros(len(batch.store_ops), dtype=bool)  # rows a tier may have written, unsaid
        error: Exception | None = None
        try:
            for t, tier in enumerate(self.tiers):
                rows = np.flatnonzero(batch.store_tiers == t)
                if len(rows):
                    try:
                        store_ok[rows] = _row_results(
                            tier.name,
                            "store",
                            tier.store(
                                self.pool,
                                batch.store_pages[rows],
                                batch.store_slots[rows],
                                batch.store_keys[rows],
                                batch.store_parent_keys[rows],
                                batch.store_tokens[rows],
                                [batch.store_namespaces[i] for i in rows],
                            ),
                            len(rows),
                        )
                    except Exception as e:  # its rows fail, and whatever it wrote of them is dropped
                        unknown[rows] = True
                        error = error or e
                rows = np.flatnonzero(batch.load_tiers == t)
                if len(rows):
                    try:
                        load_ok[rows] = _row_results(
                            tier.name,
                            "load",
                            tier.load(
                                self.pool,
                                batch.load_slots[rows],
                                batch.load_pages[rows],
                                batch.load_keys[rows],
                            ),
                            len(rows),
                        )
                    except Exception as e:
                        error = error or e
        finally:
            # Always report: a store op succeeds only if every row of it did.
            op_ok = np.ones(len(ops), dtype=bool)
            try:
                if len(ops):
                    where = np.searchsorted(ops, batch.store_ops)
                    np.logical_and.at(op_ok, where, store_ok)
                    self._forget_orphans(batch, (store_ok & ~op_ok[where]) | unknown)
            finally:
                self.cache.complete_transfers(
                    np.concatenate([ops, batch.load_ops]).astype(np.int64),
                    np.concatenate([op_ok, load_ok]).tolist(),
                )
        if error is not None:
            raise error
        return MoveResult(
            stored=int(store_ok.sum()),
            store_failed=int(len(store_ok) - store_ok.sum()),
            loaded=int(load_ok.sum()),
            load_failed=int(len(load_ok) - load_ok.sum()),
        )


def _leading(tier: str, answer: Any, n: int) -> int:
    """A tier's ``exists`` answer for ``n`` keys: an integer in ``[0, n]`` (more is what was asked: a
    tier cannot hold keys it was not asked about). None, a float, a bool or a negative count is the
    tier's bug, refused (a builtin TypeError or ValueError escaped before)."""
    if isinstance(answer, bool) or not isinstance(answer, int | np.integer) or answer < 0:
        raise ConfigError(
            f"tier {tier!r}: exists answered {answer!r:.40}, expected a count of leading keys >= 0"
        )
    return min(int(answer), n)


def _row_results(tier: str, what: str, result: Any, n: int) -> npt.NDArray[np.bool_]:
    """A tier's answer for ``n`` rows: a bool (or a 0/1 integer) per row, nothing else (a scalar or
    a length-1 array would broadcast to every row: pages nobody wrote reported loaded)."""
    ok = np.asarray(result)
    if ok.shape == (n,) and ok.dtype.kind in "iu" and bool(((ok == 0) | (ok == 1)).all()):
        ok = ok.astype(bool)
    if ok.shape != (n,) or ok.dtype != np.bool_:
        raise ConfigError(
            f"tier {tier!r}: {what} returned {ok.dtype} of shape {ok.shape}, expected one bool per row ({n},)"
        )
    return ok
