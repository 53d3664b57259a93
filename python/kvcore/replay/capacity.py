"""How many pages the replayed cache gets: given directly, or derived from a model and a GPU.

Why through :mod:`kvcore.sizing`: an operator asks "with *my* model on *my* GPU, what hit rate?", and the
page count must be the very one ``kvcore plan`` would give the pool (same weights, reserve and bytes per
page). This module only picks which sizing call answers, and keeps a sentence saying where the number
came from for the report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvcore.exceptions import ConfigError

__all__ = ["DEFAULT_GPU", "DEFAULT_MODEL", "Capacity", "resolve_capacity"]

# The deployment assumed when no capacity is given: a common single-GPU serving setup.
DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_GPU = "H100-80G"


@dataclass(frozen=True)
class Capacity:
    """The replayed cache's size."""

    pages: int  # usable pages, >= 1 (the manager is built with one more: the null page 0)
    page_size: int  # tokens per page, >= 1
    source: str  # how the figure was obtained, for the report (e.g. "llama-3.1-8b on H100-80G, bf16")
    page_bytes: int | None = None  # bytes of one page when a model is known, else None

    @property
    def tokens(self) -> int:
        """Tokens the cache holds: ``pages * page_size``."""
        return self.pages * self.page_size

    @property
    def bytes(self) -> int | None:
        """Bytes of the usable pages when a model is known."""
        return self.pages * self.page_bytes if self.page_bytes is not None else None

    def with_pages(self, pages: int) -> Capacity:
        """The same cache scaled to ``pages`` (a point of a sweep)."""
        return Capacity(pages, self.page_size, f"{pages:,} pages (sweep)", self.page_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens": self.tokens, "bytes": self.bytes}


def _positive(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what}: expected a positive integer, got {value!r}")
    return value


def resolve_capacity(
    *,
    page_size: int = 16,
    capacity_pages: int | None = None,
    capacity_tokens: int | None = None,
    capacity_bytes: int | None = None,
    model: str | None = None,
    gpu: str | None = None,
    kv_dtype: str = "bf16",
    tp: int = 1,
    weight_bytes: int | None = None,
    num_params: int | None = None,
) -> Capacity:
    """Usable pages from exactly one of: ``capacity_pages``; ``capacity_tokens`` (rounded down to
    whole pages); ``capacity_bytes`` of pool memory (needs ``model`` for the bytes of a page; the pool's
    null page is paid out of it, as in :func:`kvcore.sizing.plan`); or ``model`` on ``gpu`` through
    :func:`kvcore.sizing.plan` (``weight_bytes`` / ``num_params`` for a model that declares no weights,
    e.g. a config.json). With none of them: :data:`DEFAULT_MODEL` on :data:`DEFAULT_GPU`.

    A page is always what the replay's manager pages: ``page_size`` tokens of *every* layer (one page
    table per sequence), ``ModelSpec.page_bytes``. The plan's pool, cut for a grouped manager into pages of
    one KV-cache group, is re-cut into such pages, so ``--gpu`` and ``--capacity-bytes`` of the plan's
    ``pool_bytes`` give the same count (a hybrid model's sliding layers are not released early here).

    Raises:
        ConfigError: contradictory or invalid arguments, an unknown preset, or a capacity under one page.
    """
    from kvcore.sizing import load_model, pages_for_budget, plan

    _positive(page_size, "page_size")
    given = [x for x in (capacity_pages, capacity_tokens, capacity_bytes) if x is not None]
    if len(given) > 1:
        raise ConfigError("give one of --capacity-pages, --capacity-tokens, --capacity-bytes")
    if (weight_bytes is not None or num_params is not None) and gpu is None:
        raise ConfigError("--weight-bytes / --params size the weights on a GPU: they need --gpu")
    if (capacity_pages is not None or capacity_tokens is not None) and gpu is not None:
        raise ConfigError(
            "--gpu sizes the cache: it cannot be combined with --capacity-pages/--capacity-tokens"
        )
    page_bytes = None
    if model is not None:
        page_bytes = load_model(model).page_bytes(page_size, kv_dtype, tp)
    if capacity_pages is not None:
        pages = _positive(capacity_pages, "capacity_pages")
        return Capacity(pages, page_size, f"{pages:,} pages (given)", page_bytes)
    if capacity_tokens is not None:
        pages = _positive(capacity_tokens, "capacity_tokens") // page_size
        if pages < 1:
            raise ConfigError(
                f"capacity_tokens: {capacity_tokens} tokens is less than one page of {page_size}"
            )
        return Capacity(pages, page_size, f"{capacity_tokens:,} tokens (given)", page_bytes)
    if capacity_bytes is not None:
        if model is None or page_bytes is None:
            raise ConfigError("--capacity-bytes needs --model, to know the bytes of one page")
        if gpu is not None:
            raise ConfigError("--gpu sizes the cache: it cannot be combined with --capacity-bytes")
        pages = pages_for_budget(_positive(capacity_bytes, "capacity_bytes"), page_bytes) - 1
        if pages < 1:
            raise ConfigError(
                f"capacity_bytes: {capacity_bytes:,} B holds no usable page of {page_bytes:,} B"
            )
        return Capacity(pages, page_size, f"{capacity_bytes:,} B of {model} pages ({kv_dtype})", page_bytes)
    model = model or DEFAULT_MODEL
    gpu = gpu or DEFAULT_GPU
    p = plan(
        model,
        gpu=gpu,
        tp=tp,
        kv_dtype=kv_dtype,
        page_size=page_size,
        weight_bytes=weight_bytes,
        num_params=num_params,
    )
    # The replay's manager has one page table per sequence (no KV-cache groups), so its page holds
    # page_size tokens of every layer. The plan counts pages of one group (group_size layer slots), as a
    # grouped manager would: for a hybrid model, several of those make one replay page. The pool's bytes
    # are what both agree on, so they are re-cut into replay pages, as --capacity-bytes cuts its bytes.
    full_page = load_model(model).page_bytes(page_size, kv_dtype, tp)
    pages = pages_for_budget(p.pool_bytes, full_page) - 1
    if pages < 1:
        raise ConfigError(f"{p.model} does not leave room for K/V pages on {p.gpu}: {' '.join(p.warnings)}")
    how = "kvcore.sizing.plan"
    if p.page_bytes != full_page:
        how += f": {p.pool_bytes:,} B of {len(p.groups)}-group pages, as pages of every layer"
    source = f"{p.model} on {p.gpu}, {p.kv_dtype}" + (f", tp={tp}" if tp != 1 else "") + f" ({how})"
    return Capacity(pages, page_size, source, full_page)
