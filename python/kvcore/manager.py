"""Python-side types of the KV-cache manager: the page table and the stats dataclass.

The manager itself is the native class ``kvcore.KVCacheManager`` (Rust); it builds these objects
directly, so they cost nothing unless asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["PUBLIC_NAMESPACE", "CacheStats", "PageTable"]

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


@dataclass(frozen=True)
class CacheStats:
    """One consistent snapshot of the usage split and the counters.

    The four ``num_pages_*`` splits are disjoint and sum to ``num_pages_total``.
    """

    num_pages_total: int  # usable pages (num_pages - 1; page 0 is the null page)
    num_pages_in_use: int  # held by a live sequence, or protected by a live sequence's lock
    num_pages_cached: int  # cached and evictable: only the prefix tree holds them
    num_pages_pinned: int  # cached and protected by an unexpired TTL pin (not counted as in use)
    num_pages_free: int  # in the allocator's free pool
    num_sequences: int  # live sequences
    prefix_query_tokens: int  # prompt tokens looked up by add_sequence (admitted requests)
    prefix_hit_tokens: int  # of those, tokens found cached (<= prefix_query_tokens)
    num_evicted_pages: int  # pages evicted from the prefix tree since creation
    num_cow_copies: int  # copy-on-write page copies queued since creation
    num_refused: int  # add_sequence / append calls refused for lack of pages

    @property
    def hit_rate(self) -> float:
        """Fraction of looked-up prompt tokens that were cached (0 before any lookup)."""
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0

    @property
    def usage(self) -> float:
        """Fraction of usable pages not free (in use, cached or pinned)."""
        return 1 - self.num_pages_free / self.num_pages_total if self.num_pages_total else 0.0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
