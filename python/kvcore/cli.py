"""The ``kvcore`` command line: one sub-command per job.

Each job lives in its own module and registers itself through ``register(subparsers)``, which adds
its sub-parser(s) and sets ``func`` (``args -> exit code``). Modules are imported lazily by the
registration hook, never at ``import kvcore`` time.

Errors: :func:`main` is the one place that turns what a user can cause into one line on stderr and
exit code 2, never a traceback: a bad flag (the parsers below print one line, not the usage), any
:class:`~kvcore.exceptions.KVCoreError` (the jobs raise ``ConfigError`` / ``TraceFormatError`` naming the
file, line and field), running out of memory (``MemoryError``, including the core's
``OutOfMemoryError``), and a file that cannot be read or written (``OSError``). Sub-commands do not
catch errors themselves. A reader that closes the output early (``kvcore size ... | head -1``) is not
an error of the user's: the output stops quietly, with exit code 141 (128 + SIGPIPE, what a shell
reports for a command a closed pipe ends) and no message. Flags that argparse converts to numbers use
:func:`int_arg` and :func:`float_arg` (ASCII digits, bounds, finite); the sizing commands parse theirs as
sizes and counts.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from kvcore import __version__
from kvcore.exceptions import KVCoreError

__all__ = ["build_parser", "float_arg", "int_arg", "main"]

# Modules that contribute sub-commands, in the order `kvcore --help` lists them.
_COMMAND_MODULES = ("kvcore.replay.cli", "kvcore.sizing.cli", "kvcore.demo")
_INT64 = 2**63 - 1  # the largest count a flag takes (what the core holds)
_EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE: what a shell reports for a writer a closed pipe ended


class _UsageError(Exception):
    """A flag argparse refused; :func:`main` prints it as one line."""


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (``PROG: error: ...``) rather than the usage and
    a line; sub-parsers are made of the same class."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


def int_arg(minimum: int, maximum: int = _INT64) -> Callable[[str], int]:
    """An argparse ``type=`` for a whole number in ``[minimum, maximum]`` written in ASCII digits
    (``int()`` alone takes ``" 1_0 "`` and refuses ``"²"``, which ``str.isdigit`` accepts)."""

    def parse(text: str) -> int:
        digits = text[1:] if text.startswith("-") else text
        if not (digits.isascii() and digits.isdigit()):
            raise argparse.ArgumentTypeError(f"{text!r:.60} is not a whole number")
        value = int(text) if len(digits) <= 19 else None  # more digits: beyond any bound, not converted
        if value is None or not minimum <= value <= maximum:
            too_big = value is None or value > maximum
            bound = (
                f">= {minimum:,}" if maximum == _INT64 and not too_big else f"in [{minimum:,}, {maximum:,}]"
            )
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text:.60}")
        return value

    parse.__name__ = "whole number"
    return parse


def float_arg(minimum: float, *, strict: bool = False) -> Callable[[str], float]:
    """An argparse ``type=`` for a finite number ``>= minimum`` (``> minimum`` when ``strict``):
    ``float()`` also reads ``inf`` and ``nan``, which no rate or time can be and no JSON report holds."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r:.60} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r:.60} is not a finite number")
        if value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {minimum:g}, got {value:g}")
        return value

    parse.__name__ = "number"
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kvcore",
        description="kvcore: KV-cache manager for LLM serving (allocator, prefix cache, sizing, replay).",
    )
    parser.add_argument("--version", action="version", version=f"kvcore {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    import importlib

    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())  # messages quoting a file's text stay on one line
    if isinstance(exc, MemoryError):
        return f"out of memory: {text}" if text else "out of memory"
    return text or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kvcore ARGV``; returns the exit code (2 for every error a user can cause, 141 when the
    reader of stdout closed it early; see the module docs)."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at exit: a closed pipe is found while it can still be handled
    except BrokenPipeError:
        # Python's recipe (the signal module's note on SIGPIPE): point stdout at devnull, so the flush
        # at interpreter exit does not fail a second time and print "Exception ignored".
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # no real file descriptor behind stdout (an in-process capture)
            pass
        return _EXIT_BROKEN_PIPE
    return code


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        result: int = func(args)
    except BrokenPipeError:
        raise  # stdout closed by its reader: main ends quietly
    except (KVCoreError, MemoryError, OSError) as exc:
        print(f"kvcore {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    return result
