"""Python-side types of the KV-cache manager: the page table and the stats dataclass.

The manager itself is the native class ``kvcore.KVCacheManager`` (Rust); it builds these objects
directly, so they cost nothing unless asked for. :class:`CacheStats` is native too: its fields are
declared once, in the Rust core (``rust/manager/mod.rs``), and documented in ``_kvcore.pyi``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from kvcore._kvcore import CacheStats

__all__ = [
    "PUBLIC_NAMESPACE",
    "BatchLayout",
    "CacheStats",
    "MissRatioCurve",
    "PageTable",
    "PrefixHit",
    "PrefixMatch",
    "TransferBatch",
]

#: The namespace visible from every namespace: prefixes added or pinned under it are shared by all
#: tenants (system prompts, tool definitions).
PUBLIC_NAMESPACE = "*"


class PageTable(NamedTuple):
    """FlashInfer's CSR page table for a batch of sequences (all int32).

    ``kv_indices[kv_indptr[i]:kv_indptr[i + 1]]`` are sequence ``i``'s pages in token order, and its
    last page holds ``kv_last_page_len[i]`` tokens (1..page_size).
    """

    kv_indptr: npt.NDArray[np.int32]  # [batch + 1]
    kv_indices: npt.NDArray[np.int32]  # [kv_indptr[-1]]
    kv_last_page_len: npt.NDArray[np.int32]  # [batch]


class BatchLayout(NamedTuple):
    """What the kernels of one step read for a batch of rows (:meth:`KVCacheManager.batch_layout`).

    Row ``i`` computes tokens ``starts[i]:starts[i] + num_tokens[i]`` of its sequence: they are the
    step's tokens ``q_indptr[i]:q_indptr[i + 1]``, at ``positions`` (int32) in their sequences and
    written to ``slot_mapping`` (int64, ``page_id * page_size + offset``); ``page_table`` covers each
    row's sequence up to its last computed token (its cached prefix and the row's tokens).
    """

    page_table: PageTable
    q_indptr: npt.NDArray[np.int32]  # [batch + 1]
    positions: npt.NDArray[np.int32]  # [q_indptr[-1]]
    slot_mapping: npt.NDArray[np.int64]  # [q_indptr[-1]]


class PrefixMatch(NamedTuple):
    """The longest cached prefix of a token sequence (:meth:`KVCacheManager.match_prefix`).

    ``num_tokens`` is a whole number of pages; ``pages`` (int32) holds their ids in token order.
    Nothing is locked: admit a sequence (or pin) to keep them resident.
    """

    num_tokens: int
    pages: npt.NDArray[np.int32]


class PrefixHit(NamedTuple):
    """What a sequence's admission took from the cache, per KV-cache group
    (:meth:`KVCacheManager.prefix_hit`).

    ``num_tokens`` is the hit every group allowed (the tokens the engine skips); ``group_tokens[g]`` the
    longest hit group ``g`` alone would have allowed (a sliding-window group needs only the last
    ``ceil(window / page_size)`` pages before the hit point, a full-attention group every page before
    it). ``reason`` says why the hit is not longer: ``"full"`` (every cacheable prompt page hit),
    ``"primary_miss"`` (the cache holds no longer prefix), ``"window_pages_missing"`` (a longer
    prefix is cached, but a window group lacks the pages just before every longer hit point) or
    ``"group_pages_missing"`` (another full-attention group lacks pages of the longer prefix).
    """

    num_tokens: int
    group_tokens: list[int]
    reason: str


class MissRatioCurve(NamedTuple):
    """What more (or less) cache would have bought (:meth:`KVCacheManager.miss_ratio_curve`).

    ``hit_rate[i]`` is the share of prompt tokens an LRU cache of ``sizes_pages[i]`` pages would
    have found cached, over the admissions since the curve started (or was reset): the manager's own
    ``stats().hit_rate`` at its real size, without running the workload again at each size. Built
    online with SHARDS (a hash-sampled set of at most ``max_samples`` pages, ``sample_rate`` of all
    pages; 1.0 means exact) from the pages each admission looks up (deepest first, as the tree uses
    them) and the pages that fill as sequences grow. The real cache differs from that model where
    pages are not LRU-evictable: live sequences' pages, TTL pins, priorities, tenant quotas, window
    groups. ``max_distance_pages`` is the largest reuse distance seen: a larger cache buys nothing more
    on this workload.
    """

    sizes_pages: npt.NDArray[np.int64]
    hit_rate: npt.NDArray[np.float64]
    sample_rate: float
    num_samples: int
    max_samples: int
    lookup_pages: int
    prompt_tokens: int
    max_distance_pages: int


def _group_windows(model: object) -> list[int | None]:
    """The ``groups=`` of :meth:`KVCacheManager.for_model` (``kvcore.sizing.kv_cache_groups``)."""
    from kvcore.sizing import kv_cache_groups

    return [g.window for g in kv_cache_groups(model)]  # type: ignore[arg-type]


class TransferBatch(NamedTuple):
    """Transfers between HBM and the lower tiers, from :meth:`KVCacheManager.take_transfers`.

    **Stores** copy HBM page ``store_pages[i]`` into slot ``store_slots[i]`` of tier
    ``tier_names[store_tiers[i]]``, under page key ``store_keys[i]`` (its parent's key, tokens and
    namespace beside it, for self-describing values). Rows of one store op share its id in
    ``store_ops`` and succeed or fail together. **Loads** copy slot ``load_slots[i]`` of tier
    ``tier_names[load_tiers[i]]`` into HBM page ``load_pages[i]``; the slot must hold key
    ``load_keys[i]`` (else the load fails). Each load is its own op. Report every op with
    :meth:`KVCacheManager.complete_transfers` (``kvcore.tiers.Mover`` does both).
    """

    store_ops: npt.NDArray[np.int64]  # [n]
    store_tiers: npt.NDArray[np.int32]  # [n]
    store_pages: npt.NDArray[np.int32]  # [n]
    store_slots: npt.NDArray[np.int32]  # [n]
    store_keys: npt.NDArray[np.uint8]  # [n, 16]
    store_parent_keys: npt.NDArray[np.uint8]  # [n, 16]
    store_tokens: npt.NDArray[np.uint32]  # [n, page_size]
    store_namespaces: list[str | None]  # [n]; None: the default namespace, "*": the public one
    load_ops: npt.NDArray[np.int64]  # [m]
    load_tiers: npt.NDArray[np.int32]  # [m]
    load_slots: npt.NDArray[np.int32]  # [m]
    load_pages: npt.NDArray[np.int32]  # [m]
    load_keys: npt.NDArray[np.uint8]  # [m, 16]
    tier_names: tuple[str, ...]

    @property
    def num_ops(self) -> int:
        """Distinct ops in the batch (stores and loads)."""
        return len(np.unique(self.store_ops)) + len(self.load_ops)

    def __bool__(self) -> bool:
        return bool(len(self.store_ops) or len(self.load_ops))
