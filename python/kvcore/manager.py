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

__all__ = ["PUBLIC_NAMESPACE", "CacheStats", "PageTable", "PrefixMatch"]

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


class PrefixMatch(NamedTuple):
    """The longest cached prefix of a token sequence (:meth:`KVCacheManager.match_prefix`).

    ``num_tokens`` is a whole number of pages; ``pages`` (int32) holds their ids in token order.
    Nothing is locked: admit a sequence (or pin) to keep them resident.
    """

    num_tokens: int
    pages: npt.NDArray[np.int32]
