"""Regression tests for a hostile review of sizing, plan, the demo and the metrics.

Every expectation is worked out here by hand, from the config fields and the rule the docstrings state;
the configs are minimal synthetic ones written for the test, not copies of real model files.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvcore
import kvcore.cli
from kvcore.exceptions import ConfigError
from kvcore.sizing import (
    LayerGroup,
    ModelSpec,
    model_from_config,
    pages_for_budget,
    parse_bytes,
    parse_count,
    parse_tokens,
    plan,
)

# ---- 1. Mamba hybrids and cross-attention -------------------------------------------------------------


def jamba_like(**extra: Any) -> dict[str, Any]:
    """8 layers; attention where i % 4 == 1 (layers 1 and 5), Mamba elsewhere (HF Jamba's rule)."""
    return {
        "model_type": "jamba",
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 64,  # head_dim 16
        "attn_layer_period": 4,
        "attn_layer_offset": 1,
        "mamba_d_state": 4,
        "mamba_d_conv": 3,
        "mamba_expand": 2,
        "torch_dtype": "bfloat16",
        **extra,
    }


def nemotron_h_like(**extra: Any) -> dict[str, Any]:
    """6 layers "M-*EM*": Mamba2 at 0 and 4, attention at 2 and 5, MLP at 1, MoE at 3."""
    return {
        "model_type": "nemotron_h",
        "num_hidden_layers": 6,
        "hybrid_override_pattern": "M-*EM*",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_size": 64,
        "mamba_num_heads": 4,
        "mamba_head_dim": 8,
        "ssm_state_size": 4,
        "conv_kernel": 4,
        "n_groups": 2,
        "torch_dtype": "bfloat16",
        **extra,
    }


def test_jamba_caches_k_and_v_only_in_its_attention_layers() -> None:
    spec = model_from_config(jamba_like())
    # 2 attention layers x K and V x 2 heads x 16 x 2 bytes.
    assert spec.bytes_per_token() == 2 * 2 * 2 * 16 * 2 == 256
    assert spec.kv_bytes(1000) == 1000 * 256
    # Mamba1 state per layer (vLLM): d_inner = 2 x 64 = 128; conv 128 x (3 - 1) + SSM 128 x 4 elements.
    assert spec.state_bytes() == 6 * (128 * 2 + 128 * 4) * 2 == 9216
    assert [(g.kind, g.num_layers) for g in spec.groups] == [("mamba", 6), ("full_attention", 2)]
    assert [g.layer_indices for g in spec.kv_cache_groups()] == [(1, 5)]
    assert spec.describe() == "8 layers: 6 mamba + 2 full_attention"


def test_nemotron_h_caches_k_and_v_only_in_its_star_layers() -> None:
    spec = model_from_config(nemotron_h_like())
    assert spec.bytes_per_token() == 2 * 2 * 2 * 16 * 2 == 256
    # Mamba2 state per layer (vLLM): d_inner = 4 x 8 = 32; conv (4 - 1) x (32 + 2 x 2 x 4) in the
    # model's bf16, SSM 32 x 4 in float32 (vLLM's mamba_ssm_cache_dtype default for Nemotron-H).
    per_layer = 3 * (32 + 16) * 2 + 32 * 4 * 4
    assert spec.state_bytes() == 2 * per_layer == 1600
    kinds = {g.kind: g.num_layers for g in spec.groups}
    assert kinds == {"mamba": 2, "mlp": 2, "full_attention": 2}
    assert [g.layer_indices for g in spec.kv_cache_groups()] == [(2, 5)]
    report = kvcore.sizing.size(nemotron_h_like(), 100)
    assert report.kv_bytes == 100 * 256 and report.state_bytes == 1600
    assert report.total_bytes == 100 * 256 + 1600


@pytest.mark.parametrize(("ssm", "want"), [("bfloat16", 1088), ("auto", 1088), ("float32", 1600)])
def test_nemotron_h_ssm_state_takes_its_cache_dtype(ssm: str, want: int) -> None:
    assert model_from_config(nemotron_h_like(mamba_ssm_cache_dtype=ssm)).state_bytes() == want
    with pytest.raises(ConfigError, match="mamba_ssm_cache_dtype"):
        model_from_config(nemotron_h_like(mamba_ssm_cache_dtype="float13"))


def test_a_quantized_checkpoint_keeps_its_state_in_the_activation_dtype() -> None:
    """4-bit weights do not make a 4-bit Mamba state: the state is in torch_dtype."""
    quant = {"quantization_config": {"quant_method": "awq", "bits": 4}}
    assert (
        model_from_config(jamba_like(**quant)).state_bytes() == model_from_config(jamba_like()).state_bytes()
    )


@pytest.mark.parametrize("config", [jamba_like, nemotron_h_like])
def test_shared_kv_layers_with_a_mamba_layout_are_refused(config: Any) -> None:
    with pytest.raises(ConfigError, match="num_kv_shared_layers"):
        model_from_config(config(num_kv_shared_layers=2))


def test_state_layers_count_in_the_group_size_as_in_vllm() -> None:
    """vLLM's min/max layer counts include the Mamba layers: "***M" pages in groups of 1 (3 groups)."""
    spec = model_from_config(nemotron_h_like(num_hidden_layers=4, hybrid_override_pattern="***M"))
    groups = spec.kv_cache_groups()
    assert [g.layer_indices for g in groups] == [(0,), (1,), (2,)] and groups[0].group_size == 1


def test_a_hybrid_plan_sets_its_mamba_state_aside() -> None:
    p = plan(jamba_like(), gpu=10**9, weight_bytes=0, reserve_bytes=0, context_len=1024)
    assert p.state_bytes_per_request == 9216 and p.state_reserved_requests == p.max_requests_at_context
    assert p.pool_bytes + p.state_reserved_bytes <= p.kv_budget_bytes


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({**jamba_like(), "attn_layer_period": None}, "attn_layer_period"),  # jamba must say its layout
        (jamba_like(attn_layer_offset=None), "attn_layer_offset"),
        (jamba_like(attn_layer_offset=4), "attn_layer_offset"),  # never attends
        (jamba_like(mamba_d_state=None), "mamba_d_state"),
        (jamba_like(torch_dtype=None), "torch_dtype"),
        (jamba_like(sliding_window=4096), "sliding_window"),
        (jamba_like(layer_types=["full_attention"] * 8), "layer_types"),
        ({**nemotron_h_like(), "hybrid_override_pattern": None}, "hybrid_override_pattern"),
        (nemotron_h_like(hybrid_override_pattern="M-*EM"), "hybrid_override_pattern"),
        (nemotron_h_like(hybrid_override_pattern="M-*XM*"), "hybrid_override_pattern"),
        (nemotron_h_like(hybrid_override_pattern=6), "hybrid_override_pattern"),
        (nemotron_h_like(n_groups=None), "n_groups"),
        (nemotron_h_like(attn_layer_period=2), "attn_layer_period"),
    ],
)
def test_hybrid_layouts_are_read_exactly_or_refused(config: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        model_from_config(config)


def test_cross_attention_layers_are_refused_not_sized_as_text_layers() -> None:
    mllama = {
        "model_type": "mllama",
        "text_config": {
            "model_type": "mllama_text_model",
            "num_hidden_layers": 10,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_size": 64,
            "cross_attention_layers": [3, 8],
        },
    }
    with pytest.raises(ConfigError, match=r"text_config\.cross_attention_layers: .*image tokens"):
        model_from_config(mllama)
    for field in ("attn_layer_indices", "layers_block_type"):
        config = {"num_hidden_layers": 4, "num_attention_heads": 4, "hidden_size": 64, field: [1]}
        with pytest.raises(ConfigError, match=field):
            model_from_config(config)


# ---- 2. the allocator demo with a small pool ----------------------------------------------------------


def test_allocator_demo_refuses_requests_longer_than_the_pool(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--allocator", "--num-pages", "100", "--requests", "300", "--threads", "2"]
    assert kvcore.cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Error" not in err
    found = re.search(r"([\d,]+) admitted, ([\d,]+) refused \(pool full\), ([\d,]+) refused \(longer", out)
    assert found is not None, out
    admitted, full, too_long = (int(n.replace(",", "")) for n in found.groups())
    assert admitted + full + too_long == 2 * 300 and too_long > 0
    assert "0 leaked" in out


def test_allocator_demo_reports_a_failed_worker(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvcore.demo

    def broken(*_args: object) -> None:
        raise kvcore.exceptions.InvalidArgumentError("boom")

    monkeypatch.setattr(kvcore.demo, "_serve", broken)
    assert kvcore.demo.run_allocator_demo(2, 10, 101, 16) == 1
    out, err = capsys.readouterr()
    assert "FAILED          thread 0: InvalidArgumentError: boom" in out and "Traceback" not in err


# ---- 3. constant state and the pool it comes with -----------------------------------------------------


@pytest.mark.parametrize(
    "ask",
    [
        dict(context_len=32768, concurrency=8),
        dict(context_len=32768),
        dict(concurrency=8),
        dict(context_len=4096, concurrency=500),
        dict(requests=[(1000, 200), (30000, 2000)]),
        dict(requests=[(1000, 200)], concurrency=3, context_len=8192),
    ],
    ids=repr,
)
def test_constant_state_figures_hold_in_the_pool_planned(ask: dict[str, Any]) -> None:
    p = plan("qwen3-next-80b-a3b", gpu="H100-80G", tp=4, **ask)
    assert p.state_bytes_per_request > 0
    # The pool, the scales and the states set aside fit the budget ...
    assert p.pool_bytes + p.scale_bytes + p.state_reserved_bytes <= p.kv_budget_bytes
    assert p.num_pages == pages_for_budget(
        p.kv_budget_bytes - p.scale_bytes - p.state_reserved_bytes, p.page_bytes
    )
    # ... and no request count the plan gives needs more states or pages than it has.
    counts = [p.concurrency, p.max_requests_at_context, p.max_requests_for_mix, p.max_requests_worst_case]
    assert max(c for c in counts if c is not None) == p.state_reserved_requests
    if p.max_requests_at_context is not None and p.pages_per_request:
        assert p.max_requests_at_context * p.pages_per_request <= p.usable_pages
    if p.max_requests_worst_case is not None:
        longest = max(p.request_lens)
        pages = sum(g.pages_per_sequence(longest, p.page_size) for g in p.groups)
        assert p.max_requests_worst_case * pages <= p.usable_pages
    if p.max_context_at_concurrency is not None and p.concurrency is not None:
        ctx = p.max_context_at_concurrency
        assert p.concurrency * sum(g.pages_per_sequence(ctx, p.page_size) for g in p.groups) <= p.usable_pages


def test_no_state_set_aside_says_why() -> None:
    p = plan("qwen3-next-80b-a3b", gpu="H100-80G", tp=4, context_len=2**62)
    assert p.state_reserved_requests == 0
    (state_warning,) = [w for w in p.warnings if "constant-state" in w]
    assert "give concurrency or context_len" not in state_warning
    assert "not one request of 4,611,686,018,427,387,904 tokens fits" in state_warning
    bare = plan("qwen3-next-80b-a3b", gpu="H100-80G", tp=4)
    assert any("give concurrency or context_len" in w for w in bare.warnings)


# ---- 4. more KV-cache groups than the manager takes ---------------------------------------------------

MAX_KV_CACHE_GROUPS = 64  # MAX_GROUPS in rust/manager/groups.rs


def many_groups(num_sliding: int) -> dict[str, Any]:
    return {
        "model_type": "x",
        "num_hidden_layers": 1 + num_sliding,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "sliding_window": 1024,
        "layer_types": ["full_attention"] + ["sliding_attention"] * num_sliding,
    }


def test_the_group_limit_is_the_managers() -> None:
    assert kvcore.sizing.MAX_KV_CACHE_GROUPS == MAX_KV_CACHE_GROUPS
    kvcore.KVCacheManager(num_pages=8, page_size=16, groups=[None] * MAX_KV_CACHE_GROUPS)
    with pytest.raises(kvcore.exceptions.InvalidArgumentError, match=str(MAX_KV_CACHE_GROUPS)):
        kvcore.KVCacheManager(num_pages=8, page_size=16, groups=[None] * (MAX_KV_CACHE_GROUPS + 1))


def test_a_plan_the_manager_cannot_build_is_refused() -> None:
    fits = plan(many_groups(63), gpu="H100-80G", weight_bytes=10**9, context_len=32768)
    assert len(fits.groups) == 64 and fits.fits
    kvcore.KVCacheManager(**fits.manager_kwargs())
    with pytest.raises(ConfigError, match="at most 64"):
        plan(many_groups(64), gpu="H100-80G", weight_bytes=10**9, context_len=32768)


def test_cli_plan_with_too_many_groups_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(many_groups(99)))
    assert kvcore.cli.main(["plan", str(path), "--gpu", "H100", "--weight-bytes", "1GB"]) == 2
    assert "at most 64" in capsys.readouterr().err


# ---- 5. vLLM's group size ----------------------------------------------------------------------------


def test_group_size_is_the_largest_count_when_below_1_25_times_the_smallest() -> None:
    # 12 sliding + 13 full (gpt-oss-20b + an EAGLE layer in vLLM's comment): groups of 13, not 12.
    config = {
        **many_groups(0),
        "num_hidden_layers": 25,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 12 + ["full_attention"],
    }
    groups = model_from_config(config).kv_cache_groups()
    assert [(g.kind, g.num_layers, g.group_size) for g in groups] == [
        ("sliding_attention", 12, 13),
        ("full_attention", 13, 13),
    ]
    # 4 vs 5 is exactly 1.25 times: not below it, so the smallest count, 4, is the size.
    config = {
        **config,
        "num_hidden_layers": 9,
        "layer_types": ["sliding_attention"] * 4 + ["full_attention"] * 5,
    }
    groups = model_from_config(config).kv_cache_groups()
    assert [(g.kind, g.layer_indices, g.group_size) for g in groups] == [
        ("sliding_attention", (0, 1, 2, 3), 4),
        ("full_attention", (4, 6, 8), 4),
        ("full_attention", (5, 7), 4),
    ]


# ---- 6, 7. ASCII digits, and empty flags --------------------------------------------------------------


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (parse_tokens, "٣"),
        (parse_tokens, "１２８k"),
        (parse_tokens, "4\u212a"),  # KELVIN SIGN, which folds to 'k'
        (parse_bytes, "８０GB"),
        (parse_bytes, "80\u212aiB"),
        (parse_count, "٧B"),
    ],
    ids=ascii,
)
def test_units_take_ascii_digits_only(parse: Any, text: str) -> None:
    with pytest.raises(ConfigError):
        parse(text)


