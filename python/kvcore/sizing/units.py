"""Reading and writing token counts and byte sizes the way operators type them.

Token counts use binary suffixes (``32k`` = 32,768, ``128K`` = 131,072, ``1m`` = 1,048,576) because
context lengths are quoted that way ("a 128K context" is 131,072 tokens for Llama 3.1). Byte sizes keep
the SI/IEC distinction: ``80GB`` is 80·10⁹ bytes, ``80GiB`` is 80·2³⁰; a bare number is bytes. Counts of
things (parameters) use SI suffixes: ``70B`` = 70·10⁹ parameters. A decimal exponent is accepted before the
suffix (``8e9``, ``8.03e9``, ``1.5e3KiB``), exactly (no float in between). Every parser takes a string or
an int and gives an int in ``[0, 2**63 - 1]``; anything else is a :class:`~kvcore.exceptions.ConfigError`.
"""

from __future__ import annotations

import re

from kvcore._json import show
from kvcore.exceptions import ConfigError
from kvcore.sizing.formula import check_int

__all__ = [
    "GB",
    "GiB",
    "KiB",
    "MiB",
    "TiB",
    "format_bytes",
    "format_count",
    "parse_bytes",
    "parse_count",
    "parse_tokens",
]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
GB = 10**9

# ASCII digits only, as everywhere in the CLI: \d would also take '٣' or '８'.
# An optional decimal exponent (``8e9``, ``8.03e9``: how a parameter count is often written), then a suffix.
_NUMBER = r"([0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:e([0-9]{1,2}))?"
# Longest number accepted, in characters: int64 has 19 digits; more is a typo or an attack (int() of a
# 5,000-digit string raises, and converting long ones costs quadratic time).
_MAX_NUMBER_LEN = 40
# re.ASCII: no Unicode case folding either (the Kelvin sign 'K' would otherwise match 'k').
_TOKENS_RE = re.compile(rf"^{_NUMBER}\s*([km]?)$", re.IGNORECASE | re.ASCII)
_BYTES_RE = re.compile(rf"^{_NUMBER}\s*([a-z]*)$", re.IGNORECASE | re.ASCII)
_COUNT_RE = re.compile(rf"^{_NUMBER}\s*([kmbt]?)$", re.IGNORECASE | re.ASCII)

_TOKEN_SUFFIX = {"": 1, "k": KiB, "m": MiB}
_BYTE_SUFFIX = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kib": KiB,
    "kb": 10**3,
    "m": MiB,
    "mib": MiB,
    "mb": 10**6,
    "g": GiB,
    "gib": GiB,
    "gb": GB,
    "t": TiB,
    "tib": TiB,
    "tb": 10**12,
}
_COUNT_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def _whole(match: re.Match[str], scale: int, text: str, field: str) -> int:
    number, exponent = match.group(1), match.group(2)
    if exponent is not None:
        scale *= 10 ** int(exponent)
    if len(number) > _MAX_NUMBER_LEN:
        raise ConfigError(f"{field}: {text!r:.60} has more than {_MAX_NUMBER_LEN} digits")
    # Decimal arithmetic on the digits keeps "1.5k" exact (1536) without float rounding.
    if "." in number:
        whole, frac = number.split(".")
        den = int("1" + "0" * len(frac))
        num = int(whole or "0") * den + int(frac)
    else:
        num, den = int(number), 1
    if (num * scale) % den:
        raise ConfigError(f"{field}: {text!r} is not a whole number")
    return num * scale // den


def _text(text: object, field: str, what: str) -> str | int:
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise ConfigError(f"{field}: expected {what} (a string or an int), got {show(text)}")
    return text


_THOUSANDS = re.compile(r"[0-9]{1,3}(?:,[0-9]{3})+(?![0-9,])")


