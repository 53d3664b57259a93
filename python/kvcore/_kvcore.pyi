"""Type stubs of the native module (checked against the built module by ``mypy.stubtest``)."""

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Protocol, TypeAlias, final, overload

import numpy as np
import numpy.typing as npt

from kvcore.events import KVEvent
from kvcore.manager import BatchLayout, MissRatioCurve, PageTable, PrefixHit, PrefixMatch, TransferBatch

__all__ = [
    "MAX_EVENTS",
    "CacheStats",
    "KVCacheManager",
    "PageAllocator",
    "RespClient",
    "__version__",
    "_cache_stats",
    "page_keys",
    "payload_checksum",
]

__version__: str
MAX_EVENTS: int  # events the log holds between two take_events calls (past it: a snapshot)

_PageIds: TypeAlias = npt.NDArray[np.int32] | Sequence[int]

@final
class PageAllocator:
    """A fixed pool of pages with per-page reference counts; lock-free and safe to share between threads.

    Page 0 is the reserved null page: never handed out, never freed.
    """

    def __new__(cls, num_pages: int, *, num_shards: int | None = None) -> PageAllocator: ...
    def allocate(self, n: int) -> npt.NDArray[np.int32] | None:
        """``n`` distinct pages (int32, each with one reference), or None when fewer are free.

        ``InvalidArgumentError`` if ``n`` exceeds the pool's usable pages (it could never succeed).
        """
    def free(self, pages: _PageIds) -> None:
        """Drop one reference per listed page; pages reaching zero return to the pool. All or nothing."""
    def retain(self, pages: _PageIds) -> None:
        """Add one reference per listed page (sharing). All or nothing."""
    def ref_count(self, page: int) -> int:
        """References held on ``page`` (0 when free)."""
    @property
    def num_free(self) -> int: ...
    @property
    def num_pages(self) -> int: ...
    @property
    def num_shards(self) -> int: ...

@final
class CacheStats:
    """One consistent snapshot of the usage split and the counters (frozen; compares by value).

    The four ``num_pages_*`` splits are disjoint and sum to ``num_pages_total``. The fields are
    declared once, in the Rust core.
    """

    @property
    def num_pages_total(self) -> int:
        """Usable pages (num_pages - 1; page 0 is the null page)."""
    @property
    def num_pages_in_use(self) -> int:
        """Held by a live sequence, protected by its lock, or held for a queued copy."""
    @property
    def num_pages_cached(self) -> int:
        """Cached and evictable: only the prefix tree holds them."""
    @property
    def num_pages_pinned(self) -> int:
        """Cached and protected by an unexpired TTL pin (not counted as in use)."""
    @property
    def num_pages_free(self) -> int:
        """In the allocator's free pool."""
    @property
    def num_sequences(self) -> int:
        """Live sequences."""
    @property
    def prefix_query_tokens(self) -> int:
        """Prompt tokens looked up by add_sequence (admitted requests)."""
    @property
    def prefix_hit_tokens(self) -> int:
        """Of those, tokens found cached (<= prefix_query_tokens)."""
    @property
    def num_evicted_pages(self) -> int:
        """Pages evicted from the prefix tree since creation."""
    @property
    def num_cow_copies(self) -> int:
        """Copy-on-write page copies queued since creation."""
    @property
    def num_refused(self) -> int:
        """add_sequence / append calls refused for lack of pages."""
    @property
    def hit_rate(self) -> float:
        """Fraction of looked-up prompt tokens that were cached (0 before any lookup)."""
    @property
    def usage(self) -> float:
        """Fraction of usable pages in use: what a scheduler admits against (cached and pinned
        pages excluded, as vLLM's ``kv_cache_usage_perc`` excludes cached blocks)."""
    @property
    def occupancy(self) -> float:
        """Fraction of usable pages not free (in use, cached or pinned)."""
    def as_dict(self) -> dict[str, int]:
        """The fields as a dict, in declaration order."""
    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...
    def __copy__(self) -> CacheStats:
        """The snapshot itself (immutable)."""
    def __deepcopy__(self, _memo: object) -> CacheStats:
        """The snapshot itself (immutable)."""

