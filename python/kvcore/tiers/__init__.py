"""Lower tiers of the KV cache: where pages go when they leave the pool, and come back from.

The Rust core decides which pages to demote or reload and hands out slot numbers; the classes here
only move bytes between a :class:`~kvcore.pool.KVPool` and a tier, and check on every load that the
slot still holds the page asked for (key, geometry, checksum), so a failure is a miss, never wrong K/V.

- :class:`HostTier`: one contiguous buffer of page-major slots in host memory (pinned on the GPU).
- :class:`DiskTier`: one self-describing, checksummed file per slot, replaced atomically.
- :class:`RedisTier`: one self-describing, checksummed value per page in Redis or a Redis Cluster,
  shared by every instance that reaches it (``exists`` answers a prefix lookup in one round trip).
- :class:`Mover`: executes a cache's ``take_transfers()`` batches through the tiers and completes
  every op (``KVCacheManager.complete_transfers``).
- :mod:`kvcore.tiers.codec`: the byte formats (page quantization, the disk header).

Both tiers take the same ``store(pool, pages, slots, keys, parent_keys, tokens, namespaces)`` /
``load(pool, slots, pages, keys)`` calls, return ``bool [n]`` per row, and count every failure by
reason in ``stats()``.
"""

from __future__ import annotations

from kvcore.tiers.disk import DiskEntry, DiskTier
from kvcore.tiers.host import HostTier
from kvcore.tiers.mover import Mover, MoveResult, Tier
from kvcore.tiers.remote import RedisTier

__all__ = [
    "DiskEntry",
    "DiskTier",
    "HostTier",
    "MoveResult",
    "Mover",
    "RedisTier",
    "Tier",
]
