"""CI compile check as a test: every kernels/*.cu compiles to an sm_90 cubin with NVRTC (no GPU).

The same options and kernel names as the runtime (kvcore.kernels._nvrtc), with -Werror=all-warnings.
Skipped when ``cuda.bindings`` (and the NVRTC wheel) is not installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("cuda.bindings.nvrtc")

from kvcore.kernels import _nvrtc

KERNEL_DIR = Path(__file__).resolve().parents[2] / "kernels"
SOURCES = sorted(KERNEL_DIR.glob("*.cu"))


def test_every_family_has_a_source() -> None:
    assert {p.stem for p in SOURCES} == set(_nvrtc.KERNEL_NAMES)


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_compiles_for_sm90_without_warnings(source: Path) -> None:
    res = _nvrtc.compile_cubin(
        source.read_bytes(), source.name, "sm_90", _nvrtc.include_dirs(KERNEL_DIR), verbose=True
    )
    assert res.ok, res.log
    assert res.cubin[:4] == b"\x7fELF"
    assert _nvrtc.missing_kernels(res.cubin, _nvrtc.KERNEL_NAMES[source.stem]) == []
    report = _nvrtc.register_report(res.log)
    assert {fn for fn, _, _ in report} >= set(_nvrtc.KERNEL_NAMES[source.stem])
    assert all(spill == 0 for _, _, spill in report), report


def test_a_warning_fails_the_build(tmp_path: Path) -> None:
    bad = b'#include "common.cuh"\nextern "C" __global__ void k(int* p) { int unused = 3; p[0] = 1; }\n'
    res = _nvrtc.compile_cubin(bad, "bad.cu", "sm_90", _nvrtc.include_dirs(KERNEL_DIR))
    assert not res.ok and "unused" in res.log