_Ids: TypeAlias = Sequence[int] | npt.NDArray[np.int64] | npt.NDArray[np.int32]

class _TierLike(Protocol):
    name: str
    num_slots: int

_Tokens: TypeAlias = npt.NDArray[np.int32] | npt.NDArray[np.uint32] | npt.NDArray[np.int64] | Sequence[int]

@final
class KVCacheManager:
    """The KV-cache manager an engine's scheduler talks to every step (see ``kvcore.manager``)."""

    def __new__(
        cls,
        num_pages: int,
        page_size: int | None = None,
        eviction: str = "lru",
        *,
        pin_budget_pages: int | None = None,
        clock: Callable[[], float] | None = None,
        fingerprint: bytes | bytearray | None = None,
        events: bool = False,
        lower_tiers: Sequence[tuple[str, int] | tuple[str, int, float] | _TierLike] | None = None,
        store_policy: str = "selective",
        store_options: dict[str, float] | None = None,
        groups: Sequence[int | None] | None = None,
        miss_ratio_curve: bool | int | None = None,
    ) -> KVCacheManager:
        """``groups``: one entry per KV-cache group of layers, each with its own page table per
        sequence: ``None`` for full attention, an int ``W`` for a sliding window of ``W`` tokens (pages
        that leave the window are released). All groups share the pool; default: one full group.
        ``miss_ratio_curve``: ``True`` (8,192 sampled pages) or a number of pages to sample builds the
        online hit-rate-against-size curve (:meth:`miss_ratio_curve`); off by default."""
    @classmethod
    def for_model(
        cls, model: object, num_pages: int, page_size: int | None = None, **kwargs: object
    ) -> KVCacheManager:
        """A manager with ``model``'s KV-cache groups (a preset name, a config.json path or a
        ``kvcore.sizing`` spec; see ``kvcore.sizing.kv_cache_groups``)."""
    @property
    def groups(self) -> list[int | None]:
        """Window of each KV-cache group (``None``: full attention), in the order given."""
    def add_sequence(
        self,
        seq_id: int,
        prompt_tokens: _Tokens,
        namespace: str | None = None,
        priority: int = 0,
        *,
        cache_prompt: bool = True,
        reserve: int | None = None,
        sink_tokens: int | None = None,
        recent_tokens: int | None = None,
    ) -> int | None:
        """Cached prompt tokens (page aligned, at most len - 1), or None if it cannot fit.

        ``reserve``: slots for only that many prompt tokens after the hit (the rest with ``reserve``).
        ``recent_tokens`` (+ ``sink_tokens``, default 0): StreamingLLM; the full-attention groups keep
        the pages of the first ``sink_tokens`` and the last ``recent_tokens`` tokens and release the
        pages between as the sequence grows; its own pages are never cached (only its hit is shared).
        """
    def prefix_hit(self, seq_id: int) -> PrefixHit:
        """What the sequence's admission took from the cache, per group, and why not more."""
    def positions(self, seq_ids: _Ids, *, group: int | None = None) -> npt.NDArray[np.int32]:
        """Original positions of the kept tokens (batch order): the position map of
        ``page_table(seq_ids, group=group, compact=True)``."""
    def compact(
        self,
        seq_id: int,
        scores: Sequence[float] | npt.NDArray[np.float32],
        max_pages: int,
        *,
        sink_tokens: int | None = None,
        recent_tokens: int | None = None,
    ) -> int:
        """Page-level heavy hitters: release the lowest-``scores`` full-attention pages (never the
        sink or recent ones, never the last) until at most ``max_pages`` are kept; the pages released.
        ``scores``: one per page of ``seq_pages`` or one per kept page (the compact table's order),
        e.g. accumulated ``page_scores`` of the attention kernels. Call it after the step that
        produced them; the sequence's later pages are private (never cached)."""
    @property
    def tier_names(self) -> list[str]:
        """Names of the lower tiers, fastest first (a transfer row's ``tier`` indexes this)."""
    def take_transfers(
        self, *, stores: bool = True, loads: bool = True, sink: list[TransferBatch] | None = None
    ) -> TransferBatch:
        """Queued stores and/or loads, now in flight: copy them (``kvcore.tiers.Mover``) and report
        each op with ``complete_transfers``. Take stores only after the step that wrote their pages;
        loads any time (``stores=False`` before a step overlaps them with it). ``sink``: a list the
        batch is also appended to before the call returns (an interrupt there cannot lose it)."""
    def complete_transfers(self, op_ids: _Ids, ok: bool | Sequence[bool] | npt.NDArray[np.bool_]) -> None:
        """Report taken transfers: a store OK becomes visible in its tier, a failed one frees its
        slots; a failed load cuts the sequence's hit before it. Nothing changes on a bad id."""
    def check_transfers(self, op_ids: _Ids) -> None:
        """Raise ``InvalidArgumentError`` unless every op is a taken transfer still in flight, each
        listed once (what ``complete_transfers`` requires); changes nothing."""
    def is_ready(self, seq_id: int) -> bool:
        """Whether the sequence's prefix is in HBM (no load in flight): its tables are valid."""
    def hit_tokens(self, seq_id: int) -> dict[str, int]:
        """``{"hbm": n, tier name: n, ...}``: where the sequence's prefix hit comes from."""
    def peek_hit_tokens(self, tokens: _Tokens, namespace: str | None = None) -> dict[str, int]:
        """``{"hbm": n, tier name: n, ...}``: the prefix an admission would find now, per medium
        (no side effects)."""
    def prompt_keys(
        self, tokens: _Tokens, namespace: str | None = None, *, public_pages: int | None = None
    ) -> npt.NDArray[np.uint8]:
        """``[n, 16]`` page keys of the full pages of ``tokens``, with this cache's fingerprint; the
        first ``public_pages`` keyed as a public prefix, the rest chained from them."""
    def tier_prefix_len(self, tier: str, tokens: _Tokens, namespace: str | None = None) -> int:
        """Leading full pages of ``tokens`` that lower tier ``tier`` indexes (no side effects)."""
    def mark_tier_pages(
        self,
        tier: str,
        tokens: _Tokens,
        num_pages: int,
        namespace: str | None = None,
        *,
        public_pages: int | None = None,
    ) -> int:
        """Index the first ``num_pages`` pages of ``tokens`` in ``tier`` because the tier holds them
        (a shared tier); returns the pages newly indexed. ``public_pages``: the keys asked chained
        over that many public pages (nothing is indexed if the tier's path here is otherwise)."""
    def tier_stats(self) -> dict[str, dict[str, int]]:
        """``{tier name: {counter: value}}``: occupancy and counters of each lower tier."""
    @overload
    def restore_tier(
        self,
        name: str,
        entries: Iterable[tuple[int, bytes, bytes, str | None, _Tokens]],
        *,
        reasons: Literal[False] | None = None,
    ) -> npt.NDArray[np.bool_]: ...
    @overload
    def restore_tier(
        self,
        name: str,
        entries: Iterable[tuple[int, bytes, bytes, str | None, _Tokens]],
        *,
        reasons: Literal[True],
    ) -> list[str]:
        """Rebuild a lower tier's index from ``DiskTier.entries()``; accepted or not, per entry
        (only pages whose keys this cache computes: same fingerprint, namespace and tokens). With
        ``reasons=True``, per entry ``"accepted"`` or why not: ``"unknown_parent"`` (another
        fingerprint's, its parent's file is gone, or its parent came in an earlier call),
        ``"parent_refused"``, ``"key_mismatch"``, ``"crosses_namespace"``, ``"slot_in_use"``,
        ``"duplicate"``, ``"index_refused"``."""
    def _check_invariants(self) -> None:
        """Check the tree's and the lower tiers' invariants (tests); InternalError if broken."""
    def reserve(self, seq_id: int, num_tokens: int) -> bool:
        """Slots for the next ``num_tokens`` prompt tokens; False (nothing changed) if no room."""
    def page_keys(self, seq_id: int) -> npt.NDArray[np.uint8]:
        """``[num_full_pages, 16]`` page keys of the sequence's full pages (see docs/api.md)."""
    def take_events(self, sink: list[KVEvent] | None = None) -> list[KVEvent]:
        """KV events since the last call, in order (empty unless built with ``events=True``); past
        ``MAX_EVENTS`` of them, per medium ``AllCleared(medium)`` then its content as ``PageStored``.
        Exactly once: events a call could not build (an interrupt) come back in the next call;
        ``sink``: a list they are appended to inside the call (which then returns ``[]``)."""
    @property
    def num_events_dropped(self) -> int:
        """Events dropped because the log was full (replaced by a snapshot), since construction."""
    def root_key(self) -> bytes:
        """The cache's root page key (16 bytes), from its fingerprint."""
    def num_reserved(self, seq_id: int) -> int:
        """Tokens of the sequence with a slot reserved."""
    def append(self, seq_id: int, new_tokens: _Tokens, num_lookahead: int = 0) -> bool:
        """Reserve slots for generated tokens and ``num_lookahead`` draft slots; False (nothing
        changed) if there is no room. Draft slots last until the next append, which keeps exactly
        its own ``num_lookahead`` past its tokens and releases the earlier ones."""
    def append_batch(self, seq_ids: _Ids, tokens: _Tokens) -> int:
        """One generated token per sequence, in order (a decode step): how many were appended
        before the first that found no room (nothing changed for it and after it)."""
    def set_tenant_floor(self, namespace: str | None, num_pages: int, tier: str | None = None) -> None:
        """Keep at least ``num_pages`` cached pages of ``namespace`` in HBM (or slots of lower tier
        ``tier``) while other pages can be evicted (0 removes the floor)."""
    def set_tenant_ceiling(
        self, namespace: str | None, num_pages: int | None, tier: str | None = None
    ) -> None:
        """Past ``num_pages`` cached pages (or slots of lower tier ``tier``), ``namespace``'s pages are
        evicted before any other tenant's (None removes the ceiling)."""
    def tenant_quotas(self) -> list[tuple[str | None, str, int, int | None, int]]:
        """``[(namespace, tier, floor, ceiling, cached pages)]`` of every tenant quota, sorted."""
    def tenant_floors(self) -> list[tuple[str | None, str, int, int]]:
        """``[(namespace, tier, floor, cached pages)]`` of every tenant floor (tier ``"hbm"`` or a
        lower tier's name), sorted."""
    @property
    def store_policy(self) -> tuple[str, dict[str, float]]:
        """``(name, options)`` of the store policy in force (``set_store_policy(*p)`` restores it)."""
    def set_store_policy(self, store_policy: str, store_options: dict[str, float] | None = None) -> None:
        """Replace the store policy (as in the constructor); queued stores are not affected."""
    def offload(self, seq_id: int) -> int:
        """Store the sequence's cached full pages to the lower tiers whatever the store policy (a
        swap-out before ``free_sequence``); pages stored or in flight in the first tier."""
    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Roll back to the first ``num_tokens`` tokens (rejected drafts), releasing pages past them."""
    def commit(self, seq_id: int, num_tokens: int) -> int:
        """Cache the full pages of the first ``num_tokens`` (computed) tokens; tokens now cached."""
    def fork(self, parent_id: int, child_id: int) -> None:
        """``child_id`` shares every page of ``parent_id``, whose tokens must all be computed."""
    def free_sequence(self, seq_id: int) -> None:
        """Release a sequence: full pages stay cached; queued copies into pages nobody else holds
        are cancelled (a copy into a page the tree cached is kept: take and apply it)."""
    def page_table(
        self,
        seq_ids: _Ids,
        num_tokens: _Ids | None = None,
        out: PageTable
        | tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]
        | None = None,
        *,
        group: int | None = None,
        compact: bool | None = None,
    ) -> PageTable:
        """The CSR page table, of each sequence's first ``num_tokens[i]`` tokens if given (a prefill
        chunk); with ``out`` (reused int32 buffers), views of them are returned. ``group``: the
        KV-cache group (released pages are the null page); ``compact``: leave them out (see
        ``positions``)."""
    def batch_layout(
        self, seq_ids: _Ids, starts: _Ids, num_tokens: _Ids, *, group: int | None = None
    ) -> BatchLayout:
        """One step's rows in one call: row ``i`` computes ``num_tokens[i]`` tokens of ``seq_ids[i]``
        from ``starts[i]``; the page table cut at each row's last token, ``q_indptr``, every token's
        position (int32) and slot (int64)."""
    def block_table(
        self, seq_ids: _Ids, out: npt.NDArray[np.int32] | None = None, *, group: int | None = None
    ) -> npt.NDArray[np.int32]:
        """Dense ``[batch, max_pages]`` int32 block table padded with the null page (vLLM's format);
        with ``out`` (a reused ``[rows, cols]`` buffer), the view ``out[:batch, :max_pages]``."""
    def slot_mapping(
        self, seq_id: int, num_tokens: int, start: int | None = None, *, group: int | None = None
    ) -> npt.NDArray[np.int64]:
        """int64 slots of ``num_tokens`` tokens from ``start`` (default: the last ``num_tokens``);
        a token whose page in ``group`` was released has none (InvalidArgumentError)."""
    def evict(self, num_pages: int) -> int: ...
    def pin(self, tokens: _Tokens, ttl_s: float, namespace: str | None = None) -> int: ...
    def cap_pins(self, max_ttl_s: float) -> int:
        """Shorten every pin that would outlive ``max_ttl_s`` seconds from now to expire then; the
        pins shortened."""
    def unpin(self, tokens: _Tokens, namespace: str | None = None) -> int: ...
    def peek_prefix_len(self, tokens: _Tokens, namespace: str | None = None) -> int: ...
    def match_prefix(self, tokens: _Tokens, namespace: str | None = None) -> PrefixMatch:
        """The longest cached prefix (whole pages) and its pages, without side effects."""
    def allocate_pages(self, n: int) -> npt.NDArray[np.int32] | None:
        """``n`` caller-held pages (to load K/V into and ``insert``), or None if there is no room."""
    def free_pages(self, pages: _PageIds) -> None:
        """Drop the caller's reference on pages from ``allocate_pages``."""
    def insert(self, tokens: _Tokens, pages: _PageIds, namespace: str | None = None) -> int:
        """Cache ``tokens`` with their K/V in caller-held ``pages``; returns pages adopted."""
    def reset_prefix_cache(self) -> int:
        """Drop every cached page no live sequence uses, pins included; returns pages dropped."""
    def caller_held_pages(self) -> dict[int, int]:
        """``{page: references}`` the caller holds from ``allocate_pages``."""
    def take_pending_copies(self) -> npt.NDArray[np.int32]:
        """``[n, 2]`` int32 ``(src_page, dst_page)`` copy-on-write pairs queued since the last call.

        One valid batch for ``kernels.copy_pages``: distinct destinations, no destination is a source.
        """
    def stats(self) -> CacheStats: ...
    def metrics_text(self) -> str: ...
    def miss_ratio_curve(
        self, sizes: npt.NDArray[np.integer[Any]] | Sequence[int] | None = None
    ) -> MissRatioCurve | None:
        """The prompt-token hit rate an LRU cache of each size (pages) would have had on the
        admissions seen (default sizes: HBM x 1/8 .. 16, HBM plus each lower tier, the largest reuse
        distance); None if the manager was built without ``miss_ratio_curve``."""
    def reset_miss_ratio_curve(self) -> bool:
        """Forget what the curve has seen (it counts again from the next admission); False if off."""
    def seq_len(self, seq_id: int) -> int: ...
    def seq_pages(self, seq_id: int, *, group: int | None = None) -> npt.NDArray[np.int32]: ...
    def cached_pages(self) -> npt.NDArray[np.int32]: ...
    def seq_ids(self) -> list[int]: ...
    def num_namespaces(self) -> int:
        """Namespace names kept: those with a live sequence or a cached page."""
    def ref_count(self, page: int) -> int: ...
    def check_pages(self, pages: _PageIds) -> None: ...
    @property
    def num_pages(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    def __contains__(self, key: int, /) -> bool: ...
    def __len__(self) -> int: ...

def page_keys(
    tokens: _Tokens,
    page_size: int,
    fingerprint: bytes | bytearray | None = None,
    namespace: str | None = None,
    *,
    public_pages: int | None = None,
) -> npt.NDArray[np.uint8]:
    """``[len(tokens) // page_size, 16]`` page keys, as a cache with this fingerprint computes them
    (the first ``public_pages`` as a public prefix's, the rest chained from them)."""

def _cache_stats(values: Sequence[int]) -> CacheStats:
    """A ``CacheStats`` from its values in field order (what pickling stores)."""

def payload_checksum(data: npt.NDArray[np.uint8] | Sequence[npt.NDArray[np.uint8]]) -> bytes:
    """XXH3-128 of a contiguous 1-D uint8 array, or of the concatenation of a list of them: 16 bytes,
    little-endian (integrity, not identity).

    Lower tiers store it beside each value and check it on every load: a flipped byte, a torn or
    truncated write reads as a miss, never as K/V. Runs at memory speed (about 24 GB/s here).

    Raises:
        InvalidArgumentError: ``data`` is not a contiguous 1-D uint8 NumPy array, or is being written.
    """

@final
class RespClient:
    """A pipelined RESP client of one Redis server or a Redis Cluster (``kvcore.tiers``' Rust transport).

    Every connect, read and write is bounded by ``timeout_s``. Each call returns ``(status, errors)``
    per key: 1 done, 0 absent (``SET NX`` found the key; ``GET`` missing; ``EXISTS`` false), 2 a value
    of another length than the caller's row, -1 refused by the server (``errors[i]`` is its line:
    ``OOM ...``, ``MOVED ...``), -2 connection failed or timed out (``"timeout"``, ``"connection: ..."``).
    The network runs with the interpreter released; values are sent from and read into the caller's
    arrays under a NumPy borrow held for the call.
    """

    def __new__(cls, nodes: Sequence[str], cluster: bool = False, timeout_s: float = 0.5) -> RespClient: ...
    def set_many(
        self, keys: Sequence[bytes], values: npt.NDArray[np.uint8], nx: bool = True, px_ms: int | None = None
    ) -> tuple[npt.NDArray[np.int8], list[str | None]]:
        """``SET key value [NX] [PX px_ms]`` per row of ``values`` (``[n, value_len]`` uint8)."""
    def get_into(
        self, keys: Sequence[bytes], out: npt.NDArray[np.uint8]
    ) -> tuple[npt.NDArray[np.int8], list[str | None]]:
        """``GET`` each key into its row of ``out`` (``[n, value_len]`` uint8, writable)."""
    def exists_many(self, keys: Sequence[bytes]) -> tuple[npt.NDArray[np.int8], list[str | None]]:
        """``EXISTS`` each key (one pipelined round trip per node)."""
    def del_many(self, keys: Sequence[bytes]) -> tuple[npt.NDArray[np.int8], list[str | None]]:
        """``DEL`` each key."""
