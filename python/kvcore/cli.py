"""The ``kvcore`` command line: one sub-command per job.

Each job lives in its own module and registers itself through ``register(subparsers)``, which adds
its sub-parser(s) and sets ``func`` (``args -> exit code``). Modules are imported lazily by the
registration hook, never at ``import kvcore`` time.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvcore import __version__

# Modules that contribute sub-commands, in the order `kvcore --help` lists them.
_COMMAND_MODULES = ("kvcore.replay.cli", "kvcore.sizing.cli", "kvcore.demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcore",
        description="kvcore: KV-cache manager for LLM serving (allocator, prefix cache, sizing, replay).",
    )
    parser.add_argument("--version", action="version", version=f"kvcore {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    import importlib

    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    result: int = func(args)
    return result