@pytest.mark.parametrize("flag", ["--concurrency", "--context", "--params", "--weight-bytes", "--reserve"])
def test_an_empty_plan_flag_is_an_error(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert kvcore.cli.main(["plan", "llama-3.1-8b", "--gpu", "H100", flag, ""]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err


# ---- 8, 12. reading config files ----------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_config_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    code = (
        "import kvcore.sizing as s, sys\n"
        "try: s.model_from_config(sys.argv[1])\n"
        "except Exception as e: print(e)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60)
    assert "is not a regular file" in done.stdout


@pytest.mark.parametrize(
    ("text", "kind"),
    [("null", "null"), ('"x"', "string"), ("3", "number"), ("[1]", "array"), ("true", "boolean")],
)
def test_a_config_that_is_not_an_object_says_its_json_type(tmp_path: Path, text: str, kind: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"holds a JSON {kind}, not an object$"):
        model_from_config(path)


def test_a_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    config = {"num_hidden_layers": 4, "num_attention_heads": 4, "hidden_size": 64}
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(config).encode())
    assert model_from_config(path).bytes_per_token() == model_from_config(config).bytes_per_token()


@pytest.mark.parametrize("where", ["top", "text_config"])
def test_is_encoder_decoder_must_be_a_boolean(where: str) -> None:
    text = {"num_hidden_layers": 4, "num_attention_heads": 4, "hidden_size": 64}
    config: dict[str, Any] = {**text, "is_encoder_decoder": "yes"}
    if where == "text_config":
        config = {"is_encoder_decoder": False, "text_config": {**text, "is_encoder_decoder": "yes"}}
    with pytest.raises(ConfigError, match="is_encoder_decoder: expected true or false, got 'yes'"):
        model_from_config(config)
    with pytest.raises(ConfigError, match="encoder-decoder models are not supported"):
        model_from_config({**text, "is_encoder_decoder": True})
    assert model_from_config({**text, "is_encoder_decoder": False}).num_layers == 4


# ---- 9. LayerGroup takes integers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(num_tensors=2.0), "num_tensors"),
        (dict(num_kv_heads=8.0), "num_kv_heads"),
        (dict(head_dim=128.0), "head_dim"),
        (dict(num_tensors=True), "num_tensors"),
    ],
    ids=repr,
)
def test_layer_group_fields_are_integers(kwargs: dict[str, Any], field: str) -> None:
    shape: dict[str, Any] = {"num_kv_heads": 8, "head_dim": 128, "num_tensors": 2, **kwargs}
    with pytest.raises(ConfigError, match=field):
        LayerGroup("full_attention", 32, **shape)
    with pytest.raises(ConfigError, match="window"):
        LayerGroup("sliding_attention", 32, 8, 128, window=16.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="num_kv_heads"):
        LayerGroup("linear_attention", 4, 0.0, 0, num_tensors=0, state_bytes=8)  # type: ignore[arg-type]
    assert ModelSpec("x", (LayerGroup("full_attention", 32, 8, 128),), 32).bytes_per_token() == 131_072


