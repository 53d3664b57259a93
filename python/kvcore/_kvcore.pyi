"""Type stubs of the native module (checked against the built module by ``mypy.stubtest``)."""

from collections.abc import Sequence
from typing import TypeAlias, final

import numpy as np
import numpy.typing as npt

__all__ = ["PageAllocator", "__version__"]

__version__: str

_PageIds: TypeAlias = npt.NDArray[np.int32] | Sequence[int]

@final
class PageAllocator:
    """A fixed pool of pages with per-page reference counts; lock-free and safe to share between threads.

    Page 0 is the reserved null page: never handed out, never freed.
    """

    def __new__(cls, num_pages: int, *, num_shards: int | None = None) -> PageAllocator: ...
    def allocate(self, n: int) -> npt.NDArray[np.int32] | None:
        """``n`` distinct pages (int32, each with one reference), or None when fewer are free."""
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
