"""The disk tier: one self-describing file per slot, written so that a torn write is never visible.

Why one file per slot: a slot is rewritten under a temp name in the same directory and then renamed into
place, and POSIX renames are atomic, so a reader (a load, or this directory after a crash and restart)
finds the slot's old page, no page, or the new page, never a mix (LMCache#207, #4991: failed and partial
stores that stayed visible). The old file is itself renamed to the temp name first and overwritten in
place, which empties the slot atomically and frees no blocks (see ``DiskTier._write_one``). A crash
leaves at most a temp file, removed at the next open.

Every file carries its key, parent key, namespace, tokens and geometry (:mod:`kvcore.tiers.codec` has the
byte layout) plus XXH3-128 checksums of the header and of the payload, so the directory alone is a
restart index (:meth:`DiskTier.entries`) and a flipped bit reads as a miss, never as K/V. Headers are
verified at open (fast: one small read per file); payload checksums at load, where the payload is read
anyway.

Failure policy: an I/O error (ENOSPC, EACCES, EIO, ...) never raises out of ``store``/``load``; the row
is False and counted by reason in :meth:`DiskTier.stats`. Caller mistakes (shapes, ranges, a pool of
another geometry) raise before anything is touched.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import threading
from typing import Any, NamedTuple

import numpy as np

from kvcore.exceptions import ConfigError
from kvcore.pool import KVPool
from kvcore.pool.checks import index_array
from kvcore.tiers import _batch, codec
from kvcore.tiers.codec import Geometry, HeaderError

__all__ = ["DiskEntry", "DiskTier", "slot_filename"]

_SLOT_RE = re.compile(r"slot-(\d{8,})\.kv")
_TEMP_RE = re.compile(r"slot-(\d{8,})\.kv\.tmp")
_LOCK_NAME = "tier.lock"
PREFETCH_BYTES = 32 << 20  # read-ahead requested beyond the file being loaded (page cache, not ours)
_PREFETCH_MIN_FILES = 4  # ... but at least this many files

_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_PERMISSION = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})

_STAT_NAMES = (
    "num_slots",
    "slots_used",
    "bytes",
    "capacity_bytes",
    "stores",
    "store_failed",
    "store_failed_no_space",  # ENOSPC, EDQUOT, EFBIG
    "store_failed_permission",  # EACCES, EPERM, EROFS
    "store_failed_io",  # EIO
    "store_failed_other",  # any other OSError (EMFILE, ENAMETOOLONG, ...)
    "store_failed_namespace",  # a namespace longer than a header holds (codec.namespace_room)
    "loads",
    "load_failed",
    "load_failed_empty",  # the slot holds nothing (never stored, forgotten, or dropped on a failure)
    "load_failed_key",  # the slot holds another page
    "load_failed_geometry",  # the file is of another geometry, dtype or quantization
    "load_failed_scales",  # an fp8/int8 page stored under other pool scales
    "load_failed_checksum",  # payload checksum mismatch (file removed)
    "load_failed_corrupt",  # header unreadable or file truncated since open (file removed)
    "load_failed_io",  # an OSError while reading (ENOENT: the slot is marked empty)
    "checksum_mismatches",  # header or payload checksums that failed, at open or load
    "bytes_written",
    "bytes_read",
    "forgets",
    "remove_failed",  # files that should have been removed but could not be (unlink failed)
    "fsync_failed",  # directory fsyncs that failed (fsync=True): the renames may not be durable
    "open_entries",  # valid files found at open (what entries() lists)
    "open_removed",  # files removed at open, all reasons
    "open_removed_temp",  # temp files a crash left
    "open_removed_header",  # bad magic, version, header checksum or fields
    "open_removed_truncated",  # a size that disagrees with the header
    "open_removed_out_of_range",  # a valid file of this geometry at a slot >= num_slots
    "open_foreign",  # valid files of another geometry: skipped, left alone, not listed
    "open_unreadable",  # files that could not be read at open: left alone, not listed
)


def slot_filename(slot: int) -> str:
    """The file name of a slot: ``slot-00000042.kv`` (8 digits at least)."""
    return f"slot-{slot:08d}.kv"


class DiskEntry(NamedTuple):
    """One valid file found at open: what the Rust side needs to re-index it."""

    slot: int
    key: bytes  # 16 bytes
    parent_key: bytes  # 16 bytes
    namespace: str | None  # None (default), "*" (public) or a name
    tokens: np.ndarray  # uint32 [page_size]


def _reason(e: OSError) -> str:
    if e.errno in _NO_SPACE:
        return "store_failed_no_space"
    if e.errno in _PERMISSION:
        return "store_failed_permission"
    if e.errno == errno.EIO:
        return "store_failed_io"
    return "store_failed_other"


def _trim(views: list[memoryview], n: int) -> None:
    """Drop the first ``n`` bytes of a list of buffers (after a partial readv/writev)."""
    while views and n >= len(views[0]):
        n -= len(views.pop(0))
    if views and n:
        views[0] = views[0][n:]


def _write_all(fd: int, bufs: list[memoryview]) -> None:
    """Write every buffer, in order, with as few ``writev`` calls as the kernel allows (one, normally)."""
    views = [b for b in bufs if len(b)]
    while views:
        n = os.writev(fd, views)
        if n <= 0:
            raise OSError(errno.EIO, "writev wrote nothing")
        _trim(views, n)


def _read_all(fd: int, bufs: list[memoryview]) -> int:
    """Fill the buffers in order from ``fd`` (``readv`` straight into them); returns the bytes read
    (less than their total only at end of file)."""
    views = [b for b in bufs if len(b)]
    done = 0
    while views:
        n = os.readv(fd, views)
        if n == 0:
            break
        done += n
        _trim(views, n)
    return done


class _Prefetch:
    """A helper thread that keeps ``POSIX_FADV_WILLNEED`` read-ahead requested for the next files of
    a load, at most :data:`PREFETCH_BYTES` ahead of the file being read.

    Why a thread: WILLNEED submits the reads synchronously (about 0.2 ms per 0.5 MiB file here), so
    from the loading thread it would only move the wait; from a helper thread it keeps the device
    busy while the loading thread reads, checks and copies. One file after another at queue depth 1
    read about half as fast, cold, as one big file with the kernel's read-ahead.
    """

    def __init__(self, paths: list[str], file_bytes: int) -> None:
        self._paths = paths
        self._read = 0  # files the loader has consumed (the helper skips those)
        self._stop = False
        self._room = threading.Semaphore(max(_PREFETCH_MIN_FILES, PREFETCH_BYTES // file_bytes))
        self._thread = threading.Thread(target=self._run, name="kvcore-disk-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for i, path in enumerate(self._paths):
            self._room.acquire()
            if self._stop:
                return
            if i < self._read:
                continue  # already read: the loader was faster (a warm page cache)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # the load reports it
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass
            finally:
                os.close(fd)

    def consumed(self) -> None:
        """The loader has read one more file: the helper may request one more."""
        self._read += 1
        self._room.release()

    def close(self) -> None:
        self._stop = True
        self._room.release()
        self._thread.join()


class DiskTier:
    """Pages of pools of one geometry in ``path``, one file per slot, at most ``capacity_bytes`` in all.

    Args:
        path: the directory (created if missing). One DiskTier per directory at a time: an advisory
            lock (``tier.lock``) makes a second opener fail with ConfigError.
        capacity_bytes: the disk budget; ``num_slots = capacity_bytes // file_bytes``.
        pool: a pool of the geometry stored.
        quantize: None, ``"int8"`` or ``"int4"`` (KIVI, fp16/bf16 pools; :mod:`kvcore.tiers.codec`).
        name: the tier's name in stats and logs.
        fsync: fsync every file before its rename, and the directory after each batch (durable across
            power loss; slower). Without it a power loss can leave short or zero-filled files, which the
            header checks at open and the payload checksum at load turn into misses.

    Side effects: creates the directory and the lock file; scans the directory (see :meth:`entries`),
    removing temp files, corrupt or truncated files and files at slots beyond ``num_slots``; allocates
    a staging buffer of up to 64 MiB (pinned on the GPU backend).

    Raises:
        ConfigError: a capacity below one file, a path that is not a usable directory or is in use by
            another DiskTier, an unknown quantization or quantization of an fp8/int8 pool.

    Calls are serialized by a lock.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        capacity_bytes: int,
        pool: KVPool,
        *,
        quantize: str | None = None,
        name: str = "disk",
        fsync: bool = False,
    ) -> None:
        self.geometry = Geometry.of_pool(pool, quantize)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name: expected a non-empty string, got {name!r}")
        self.name = name
        self.quantize = quantize
        self.fsync = bool(fsync)
        self._codec = _batch.RowCodec(self.geometry)
        self.header_len = codec.header_len(self.geometry)  # bytes before the payload in every file
        self.payload_len = self._codec.row_bytes  # bytes of payload in every file
        self.file_bytes = self.header_len + self.payload_len  # bytes of every slot file
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int | np.integer):
            raise ConfigError(f"capacity_bytes: expected an integer, got {capacity_bytes!r}")
        self.num_slots = int(capacity_bytes) // self.file_bytes
        if self.num_slots < 1:
            raise ConfigError(
                f"capacity_bytes: {capacity_bytes} bytes hold no slot file of {self.file_bytes} bytes "
                f"({self.header_len} header + {self.payload_len} payload)"
            )
        self.path = os.fspath(path)
        try:
            os.makedirs(self.path, exist_ok=True)
            self._lock_fd = os.open(
                os.path.join(self.path, _LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
            )
        except OSError as e:
            raise ConfigError(f"path: {self.path!r} is not a usable directory ({e})") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(self._lock_fd)
            raise ConfigError(f"path: {self.path!r} is in use by another DiskTier ({e})") from None

        self._stats = _batch.Counters(_STAT_NAMES)
        self._lock = threading.Lock()
        self._used = np.zeros(self.num_slots, dtype=bool)  # [num_slots] bool: a valid file of ours
        self._keys = np.zeros((self.num_slots, 16), dtype=np.uint8)  # [num_slots, 16] its page key
        # [chunk_pages, payload_len] uint8: payloads between the pool and the files (pinned on the GPU)
        self._stage: np.ndarray = pool.backend.empty_host(
            (self._codec.chunk_pages, self.payload_len), np.uint8
        )
        self._stage.fill(0)
        self._whdr = bytearray(self.header_len)  # the header being written
        self._rhdr = bytearray(self.header_len)  # the header being read
        self._entries = self._scan()

    # ------------------------------------------------------------------------------------ paths

    def _file(self, slot: int) -> str:
        return os.path.join(self.path, slot_filename(slot))

    def _remove(self, path: str) -> bool:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return True
        except OSError:
            self._stats.add("remove_failed")
            return False
        return True

    def _drop(self, slot: int) -> None:
        """The slot no longer holds a valid page of ours: remove its file (if ours) and mark it empty."""
        if self._used[slot]:
            self._remove(self._file(slot))
        self._used[slot] = False

    # ------------------------------------------------------------------------------------ open

    def _scan(self) -> list[DiskEntry]:
        """Index the directory: valid files of this geometry become entries, the rest is removed or
        skipped and counted (see the ``open_*`` counters)."""
        entries: list[DiskEntry] = []
        try:
            listing = list(os.scandir(self.path))
        except OSError as e:
            raise ConfigError(f"path: cannot list {self.path!r} ({e})") from None
        for entry in listing:
            name = entry.name
            if _TEMP_RE.fullmatch(name) is not None:
                self._stats.add("open_removed_temp")
                self._stats.add("open_removed")
                self._remove(entry.path)
                continue
            m = _SLOT_RE.fullmatch(name)
            if m is None or name != slot_filename(int(m[1])):
                continue  # not a slot file of ours (the lock file, an operator's file)
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
                verdict, header = self._check_file(entry.path, entry.stat(follow_symlinks=False).st_size)
            except OSError:
                self._stats.add("open_unreadable")
                continue
            slot = int(m[1])
            if verdict == "ok" and slot >= self.num_slots:
                verdict = "out_of_range"
            if verdict == "foreign":
                self._stats.add("open_foreign")
            elif verdict != "ok":
                self._stats.add(f"open_removed_{verdict}")
                self._stats.add("open_removed")
                self._remove(entry.path)
            else:
                assert header is not None
                self._used[slot] = True
                self._keys[slot] = np.frombuffer(header.key, dtype=np.uint8)
                entries.append(
                    DiskEntry(slot, header.key, header.parent_key, header.namespace, header.tokens)
                )
        self._stats.add("open_entries", len(entries))
        entries.sort(key=lambda e: e.slot)
        return entries

    def _check_file(self, path: str, size: int) -> tuple[str, codec.PageHeader | None]:
        """``(verdict, header)``: verdict "ok", "foreign", "header" or "truncated" (from the header
        alone; the payload checksum is verified at load)."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            prefix = os.pread(fd, codec.FIXED_LEN, 0)
            if len(prefix) < codec.FIXED_LEN:
                return "truncated", None
            try:
                hlen = codec.parse_header_prefix(prefix)
            except HeaderError:
                return "header", None
            if size < hlen:
                return "truncated", None
            buf = os.pread(fd, hlen, 0)
        finally:
            os.close(fd)
        try:
            header = codec.parse_header(buf)
        except HeaderError as e:
            if e.reason == "checksum":
                self._stats.add("checksum_mismatches")
            return "header", None
        if size != header.header_len + header.payload_len:
            return "truncated", None
        if header.geometry != self.geometry:
            return "foreign", None
        if header.header_len != self.header_len or header.payload_len != self.payload_len:
            return "header", None  # our geometry but not our sizes: no writer of this format made it
        return "ok", header

    def entries(self) -> list[DiskEntry]:
        """Every valid file of this geometry found at open, by slot: the restart index.

        The Rust side re-verifies each key from its parent key, namespace and tokens before trusting
        it; an entry it rejects is :meth:`forget`-ten. Stores after open are not added (the caller
        made them).
        """
        return list(self._entries)

    # ------------------------------------------------------------------------------------ store

    def store(
        self,
        pool: KVPool,
        pages: Any,
        slots: Any,
        keys: Any,
        parent_keys: Any,
        tokens: Any,
        namespaces: list[str | None],
    ) -> np.ndarray:
        """Write pool page ``pages[i]`` (every layer, K and V) to the file of slot ``slots[i]``.

        Args:
            pool: a pool of this tier's geometry.
            pages: int32 ``[n]`` distinct page ids in ``[1, num_pages)``.
            slots: int32 ``[n]`` distinct slots in ``[0, num_slots)``; a used slot is overwritten (its
                old page, then no page, then the new one: never a mix).
            keys: uint8 ``[n, 16]``; parent_keys: uint8 ``[n, 16]``; tokens: uint32 ``[n, page_size]``;
                namespaces: ``[n]`` str or None (``"*"`` is the public namespace). All go in the header.

        Returns:
            bool ``[n]``: False where the write failed (an OSError, counted by reason as
            ``store_failed_*``, or a namespace too long for a header). A failed row's slot is empty
            afterwards: its old file is removed too, so the tier never holds what the caller thinks gone.

        Raises:
            InvalidDTypeError, InvalidPageError, InvalidArgumentError: caller mistakes (shapes, page ids,
                slots, a pool of another geometry), before anything is written.
        """
        a = _batch.check_store(
            self.geometry,
            self.num_slots,
            self.name,
            pool,
            pages,
            slots,
            keys,
            parent_keys,
            tokens,
            namespaces,
        )
        n = a.pages.shape[0]
        digest = _batch.scale_digest(pool)
        ok = np.zeros(n, dtype=bool)
        chunk = self._codec.chunk_pages
        with self._lock:
            for c in range(0, n, chunk):
                ids = a.pages[c : c + chunk]
                self._codec.pages_to_rows(pool, ids, self._stage, np.arange(ids.shape[0]))
                for j in range(ids.shape[0]):
                    ok[c + j] = self._write_one(a, c + j, self._stage[j], digest)
            if self.fsync and ok.any():
                self._fsync_dir()
            num_ok = int(ok.sum())
            self._stats.add("stores", num_ok)
            self._stats.add("store_failed", n - num_ok)
        return ok

    def _write_one(self, a: _batch.StoreArgs, i: int, row: np.ndarray, digest: bytes) -> bool:
        slot = int(a.slots[i])
        try:
            codec.pack_header(
                self._whdr,
                geometry=self.geometry,
                key=a.keys[i].tobytes(),
                parent_key=a.parent_keys[i].tobytes(),
                namespace=a.namespaces[i],
                tokens=a.tokens[i],
                payload_len=self.payload_len,
                payload_checksum=codec.checksum(row),
                scale_digest=digest,
            )
        except HeaderError:
            self._stats.add("store_failed_namespace")
            self._drop(slot)
            return False
        final = self._file(slot)
        tmp = final + ".tmp"
        fd = -1
        was_used = bool(self._used[slot])
        self._used[slot] = False  # until the new file is in place
        try:
            # Recycle the slot's old file as the temp file: renaming it away empties the slot
            # atomically, and overwriting its blocks in place frees and allocates nothing (replacing
            # files made ext4 free and discard 0.5 MiB per store: half the write throughput).
            flags = os.O_WRONLY | os.O_CLOEXEC
            recycled = False
            if was_used:
                try:
                    os.rename(final, tmp)
                    recycled = True
                except FileNotFoundError:
                    pass
            if not recycled:
                flags |= os.O_CREAT | os.O_TRUNC
            fd = os.open(tmp, flags, 0o644)
            _write_all(fd, [memoryview(self._whdr), row.data])
            if recycled:
                os.ftruncate(fd, self.file_bytes)  # a no-op for our own files, which all have this size
            if self.fsync:
                os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(tmp, final)
        except OSError as e:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if was_used:
                self._remove(final)  # the old page must not outlive a failed overwrite
            self._stats.add(_reason(e))
            return False
        self._used[slot] = True
        self._keys[slot] = a.keys[i]
        self._stats.add("bytes_written", self.file_bytes)
        return True

    def _fsync_dir(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            self._stats.add("fsync_failed")

    # ------------------------------------------------------------------------------------ load

    def load(self, pool: KVPool, slots: Any, pages: Any, keys: Any) -> np.ndarray:
        """Read slot ``slots[i]``'s file into pool page ``pages[i]`` where it holds the page ``keys[i]``.

        Args:
            pool: a pool of this tier's geometry.
            slots: int32 ``[n]`` slots in ``[0, num_slots)``.
            pages: int32 ``[n]`` distinct page ids in ``[1, num_pages)``.
            keys: uint8 ``[n, 16]`` the keys expected.

        Returns:
            bool ``[n]``: False (counted as ``load_failed_*``) for an empty slot, another key, another
            geometry/dtype/quantization or pool scales, a checksum mismatch or a corrupt file (both
            removed), or an OSError. A False row leaves its pool page untouched.

        Raises:
            InvalidDTypeError, InvalidPageError, InvalidArgumentError: caller mistakes (shapes, page ids,
                slots, a pool of another geometry), before anything is read.
        """
        s, p, k = _batch.check_load(self.geometry, self.num_slots, self.name, pool, slots, pages, keys)
        n = s.shape[0]
        digest = _batch.scale_digest(pool)
        ok = np.zeros(n, dtype=bool)
        chunk = self._codec.chunk_pages
        with self._lock:
            used = self._used[s]
            key_ok = (self._keys[s] == k).all(axis=1)
            self._stats.add("load_failed_empty", int((~used).sum()))
            self._stats.add("load_failed_key", int((used & ~key_ok).sum()))
            todo = np.flatnonzero(used & key_ok)
            paths = [self._file(slot) for slot in s[todo].tolist()]
            prefetch = _Prefetch(paths, self.file_bytes) if len(paths) > 1 else None
            try:
                for c in range(0, todo.shape[0], chunk):
                    idx = todo[c : c + chunk]
                    good = []
                    for j, i in enumerate(idx.tolist()):
                        if self._read_one(paths[c + j], int(s[i]), k[i], self._stage[j], digest):
                            good.append(j)
                        if prefetch is not None:
                            prefetch.consumed()
                    rows = np.asarray(good, dtype=np.int64)
                    self._codec.rows_to_pages(pool, self._stage, rows, p[idx[rows]])
                    ok[idx[rows]] = True
            finally:
                if prefetch is not None:
                    prefetch.close()
            num_ok = int(ok.sum())
            self._stats.add("loads", num_ok)
            self._stats.add("load_failed", n - num_ok)
        return ok

    def _read_one(self, path: str, slot: int, key: np.ndarray, row: np.ndarray, digest: bytes) -> bool:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                got = _read_all(fd, [memoryview(self._rhdr), row.data])
            finally:
                os.close(fd)
        except OSError as e:
            self._stats.add("load_failed_io")
            if e.errno == errno.ENOENT:
                self._used[slot] = False
            return False
        self._stats.add("bytes_read", got)
        try:
            hlen = codec.parse_header_prefix(self._rhdr)
            if hlen != self.header_len:
                self._stats.add("load_failed_geometry")  # not a file of this geometry: leave it
                self._used[slot] = False
                return False
            header = codec.parse_header(self._rhdr)
        except HeaderError as e:
            if e.reason == "checksum":
                self._stats.add("checksum_mismatches")
            self._stats.add("load_failed_corrupt")
            self._drop(slot)
            return False
        if header.geometry != self.geometry or header.payload_len != self.payload_len:
            self._stats.add("load_failed_geometry")
            self._used[slot] = False
            return False
        if got != self.file_bytes:
            self._stats.add("load_failed_corrupt")  # truncated since open
            self._drop(slot)
            return False
        if header.key != key.tobytes():
            self._stats.add("load_failed_key")
            return False
        if header.scale_digest != digest:
            self._stats.add("load_failed_scales")
            return False
        if codec.checksum(row) != header.payload_checksum:
            self._stats.add("load_failed_checksum")
            self._stats.add("checksum_mismatches")
            self._drop(slot)
            return False
        return True

    # ------------------------------------------------------------------------------------ rest

    def forget(self, slots: Any) -> None:
        """Delete the files of these slots (the manager dropped their pages) and mark them empty.

        Slots that hold nothing of ours are skipped (a foreign file is left alone). A file that cannot
        be removed is counted (``remove_failed``); its slot is empty all the same.

        Raises:
            InvalidDTypeError, InvalidArgumentError: slots that are not integers in ``[0, num_slots)``.
        """
        s = index_array(slots, "slots", dtype=np.int64, low=0, high=self.num_slots, what="slots")
        with self._lock:
            for slot in np.unique(s).tolist():
                if self._used[slot]:
                    self._stats.add("forgets")
                    self._drop(slot)

    def stats(self) -> dict[str, int]:
        """Counters (flat, every name always present; see ``_STAT_NAMES`` in the source for each)."""
        with self._lock:
            out = self._stats.snapshot()
            used = int(self._used.sum())
        out.update(
            num_slots=self.num_slots,
            slots_used=used,
            bytes=used * self.file_bytes,
            capacity_bytes=self.num_slots * self.file_bytes,
        )
        return out

    def close(self) -> None:
        """Release the directory lock (the files stay). The tier must not be used afterwards."""
        fd, self._lock_fd = getattr(self, "_lock_fd", -1), -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the descriptor releases the flock

    def __enter__(self) -> DiskTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        q = f", quantize={self.quantize!r}" if self.quantize else ""
        return (
            f"DiskTier(name={self.name!r}, path={self.path!r}, num_slots={self.num_slots}, "
            f"file_bytes={self.file_bytes}{q})"
        )