# ---- 10. storage stats in Prometheus ------------------------------------------------------------------


def storage_text(extra: dict[str, int]) -> str:
    from kvcore.tiers import HostTier, Mover
    from kvcore.tiny import TinyDecoder, TinyEngine

    pool = TinyEngine.make_pool(TinyDecoder(1, "fp16"), 12, 4)

    class Custom(HostTier):
        def stats(self) -> dict[str, int]:
            return {**super().stats(), **extra}

    tier = Custom(pool, 16)
    cache = kvcore.KVCacheManager(12, 4, lower_tiers=[tier])
    return Mover(cache, pool, [tier]).metrics_text()


def test_storage_counters_are_prometheus_counters() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    text = storage_text({})
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    for stat in ("stores", "loads", "bytes_written", "bytes_read", "forgets", "load_failed_key"):
        assert types[f"kvcore_tier_storage_{stat}"] == "counter"
        assert re.search(rf"^kvcore_tier_storage_{stat}_total\{{tier=\"host\"\}} ", text, re.M)
    assert "kvcore_tier_storage_checksum" not in text  # host memory keeps no checksum: no dead counter
    for stat in ("bytes", "slots_used", "num_slots", "capacity_bytes"):
        assert types[f"kvcore_tier_storage_{stat}"] == "gauge"
    # As the cache's own counters are.
    assert types["kvcore_prefix_hit_tokens"] == "counter"


