"""The plain sizing formula, and pages per budget: the single source of truth for KV bytes in kvcore.

The pool and the manager size their buffers with these functions, so a figure printed by
``kvcore size`` and the memory the pool actually allocates can never disagree.

    bytes = 2 × layers × kv_heads × head_dim × tokens × batch × bytes_per_element

The 2 counts the two cached tensors, K and V. ``kv_heads`` is ``num_key_value_heads`` (GQA), not the
number of query heads: using the query heads over-estimates a GQA cache by the group size.
"""

from __future__ import annotations

from kvcore._json import show
from kvcore.exceptions import ConfigError
from kvcore.sizing.dtypes import kv_dtype_bits, weight_dtype_bits

__all__ = [
    "MAX_INT",
    "bits_to_bytes",
    "check_int",
    "kv_cache_bytes",
    "pages_for_budget",
    "pages_per_request",
    "weight_bytes",
]

# Largest count or size kvcore accepts (int64, what the core and NumPy hold). Every figure derived from a
# few such inputs stays a small Python int, printable and exact; a count beyond it is a mistake.
MAX_INT = 2**63 - 1


def check_int(value: object, field: str, minimum: int = 0, maximum: int = MAX_INT) -> int:
    """``value`` as an int in ``[minimum, maximum]``, or ConfigError naming ``field`` (bools are not
    counts)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{field}: expected an integer, got {show(value)}")
    if value < minimum:
        raise ConfigError(f"{field}: must be >= {minimum}, got {show(value)}")
    if value > maximum:
        raise ConfigError(f"{field}: must be <= {maximum:,}, got {show(value)}")
    return value


def bits_to_bytes(bits: int) -> int:
    """Whole bytes holding ``bits`` bits (rounded up: half a byte of int4 still occupies a byte)."""
    return -(-bits // 8)


def kv_cache_bytes(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    num_tokens: int,
    kv_dtype: str = "bf16",
    batch: int = 1,
) -> int:
    """Bytes of a full-attention K/V cache: ``2 × layers × kv_heads × head_dim × tokens × batch × bytes``.

    This is the plain formula of the module docstring, without quantization scales, sliding windows
    or MLA (use :class:`kvcore.sizing.ModelSpec` for those). int4 counts half a byte per element and
    the total is rounded up to whole bytes.

    Args:
        num_layers: attention layers, >= 0.
        num_kv_heads: K/V heads per layer (``num_key_value_heads``; the heads one GPU holds under tensor
            parallelism), >= 0.
        head_dim: elements per head, >= 0.
        num_tokens: cached tokens per sequence, >= 0.
        kv_dtype: cache precision: fp32, fp16, bf16, fp8 (fp8_e4m3, e4m3), int8 or int4.
        batch: number of sequences of that length, >= 0.

    Returns:
        The exact number of bytes.

    Raises:
        ConfigError: a negative or non-integer count, or an unknown ``kv_dtype`` (the message names it).

    Example: 80 layers, 8 KV heads, head_dim 128, bf16, 4,096 tokens -> 1,342,177,280 bytes.
    """
    elements = (
        2
        * check_int(num_layers, "num_layers")
        * check_int(num_kv_heads, "num_kv_heads")
        * check_int(head_dim, "head_dim")
        * check_int(num_tokens, "num_tokens")
        * check_int(batch, "batch")
    )
    return bits_to_bytes(elements * kv_dtype_bits(kv_dtype))


def pages_for_budget(budget_bytes: int, page_bytes: int) -> int:
    """How many whole pages of ``page_bytes`` fit in ``budget_bytes`` (0 when the budget is negative).

    A negative budget is not an error: it is how a plan that does not fit reports "no room"; the plan
    itself says by how much it is short.

    Raises:
        ConfigError: ``page_bytes`` is not a positive integer, or ``budget_bytes`` is not an integer.
    """
    check_int(budget_bytes, "budget_bytes", minimum=-MAX_INT)
    check_int(page_bytes, "page_bytes", minimum=1)
    return max(0, budget_bytes // page_bytes)


def pages_per_request(num_tokens: int, page_size: int, window: int | None = None) -> int:
    """Pages a sequence of ``num_tokens`` holds: ``ceil(n / page_size)``, bounded by a window if given.

    A window of ``W`` tokens spans at most ``(W - 2) // page_size + 2`` pages (its first and last pages may
    be partly outside it), so that is the bound, not ``ceil(W / page_size)``.
    """
    check_int(num_tokens, "num_tokens")
    check_int(page_size, "page_size", minimum=1)
    pages = -(-num_tokens // page_size)
    if window is not None and num_tokens > 0:
        pages = min(pages, _window_pages(check_int(window, "window", minimum=1), page_size))
    return pages


def _window_pages(window: int, page_size: int) -> int:
    """Most pages a window of ``window`` tokens touches, whatever its alignment (arguments checked).

    W consecutive tokens starting at offset r within a page end in page ``(r + W - 1) // page_size``; the
    worst offset is ``r = page_size - 1``.
    """
    return (window - 2) // page_size + 2


def weight_bytes(num_params: int, weight_dtype: str = "bf16") -> int:
    """Estimated weight bytes: parameters × bytes per weight (70·10⁹ params in int4 -> 35·10⁹ bytes).

    Only an estimate: quantized checkpoints carry scales, some layers stay in higher precision, and
    embeddings may be tied. A measured checkpoint size should be preferred whenever it exists.
    """
    return bits_to_bytes(check_int(num_params, "num_params") * weight_dtype_bits(weight_dtype))
