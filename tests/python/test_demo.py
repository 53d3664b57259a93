"""``kvcore demo``: the live engine demo serves or refuses every request of its burst, checks answers
against a no-cache run, and leaks nothing (its exit status says so); the allocator demo still runs."""

from __future__ import annotations

import re

import pytest

import kvcore.cli


def test_the_engine_demo_accounts_for_every_request(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvcore.cli.main(["demo", "--requests", "120", "--no-live", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    served = int(re.search(r"served\s+(\d+) of 120", out).group(1))  # type: ignore[union-attr]
    refused = sum(int(n) for n in re.findall(r"(\d+) x HTTP", out))
    assert served + refused == 120 and served > 0
    assert re.search(r"checked\s+(\d+)/\1 answers equal a no-cache run", out)
    assert "LOST" not in out and "LEAKED" not in out


def test_the_allocator_demo(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--allocator", "--threads", "2", "--requests", "200", "--num-pages", "2001"]
    assert kvcore.cli.main(argv) == 0
    assert "0 leaked" in capsys.readouterr().out
