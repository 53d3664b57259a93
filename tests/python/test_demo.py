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


def test_the_help_states_the_defaults_the_demo_runs_with(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kvcore demo --help` used to promise 160 requests and 97 pages while the run used 400 and 65."""
    import kvcore.demo

    with pytest.raises(SystemExit) as e:
        kvcore.cli.main(["demo", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help lines

    def default(pattern: str) -> tuple[str, ...]:
        found = re.search(pattern, text)
        assert found is not None, pattern
        return found.groups()

    helped = {
        "requests": default(r"--requests REQUESTS requests \(default (\d+);"),
        "pages": default(r"page 0 included \(default (\d+), (\d+) usable;"),
        "page_size": default(r"tokens per page \(default (\d+)\)"),
        "seed": default(r"random seed \(default (\d+)\)"),
    }
    ran: list[tuple[object, ...]] = []
    monkeypatch.setattr(kvcore.demo, "run_engine_demo", lambda *args: ran.append(args) or 0)
    assert kvcore.cli.main(["demo", "--no-live"]) == 0
    ((num_requests, num_pages, page_size, seed, _live),) = ran
    assert helped == {
        "requests": (str(num_requests),),
        "pages": (str(num_pages), str(num_pages - 1)),  # the run prints the usable pages
        "page_size": (str(page_size),),
        "seed": (str(seed),),
    }
