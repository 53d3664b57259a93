"""KV events for KV-aware routers: what entered and left a manager's cache, in order.

Returned by :meth:`kvcore.KVCacheManager.take_events` when the manager was built with
``events=True``. They carry the same content as vLLM's KV events, so a router that indexes vLLM
instances (llm-d, Dynamo) can index kvcore ones:

=====================================  =========================================================
kvcore                                 vLLM (``vllm.distributed.kv_events``)
=====================================  =========================================================
``PageStored(keys, parent_key,         ``BlockStored(block_hashes, parent_block_hash, token_ids,
namespace, medium, pages, tokens)``    block_size, lora_id, medium)``; the namespace plays the
                                       part of vLLM's cache salt (part of every key)
``PageRemoved(keys, medium, pages)``   ``BlockRemoved(block_hashes, medium)``
``AllCleared(medium)``                 ``AllBlocksCleared()``
=====================================  =========================================================

Keys are the 16-byte page keys of ``docs/api.md`` (chained SHA-256 over the cache fingerprint, the
namespace and the tokens), so a router can compute a request's keys with :func:`kvcore.page_keys`
and look them up. ``pages`` (int32) are the page ids (a lower tier can see what leaves the HBM).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["AllCleared", "KVEvent", "PageRemoved", "PageStored"]


class PageStored(NamedTuple):
    """Pages entered the cache; ``parent_key`` is the key of the page before the first (None: root)."""

    keys: list[bytes]
    parent_key: bytes | None
    namespace: str | None  # None: the default namespace; "*": the public one
    medium: str  # "hbm"
    pages: npt.NDArray[np.int32]
    tokens: npt.NDArray[np.uint32]  # [len(keys) * page_size] the pages' token ids (vLLM's token_ids)


class PageRemoved(NamedTuple):
    """Pages left the cache (evicted, or dropped by ``reset_prefix_cache``)."""

    keys: list[bytes]
    medium: str
    pages: npt.NDArray[np.int32]


class AllCleared(NamedTuple):
    """Nothing is cached in ``medium`` any more: ``"hbm"`` when ``reset_prefix_cache`` left no page;
    every medium in turn at the start of a snapshot (after the event log overflowed, see
    ``docs/api.md``), each followed by that medium's whole content as :class:`PageStored` events."""

    medium: str = "hbm"


KVEvent = PageStored | PageRemoved | AllCleared