def test_custom_storage_stats_are_sanitised_without_duplicate_series() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    text = storage_text({"a-b": 1, "a_b": 2, "c.d": 3, "c-d": 4, "stores_total": 5, "x y": 6})
    samples = [
        (s.name, tuple(sorted(s.labels.items())))
        for f in text_string_to_metric_families(text)
        for s in f.samples
    ]
    assert len(samples) == len(set(samples))
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert values["kvcore_tier_storage_a_b"] == 2  # the valid name wins over the sanitised one
    assert values["kvcore_tier_storage_c_d"] == 4  # of two sanitised ones, the first in sorted order
    assert values["kvcore_tier_storage_x_y"] == 6
    assert values["kvcore_tier_storage_stores_total"] == 0  # the tier's counter, not the custom stat
    assert all(re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name) for name, _ in samples)


# ---- 11. the demo's answer check ----------------------------------------------------------------------


def test_the_one_pass_check_is_the_no_cache_run() -> None:
    from kvcore.demo import _equals_no_cache_run
    from kvcore.tiny import TinyDecoder

    model = TinyDecoder(0, "fp16")
    rng = np.random.default_rng(1)
    vocab = model.config.vocab
    for _ in range(10):
        prompt = rng.integers(0, vocab, int(rng.integers(1, 120))).tolist()
        n = int(rng.integers(0, 20))
        answer = model.generate_no_cache(prompt, n)
        assert _equals_no_cache_run(model, prompt, answer, n)
        assert not _equals_no_cache_run(model, prompt, answer[:-1], n) or n == 0
        for i in {0, n - 1} if n else set():
            wrong = list(answer)
            wrong[i] = (wrong[i] + 1) % vocab
            assert not _equals_no_cache_run(model, prompt, wrong, n)


