"""kvcore.sizing.plan and the ``kvcore size`` / ``kvcore plan`` commands.

The central property: weights + reserve + scales + pages (+ constant state) never exceed the GPU, and
every answer is the largest that fits (one more page, request or page of context would not).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcore.cli
from kvcore.exceptions import ConfigError
from kvcore.sizing import (
    DEFAULT_RESERVE_FRACTION,
    GPU_PRESETS,
    ModelSpec,
    Plan,
    kv_cache_bytes,
    model_from_config,
    model_preset,
    pages_for_budget,
    plan,
)
from kvcore.sizing import cli as sizing_cli

GiB = 1024**3
MiB = 1024**2
PAGE_8B = kv_cache_bytes(32, 8, 128, 16)  # one 16-token page of a Llama-3.1-8B-shaped model: 2 MiB


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = kvcore.cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# ---- plan: worked examples ------------------------------------------------------------------------


def test_seed_128k_tokens_of_budget_split_across_requests() -> None:
    # "1 requête × 128 000, ou 4 requêtes × 32 000, ou 16 requêtes × 8 K" with a cache of 131,072 tokens.
    weights, reserve = 16 * 10**9, 2 * GiB
    gpu = weights + reserve + (8192 + 1) * PAGE_8B  # 8,192 usable pages + the null page
    p = plan("llama-3.1-8b", gpu=gpu, weight_bytes=weights, reserve_bytes=reserve)
    assert (p.page_bytes, p.num_pages, p.usable_pages, p.max_active_tokens) == (PAGE_8B, 8193, 8192, 131072)
    assert p.kv_budget_bytes == p.pool_bytes == 8193 * PAGE_8B
    for context, requests in ((131072, 1), (32768, 4), (8192, 16), (8193, 15), (131073, 0)):
        q = plan("llama-3.1-8b", gpu=gpu, weight_bytes=weights, reserve_bytes=reserve, context_len=context)
        assert q.max_requests_at_context == requests
        assert q.fits == (requests > 0)
    for concurrency, context in ((1, 131072), (4, 32768), (16, 8192), (3, 43680)):
        q = plan(
            "llama-3.1-8b", gpu=gpu, weight_bytes=weights, reserve_bytes=reserve, concurrency=concurrency
        )
        assert q.max_context_at_concurrency == context
        assert q.fits


def test_requested_plan_that_does_not_fit_says_by_how_much() -> None:
    weights, reserve = 16 * 10**9, 2 * GiB
    gpu = weights + reserve + (8192 + 1) * PAGE_8B
    # Five requests of 32K need 5 × 2,048 pages + the null page: 2,048 pages more than there are.
    p = plan(
        "llama-3.1-8b", gpu=gpu, weight_bytes=weights, reserve_bytes=reserve, context_len=32768, concurrency=5
    )
    assert not p.fits
    assert p.shortfall_bytes == 2048 * PAGE_8B == 4 * GiB
    assert len(p.warnings) == 1 and "short by 4,294,967,296 B" in p.warnings[0]
    assert "4 request(s) of 32,768 tokens fit" in p.warnings[0]
    assert "at 5 request(s) the longest context is 26,208 tokens" in p.warnings[0]
    assert p.max_context_at_concurrency == 26208 == (8192 // 5) * 16


def test_weights_alone_do_not_fit() -> None:
    # Llama 3.1 70B in bf16 (141.2 GB) on one H100-80G.
    p = plan("llama-3.1-70b", gpu="H100-80G", context_len=4096)
    gpu = 81559 * MiB
    reserve = -(-gpu // 10)
    assert p.weight_bytes == p.weight_bytes_per_gpu == 141_200_000_000
    assert p.reserve_bytes == reserve
    assert p.kv_budget_bytes == gpu - 141_200_000_000 - reserve < 0
    assert (p.num_pages, p.max_active_tokens, p.max_requests_at_context, p.fits) == (0, 0, 0, False)
    need = (1 + 4096 // 16) * kv_cache_bytes(80, 8, 128, 16)
    assert p.shortfall_bytes == need - p.kv_budget_bytes
    assert "exceed the H100-80G" in p.warnings[0]


def test_tensor_parallel_divides_weights_and_heads() -> None:
    one = plan("llama-3.1-70b", gpu="H200-141G", context_len=32768)
    two = plan("llama-3.1-70b", gpu="H200-141G", tp=2, context_len=32768)
    assert two.weight_bytes_per_gpu == 70_600_000_000
    assert two.page_bytes * 2 == one.page_bytes == kv_cache_bytes(80, 8, 128, 16)
    budget = 143771 * MiB - 70_600_000_000 - -(-143771 * MiB // 10)
    assert two.kv_budget_bytes == budget
    assert two.num_pages == budget // (kv_cache_bytes(80, 4, 128, 16))
    # 8 KV heads over 16 GPUs: replicated, one head each.
    sixteen = plan("llama-3.1-70b", gpu="H200-141G", tp=16)
    assert sixteen.page_bytes == kv_cache_bytes(80, 1, 128, 16)
    with pytest.raises(ConfigError, match="tp"):
        plan("llama-3.1-70b", gpu="H200-141G", tp=3)


def test_rtx_5090_with_16_gb_of_weights() -> None:
    # The seed's 32 GB card with a 16 GB quantized model: room for a meaningful cache, minus the runtime.
    p = plan("qwen3-8b", gpu="RTX 5090", weight_bytes=16 * 10**9, context_len=32768)
    gpu = 32607 * MiB
    assert p.gpu == "RTX-5090" and p.gpu_mem_bytes == gpu
    assert p.reserve_bytes == -(-gpu // 10) > 0
    assert p.kv_budget_bytes == gpu - 16 * 10**9 - p.reserve_bytes
    assert p.num_pages == p.kv_budget_bytes // kv_cache_bytes(36, 8, 128, 16)
    assert p.fits and p.max_requests_at_context == (p.num_pages - 1) // 2048


def test_31_99_gb_on_a_32_gb_gpu_is_not_a_plan() -> None:
    # Weights + cache that add up to 31.99 GB fit a 32 GB GPU only with no runtime reserve.
    gpu = 32 * 10**9
    weights = 31_990_000_000 - (1 + 1024) * PAGE_8B  # + null page + one 16K request = 31.99 GB
    kwargs = dict(gpu=gpu, weight_bytes=weights, context_len=16384)
    assert weights + (1 + 1024) * PAGE_8B == 31_990_000_000
    default = plan("llama-3.1-8b", **kwargs)  # type: ignore[arg-type]
    assert DEFAULT_RESERVE_FRACTION > 0 and not default.fits
    assert default.shortfall_bytes == 31_990_000_000 + 3_200_000_000 - gpu
    bare = plan("llama-3.1-8b", reserve_bytes=0, **kwargs)  # type: ignore[arg-type]
    assert bare.fits and bare.max_requests_at_context == 1
    assert any("no runtime reserve" in w for w in bare.warnings)


def test_mistral_window_makes_context_unbounded() -> None:
    p = plan("mistral-7b", gpu="RTX-4090", concurrency=8)
    assert p.context_unbounded and p.max_context_at_concurrency is None and p.fits
    # Each request never holds more than the 4,096-token window: 257 pages at 16 tokens.
    q = plan("mistral-7b", gpu="RTX-4090", context_len=32768)
    assert q.pages_per_request == 257
    assert q.max_requests_at_context == (q.num_pages - 1) // 257
    # So many requests that a window no longer fits each: memory bounds the context again.
    r = plan("mistral-7b", gpu="RTX-4090", concurrency=100)
    assert not r.context_unbounded
    assert r.max_context_at_concurrency == ((r.num_pages - 1) // 100) * 16


def test_prompt_output_distribution() -> None:
    weights, reserve = 16 * 10**9, 2 * GiB
    gpu = weights + reserve + (8192 + 1) * PAGE_8B
    mix = [(24_000, 8_000), (4_000, 28_000), (2_000, 500)]
    p = plan("llama-3.1-8b", gpu=gpu, weight_bytes=weights, reserve_bytes=reserve, requests=mix)
    pages = [2000, 2000, 157]  # ceil(32000 / 16), ceil(32000 / 16), ceil(2500 / 16)
    assert p.request_lens == (32000, 32000, 2500)
    assert p.max_requests_worst_case == 8192 // 2000 == 4
    assert p.max_requests_for_mix == 8192 * 3 // sum(pages) == 5
    assert p.fits


def test_fp8_pool_sets_scales_aside_like_the_pool_does() -> None:
    p = plan("llama-3.1-8b", gpu="H100-80G", kv_dtype="fp8")
    scales = 2 * 32 * 8 * 4
    assert p.scale_bytes == scales
    assert p.page_bytes == kv_cache_bytes(32, 8, 128, 16, "fp8")
    assert p.num_pages == pages_for_budget(p.kv_budget_bytes - scales, p.page_bytes)
    bf16 = plan("llama-3.1-8b", gpu="H100-80G")
    assert bf16.scale_bytes == 0 and p.num_pages >= 2 * bf16.num_pages


def test_plan_agrees_with_kv_pool_page_count() -> None:
    pool = pytest.importorskip("kvcore.pool")
    kv_pool = getattr(pool, "KVPool", None)
    if kv_pool is None or not hasattr(kv_pool, "from_memory_budget"):
        pytest.skip("kvcore.pool.KVPool.from_memory_budget is not available")
    for dtype in ("bf16", "fp8", "int8"):
        budget = 37 * 1024**2 + 12345
        expected = plan("llama-3.2-1b", gpu=budget, weight_bytes=0, reserve_bytes=0, kv_dtype=dtype).num_pages
        built = kv_pool.from_memory_budget(
            budget, num_layers=16, num_kv_heads=8, head_dim=64, page_size=16, kv_dtype=dtype
        )
        assert built.num_pages == expected


def test_constant_state_is_set_aside_per_request() -> None:
    spec = model_preset("qwen3-next-80b-a3b")
    state = spec.state_bytes()
    p = plan(spec, gpu="H200-141G", tp=4, kv_dtype="fp8", context_len=65536, concurrency=10)
    assert p.state_bytes_per_request == spec.state_bytes(tp=4) == -(-state // 4)
    # State is set aside for the largest request count the plan states: here the requests of 64K that
    # fit (more than the 10 asked about), so that figure is true of the pool it comes with.
    assert p.max_requests_at_context is not None and p.max_requests_at_context > 10
    assert p.state_reserved_requests == p.max_requests_at_context
    assert p.num_pages == pages_for_budget(
        p.kv_budget_bytes - p.scale_bytes - p.state_reserved_requests * p.state_bytes_per_request,
        p.page_bytes,
    )


def test_plan_errors_name_the_field() -> None:
    config = {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
    }
    spec = model_from_config(config)
    with pytest.raises(ConfigError, match="weight_bytes"):
        plan(spec, gpu="H100-80G")
    with pytest.raises(ConfigError, match="weight_dtype"):
        plan(spec, gpu="H100-80G", num_params=8 * 10**9)
    assert plan(spec, gpu="H100-80G", num_params=8 * 10**9, weight_dtype="fp8").weight_bytes == 8 * 10**9
    with pytest.raises(ConfigError, match="weight_bytes"):
        plan("llama-3.1-8b", gpu="H100-80G", weight_bytes=1, num_params=1)
    with pytest.raises(ConfigError, match="did you mean 'H100-80G'"):
        plan("llama-3.1-8b", gpu="H100-8OG")
    with pytest.raises(ConfigError, match="reserve_fraction"):
        plan("llama-3.1-8b", gpu="H100-80G", reserve_fraction=1.0)
    with pytest.raises(ConfigError, match="context_len"):
        plan("llama-3.1-8b", gpu="H100-80G", context_len=0)
    with pytest.raises(ConfigError, match="page_size"):
        plan("llama-3.1-8b", gpu="H100-80G", page_size=0)
    with pytest.raises(ConfigError, match=r"requests\[1\]"):
        plan("llama-3.1-8b", gpu="H100-80G", requests=[(1, 1), (5,)])  # type: ignore[list-item]


# ---- plan: the largest that fits, never more than the GPU -------------------------------------------

MODELS = sorted(
    [
        "llama-3.1-8b",
        "mistral-7b",
        "gemma-2-9b",
        "gemma-3-1b",
        "gpt-oss-20b",
        "deepseek-v2-lite",
        "qwen3-30b-a3b",
        "phi-3-mini-4k",
    ]
)


def grouped_layout(spec: ModelSpec, tp: int) -> tuple[int, list[int | None]]:
    """Reference KV-cache groups, from the layer types alone: (elements per token of one page's layer
    slots, window of each group). Group size = fewest layers of one type; each type fills
    ceil(layers / size) groups; a page is sized for the widest type's layers."""
    types = [g for g in spec.groups if g.kind != "linear_attention"]
    size = min(g.num_layers for g in types)
    windows = [g.window for g in types for _ in range(-(-g.num_layers // size))]
    widest = max(g.elements_per_token(tp) // g.num_layers for g in types)
    return size * widest, windows


def reference_pages(num_tokens: int, page_size: int, windows: list[int | None]) -> int:
    """Pages a sequence holds: per group ceil(n / page_size), a window's at most (W - 2) // ps + 2."""
    full = -(-num_tokens // page_size)
    return sum(full if w is None else min(full, (w - 2) // page_size + 2) for w in windows)


@settings(max_examples=300, deadline=None)
@given(
    model=st.sampled_from(MODELS),
    gpu=st.sampled_from(sorted(GPU_PRESETS)),
    tp=st.sampled_from([1, 2, 4]),
    kv_dtype=st.sampled_from(["bf16", "fp8", "int8", "int4", "fp32"]),
    page_size=st.sampled_from([1, 8, 16, 32, 256]),
    weight_bytes=st.integers(0, 200 * 10**9),
    reserve_bytes=st.integers(0, 10 * GiB),
    context_len=st.integers(1, 300_000),
    concurrency=st.integers(1, 512),
)
def test_plan_is_the_largest_that_fits(
    model: str,
    gpu: str,
    tp: int,
    kv_dtype: str,
    page_size: int,
    weight_bytes: int,
    reserve_bytes: int,
    context_len: int,
    concurrency: int,
) -> None:
    spec = model_preset(model)
    p = plan(
        spec,
        gpu=gpu,
        tp=tp,
        kv_dtype=kv_dtype,
        weight_bytes=weight_bytes,
        reserve_bytes=reserve_bytes,
        page_size=page_size,
        context_len=context_len,
        concurrency=concurrency,
    )
    mem = GPU_PRESETS[gpu].mem_bytes
    weights = -(-weight_bytes // tp)
    budget = mem - weights - reserve_bytes
    assert p.kv_budget_bytes == budget
    page = p.page_bytes
    bits = {"bf16": 16, "fp8": 8, "int8": 8, "int4": 4, "fp32": 32}[kv_dtype]
    slot_elements, windows = grouped_layout(spec, tp)
    assert page == -(-page_size * slot_elements * bits // 8)
    assert list(p.group_windows) == windows
    room = budget - p.scale_bytes
    # Never more than the GPU; one more page would not fit.
    if budget >= 0:
        assert weights + reserve_bytes + p.scale_bytes + p.num_pages * page <= mem
    assert p.num_pages == max(0, room // page)
    assert p.usable_pages == max(0, p.num_pages - 1)
    assert p.max_active_tokens == p.usable_pages * page_size
    # Requests at the context: they fit, one more would not.
    per_request = reference_pages(context_len, page_size, windows)
    assert p.pages_per_request == per_request
    r = p.max_requests_at_context
    assert r is not None
    assert r * per_request <= p.usable_pages
    assert (r + 1) * per_request > p.usable_pages
    # Longest context at the concurrency: fits, one more page each would not (unless windows bound it).
    if p.context_unbounded:
        assert None not in windows
        assert concurrency * reference_pages(10**9, page_size, windows) <= p.usable_pages
    else:
        m = p.max_context_at_concurrency
        assert m is not None and m % page_size == 0
        assert concurrency * reference_pages(m, page_size, windows) <= p.usable_pages
        assert concurrency * reference_pages(m + page_size, page_size, windows) > p.usable_pages
    # What was asked (concurrency requests of context_len, plus the null page) fits or says by how much.
    need = p.scale_bytes + (concurrency * per_request + 1) * page
    assert p.fits == (need <= budget)
    assert p.shortfall_bytes == max(0, need - budget)


# ---- the command line ------------------------------------------------------------------------------


def test_register_adds_size_and_plan() -> None:
    parser = argparse.ArgumentParser(prog="kvcore")
    subparsers = parser.add_subparsers(dest="command")
    sizing_cli.register(subparsers)
    args = parser.parse_args(["size", "llama-3.1-8b", "--context", "32k"])
    assert callable(args.func) and args.context == "32k"
    args = parser.parse_args(["plan", "llama-3.1-8b", "--gpu", "H100-80G"])
    assert callable(args.func) and args.gpu == "H100-80G"


def test_cli_size_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        ["size", "llama-3.1-8b", "--context", "32k", "--batch", "4", "--kv-dtype", "fp8"], capsys
    )
    assert code == 0 and err == ""
    assert "65,536 B (64.00 KiB" in out  # per token in fp8
    assert "2,147,483,648 B (2.00 GiB" in out  # one 32K sequence
    assert "8,589,934,592 B (8.00 GiB" in out  # four of them
    assert "full_attention" in out


def test_cli_size_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["size", "Mistral-7B-v0.1", "--context", "4k,128k", "--json"], capsys)
    assert code == 0
    reports = json.loads(out)["reports"]
    assert [r["context_len"] for r in reports] == [4096, 131072]
    assert [r["kv_bytes"] for r in reports] == [536_870_912, 536_870_912]
    assert reports[1]["groups"][0]["window"] == 4096


def test_cli_size_seed_vllm_example(capsys: pytest.CaptureFixture[str]) -> None:
    # vllm serve <model> --max-model-len 32768 --kv-cache-dtype fp8  ->  2 GiB per sequence (32 layers).
    code, out, _ = run(["size", "llama-3.1-8b", "--context", "32768", "--kv-dtype", "fp8", "--json"], capsys)
    assert code == 0 and json.loads(out)["reports"][0]["sequence_bytes"] == 2 * GiB


def test_cli_size_config_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "num_hidden_layers": 80,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "hidden_size": 8192,
            }
        )
    )
    code, out, _ = run(["size", str(path), "--context", "4096", "--json"], capsys)
    assert code == 0 and json.loads(out)["reports"][0]["kv_bytes"] == 1_342_177_280


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["size", "lama-3.1-8b"], "did you mean 'llama-3.1-8b'"),
        (["size", "llama-3.1-8b", "--context", "32q"], "context"),
        (["size", "llama-3.1-8b", "--kv-dtype", "fp5"], "kv_dtype"),
        (["size", "llama-3.1-8b", "--tp", "3"], "tp"),
        (["size", "./missing/config.json"], "no such file"),
        (["size"], "model"),
        (["plan", "llama-3.1-8b"], "gpu"),
        (["plan", "llama-3.1-8b", "--gpu", "B9000"], "gpu: unknown preset"),
        (["plan", "llama-3.1-8b", "--gpu", "H100", "--reserve", "lots"], "reserve"),
        (["plan", "llama-3.1-8b", "--gpu-mem", "80 gigs"], "gpu_mem"),
    ],
)
def test_cli_errors_exit_2_without_traceback(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert out == ""


def test_cli_plan_fits(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        [
            "plan",
            "llama-3.1-70b",
            "--gpu",
            "H100-80G",
            "--tp",
            "2",
            "--kv-dtype",
            "fp8",
            "--context",
            "8k",
            "--concurrency",
            "4",
            "--request",
            "24k+8k,4k+28k",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {f.name for f in Plan.__dataclass_fields__.values()}
    assert data["fits"] and data["tp"] == 2 and data["kv_dtype"] == "fp8"
    assert data["page_bytes"] == kv_cache_bytes(80, 4, 128, 16, "fp8")
    assert data["request_lens"] == [32768, 32768]


def test_cli_plan_does_not_fit_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        [
            "plan",
            "llama-3.1-8b",
            "--gpu-mem",
            "24GiB",
            "--reserve",
            "2GiB",
            "--context",
            "128k",
            "--concurrency",
            "2",
        ],
        capsys,
    )
    assert code == 1
    assert "fits" in out and "NO: short by" in out
    assert "warning: does not fit: 2 requests of 131,072 tokens" in err


def test_cli_plan_table_and_reserve_percent(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        [
            "plan",
            "qwen3-8b",
            "--gpu",
            "RTX 5090",
            "--weight-bytes",
            "16GB",
            "--reserve",
            "5%",
            "--context",
            "32k",
        ],
        capsys,
    )
    assert code == 0
    gpu = 32607 * MiB
    reserve = -(-gpu * 5 // 100)
    num_pages = (gpu - 16 * 10**9 - reserve) // kv_cache_bytes(36, 8, 128, 16)
    assert f"{reserve:,} B" in out
    assert f"{num_pages:,} (pool num_pages" in out
    assert "measured" in out


def test_cli_list_presets(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["size", "--list-presets"], capsys)
    assert code == 0
    for name in ("llama-3.1-70b", "deepseek-v3", "gemma-3-27b", "H200-141G", "RTX-5090"):
        assert name in out


def test_model_spec_is_accepted_directly() -> None:
    spec = model_preset("llama-3.1-8b")
    assert isinstance(spec, ModelSpec)
    assert plan(spec, gpu="A100-80G").model == "llama-3.1-8b"