def plain_number(text: str, field: str) -> str:
    """``text`` stripped, without its digit separators: ``_`` anywhere, ``,`` only between groups of
    three digits of the leading number (``1,048,576``, ``131,072k``). Any other comma is an error:
    dropping it silently turned ``1,5TB`` into 15 TB and ``--tp 1,6`` into 16."""
    t = text.strip()
    if "," in t:
        m = _THOUSANDS.match(t)
        if m is None or "," in t[m.end() :]:
            raise ConfigError(f"{field}: {text!r:.60}: a comma may only separate thousands (1,048,576)")
    return t.replace(",", "").replace("_", "")


def parse_tokens(text: str | int, field: str = "tokens") -> int:
    """Token count from ``4096``, ``32k``, ``128K`` or ``1m`` (k = 1024, m = 1024²); must be >= 0."""
    text = _text(text, field, "a token count")
    if isinstance(text, int):
        value = text
    else:
        match = _TOKENS_RE.match(plain_number(text, field))
        if match is None:
            raise ConfigError(f"{field}: {text!r} is not a token count (examples: 4096, 32k, 128K)")
        value = _whole(match, _TOKEN_SUFFIX[match.group(3).lower()], text, field)
    return check_int(value, field)


def parse_bytes(text: str | int, field: str = "bytes") -> int:
    """Byte size from ``81559MiB``, ``80GiB``, ``80GB`` (10⁹), ``1.5TiB`` or a bare number of bytes."""
    text = _text(text, field, "a size in bytes")
    if isinstance(text, int):
        value = text
    else:
        match = _BYTES_RE.match(plain_number(text, field))
        suffix = match.group(3).lower() if match else ""
        if match is None or suffix not in _BYTE_SUFFIX:
            raise ConfigError(f"{field}: {text!r} is not a size (examples: 80GiB, 24GB, 81559MiB, 1048576)")
        value = _whole(match, _BYTE_SUFFIX[suffix], text, field)
    return check_int(value, field)


def parse_count(text: str | int, field: str = "count") -> int:
    """Count with SI suffixes, for parameters: ``70B`` = 70·10⁹, ``8.03b``, ``671B``, ``405000000000``."""
    text = _text(text, field, "a count")
    if isinstance(text, int):
        value = text
    else:
        match = _COUNT_RE.match(plain_number(text, field))
        if match is None:
            raise ConfigError(f"{field}: {text!r} is not a count (examples: 8.03B, 70B, 8e9, 405000000000)")
        value = _whole(match, _COUNT_SUFFIX[match.group(3).lower()], text, field)
    return check_int(value, field)


def format_count(value: int) -> str:
    """``1342177280`` -> ``'1,342,177,280'`` (exact figures are what the tests and operators compare)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"format_count: expected an integer, got {show(value)}")
    return f"{value:,}"


def format_bytes(value: int) -> str:
    """Exact bytes plus both binary and decimal readings: ``'1,342,177,280 B (1.25 GiB, 1.34 GB)'``.

    Both readings are shown because sources mix them (the seed quotes 1.34 GB and 4 GiB).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"format_bytes: expected an integer number of bytes, got {show(value)}")
    sign = "-" if value < 0 else ""
    mag = abs(value)
    try:
        exact = f"{mag:,}"
    except ValueError:  # beyond int-to-str conversion's digit limit
        raise ConfigError(
            f"format_bytes: an integer of {mag.bit_length():,} bits is too large to print"
        ) from None
    if mag < KiB or mag.bit_length() > 1000:  # the float readings of a larger one would overflow
        return f"{sign}{exact} B"
    for unit, size, dec_unit, dec in (
        ("TiB", TiB, "TB", 10**12),
        ("GiB", GiB, "GB", GB),
        ("MiB", MiB, "MB", 10**6),
        ("KiB", KiB, "kB", 10**3),
    ):
        if mag >= size:
            return f"{sign}{exact} B ({sign}{mag / size:.2f} {unit}, {sign}{mag / dec:.2f} {dec_unit})"
    raise AssertionError("unreachable")  # pragma: no cover