def test_the_demo_checks_each_answer_in_one_pass(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvcore.demo import run_engine_demo
    from kvcore.tiny import TinyDecoder

    calls = []
    dense = TinyDecoder._dense

    def counted(self: TinyDecoder, *args: Any) -> Any:
        calls.append(1)
        return dense(self, *args)

    monkeypatch.setattr(TinyDecoder, "_dense", counted)
    assert run_engine_demo(12, 65, 32, 0, False, check=3) == 0
    out = capsys.readouterr().out
    layers = TinyDecoder(0, "fp16").config.num_layers
    # One pass of every layer per checked answer (it was one per generated token).
    assert len(calls) == 3 * layers
    assert re.search(r"checked\s+3/3 answers .*\(served in [\d.]+ s, checked in [\d.]+ s\)", out)


# ---- session review: HF defaults, Llama 4, Falcon, request mixes, commas, manager bounds ------------


def _per_token(groups: tuple[LayerGroup, ...]) -> int:
    """bf16 bytes per token, by hand: layers x tensors x kv heads x head_dim x 2."""
    return sum(g.num_layers * g.num_tensors * g.num_kv_heads * g.head_dim * 2 for g in groups)


def test_gemma_configs_without_head_dim_take_the_hf_default() -> None:
    """google/gemma-3-12b-it's text_config has no head_dim: HF's Gemma3TextConfig gives 256, kvcore took
    hidden_size / num_attention_heads = 240 (6.25 % short, exit 0). gemma-3-4b-it has no head counts:
    HF gives 8 query and 4 K/V heads; kvcore refused it."""
    twelve = {
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 3840,
            "num_attention_heads": 16,
            "num_hidden_layers": 48,
            "num_key_value_heads": 8,
            "sliding_window": 1024,
        },
    }
    spec = model_from_config(twelve)
    assert {g.head_dim for g in spec.groups} == {256}
    assert (
        _per_token(spec.groups)
        == 48 * 2 * 8 * 256 * 2
        == kvcore.sizing.model_preset("gemma-3-12b").bytes_per_token()
    )
    four = {
        "model_type": "gemma3",
        "text_config": {"hidden_size": 2560, "num_hidden_layers": 34, "sliding_window": 1024},
    }
    spec = model_from_config(four)
    assert {(g.num_kv_heads, g.head_dim) for g in spec.groups} == {(4, 256)}
    assert [(g.kind, g.num_layers) for g in spec.groups] == [("sliding_attention", 29), ("full_attention", 5)]
    # Stated fields win over the defaults; other architectures keep hidden_size / heads.
    stated = model_from_config({**twelve, "text_config": {**twelve["text_config"], "head_dim": 128}})
    assert {g.head_dim for g in stated.groups} == {128}
    llama = model_from_config({"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 2})
    assert llama.groups[0].head_dim == 128 and llama.groups[0].num_kv_heads == 32


@pytest.mark.parametrize(
    ("no_rope", "extra", "chunked"),
    [
        ([], {}, [i for i in range(48) if (i + 1) % 4]),  # HF's default: every 4th layer NoPE (full)
        (None, {"no_rope_layer_interval": 3}, [i for i in range(48) if (i + 1) % 3]),
        ([1, 0] * 24, {}, list(range(0, 48, 2))),
    ],
)
def test_llama4_layers_come_from_no_rope_layers(
    no_rope: Any, extra: dict[str, Any], chunked: list[int]
) -> None:
    """Real Llama 4 configs say attention_chunk_size and no_rope_layers, not layer_types: they were
    refused. HF's rule: a RoPE layer (1) attends in chunks, a NoPE layer (0) to everything."""
    text = {
        "model_type": "llama4_text",
        "attention_chunk_size": 8192,
        "head_dim": 128,
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
        **extra,
    }
    if no_rope is not None:
        text["no_rope_layers"] = no_rope
    spec = model_from_config({"model_type": "llama4", "text_config": text})
    by_kind = {g.kind: g for g in spec.groups}
    assert by_kind["chunked_attention"].num_layers == len(chunked)
    assert by_kind["chunked_attention"].window == 8192
    assert by_kind["full_attention"].num_layers == 48 - len(chunked)
    assert spec.layer_group_index is not None
    kinds = [spec.groups[k].kind for k in spec.layer_group_index]
    assert [i for i, k in enumerate(kinds) if k == "chunked_attention"] == chunked
    with pytest.raises(ConfigError, match="no_rope_layers"):
        model_from_config({"model_type": "llama4", "text_config": {**text, "no_rope_layers": [1, 0, 2] * 16}})
    with pytest.raises(ConfigError, match="no_rope_layers"):
        model_from_config({"model_type": "llama4", "text_config": {**text, "no_rope_layers": [1] * 47}})
    # Another architecture with a chunk size and no layer_types is still refused: no rule says which.
    with pytest.raises(ConfigError, match="attention_chunk_size"):
        model_from_config({**text, "model_type": "llama"})


def test_falcon_new_decoder_architecture_ignores_multi_query() -> None:
    cfg = {
        "model_type": "falcon",
        "hidden_size": 8192,
        "num_attention_heads": 128,
        "num_hidden_layers": 60,
        "num_kv_heads": 8,
        "multi_query": True,
        "new_decoder_architecture": True,
    }
    assert _per_token(model_from_config(cfg).groups) == 60 * 2 * 8 * 64 * 2 == 122_880
    old = {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32}
    assert model_from_config({**old, "multi_query": True}).groups[0].num_kv_heads == 1
    with pytest.raises(ConfigError, match="multi_query"):
        model_from_config({**old, "multi_query": True, "num_kv_heads": 8})


def test_a_plan_with_a_context_and_a_longer_mix_does_not_fit_unless_the_mix_does() -> None:
    """With --context and --request, only the context was needed: "fits", exit 0, while not one
    request of the mix could be served (max_requests_worst_case 0)."""
    p = plan("llama-3.1-8b", gpu="L4", concurrency=2, context_len=4096, requests=[(64_000, 0)])
    assert not p.fits and p.max_requests_worst_case == 0 and p.shortfall_bytes > 0
    assert "the mix's longest" in p.warnings[0]
    alone = plan("llama-3.1-8b", gpu="L4", requests=[(64_000, 0)])
    assert p.shortfall_bytes == alone.shortfall_bytes  # one such request: the same cache missing
    ok = plan("llama-3.1-8b", gpu="L4", concurrency=2, context_len=4096, requests=[(8_000, 0)])
    assert ok.fits and ok.max_requests_worst_case >= 1
    # The fit follows the worst case: a plan fits exactly when one of the mix's longest fits too.
    for prompt in (10_000, 30_000, 40_000, 45_000, 60_000):
        q = plan("llama-3.1-8b", gpu="L4", context_len=1024, requests=[(prompt, 0)])
        assert q.fits == (q.max_requests_worst_case >= 1), prompt


def test_numbers_take_commas_only_between_thousands(capsys: pytest.CaptureFixture[str]) -> None:
    """Every comma was dropped: 1,5TB was 15 TB, --tp 1,6 was 16; and lists split inside a number:
    --context 131,072 sized 131 and 72 tokens, --request 1,000+500 a 1-token and a 500-token request."""
    assert parse_tokens("131,072") == 131_072 and parse_bytes("1,500GB") == 1_500 * 10**9
    assert parse_count("1,000,000") == 10**6
    for bad in ("1,5TB", "1,50GB", "12,3456", "1,000,0", ",100", "1,000,"):
        with pytest.raises(ConfigError, match="comma"):
            parse_bytes(bad, "gpu_mem")
    for argv in (
        ["size", "llama-3.1-8b", "--context", "131,072"],
        ["plan", "llama-3.1-8b", "--gpu", "H100-80G", "--request", "1,000+500"],
        ["plan", "llama-3.1-8b", "--gpu-mem", "1,5TB"],
        ["plan", "llama-3.1-8b", "--gpu", "H100-80G", "--tp", "1,6"],
    ):
        assert kvcore.cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "comma" in err and "Traceback" not in err
    assert kvcore.cli.main(["size", "llama-3.1-8b", "--context", "4k, 131072", "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)["reports"]
    assert [r["context_len"] for r in reports] == [4096, 131_072]


def test_a_plan_is_one_a_manager_accepts() -> None:
    """page_size past 2**20 gave a plan (fits, exit 0) whose manager_kwargs() KVCacheManager refused."""
    with pytest.raises(ConfigError, match="page_size"):
        plan("qwen2.5-0.5b", gpu="H200-141G", weight_bytes=10**9, page_size=2**21)
    with pytest.raises(ConfigError, match="int32 page ids"):
        plan("qwen2.5-0.5b", gpu=9 * 10**18, weight_bytes=0, page_size=1)
    p = plan("qwen2.5-0.5b", gpu="H200-141G", weight_bytes=10**9, page_size=2**20)
    kvcore.KVCacheManager(**{**p.manager_kwargs(), "num_pages": min(p.num_pages, 64)})
