"""Strict JSON for the files kvcore reads (model ``config.json`` files, workload traces).

Why not plain :func:`json.loads`: it accepts what JSON forbids and what kvcore can neither use nor write
back (``NaN``, ``Infinity``, and ``1e999``, which overflows to infinity), and it fails on hostile input
with errors that do not say what is wrong: ``UnicodeDecodeError`` for bytes that are not UTF-8,
``RecursionError`` for deep nesting, and an integer-conversion ``ValueError`` for a 5,000-digit number.
:func:`loads` refuses each of them with :class:`JSONInputError`, a ``ValueError`` whose message says what
it found; the caller adds where (file, line) and raises its own error (``ConfigError``,
``TraceFormatError``). Memory stays bounded by the text: nothing here sizes anything by a number in it.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

__all__ = ["JSONInputError", "decode_utf8", "loads", "show"]

_INT64 = 2**63 - 1


class JSONInputError(ValueError):
    """A JSON text kvcore refuses; the message says what is wrong but not where the text came from."""


def decode_utf8(data: bytes) -> str:
    """``data`` as text, or JSONInputError naming the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONInputError(
            f"not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def _no_constant(name: str) -> Any:
    raise JSONInputError(f"{name} is not a finite number (JSON has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONInputError(f"{text} is not a finite number (it overflows a double)")
    return value


# One decoder, made once: json.loads with hooks would build a new one per call (a trace calls per line).
_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)


def loads(text: str) -> Any:
    """Parse one JSON document, refusing non-finite numbers, integers too long to convert, and nesting
    deeper than the interpreter's recursion limit.

    Raises:
        JSONInputError: the text is not JSON kvcore accepts (the message says why; a position is given
            as ``line L column C``, or ``column C`` for a one-line text).
    """
    try:
        return _DECODER.decode(text)
    except JSONInputError:
        raise
    except json.JSONDecodeError as exc:
        where = f"column {exc.colno}" if exc.lineno == 1 else f"line {exc.lineno} column {exc.colno}"
        raise JSONInputError(f"not valid JSON ({exc.msg} at {where})") from None
    except RecursionError:
        raise JSONInputError("not valid JSON for kvcore: arrays or objects nested too deeply") from None
    except ValueError:
        # The only other ValueError json.loads raises: an integer beyond int() conversion's digit limit.
        limit = sys.get_int_max_str_digits()
        raise JSONInputError(f"holds an integer of more than {limit:,} digits") from None


def show(value: object) -> str:
    """A value read from a file, for an error message: short, and safe for any value the parser gives.

    Containers by their kind only (the repr of a list nested 900 deep exhausts the stack), integers
    beyond int64 by their bit length (printing a 4,000-digit one is slow or refused), text cut at 40
    characters.
    """
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value) if -_INT64 <= value <= _INT64 else f"an integer of {value.bit_length():,} bits"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    text = repr(value) if isinstance(value, (str, bytes)) else f"a value of type {type(value).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."
