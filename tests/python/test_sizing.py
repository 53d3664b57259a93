"""kvcore.sizing: the plain formula, precisions, units, model descriptions and every figure of the seed.

Expected values are written out as literals or computed here from the raw numbers with plain
arithmetic, never with the code under test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kv_helpers import llama_like

from kvcore.exceptions import ConfigError, KVCoreError
from kvcore.sizing import (
    GPU_PRESETS,
    MODEL_PRESETS,
    LayerGroup,
    ModelSpec,
    format_bytes,
    gpu_preset,
    kv_cache_bytes,
    kv_dtype_bits,
    kv_dtype_bytes,
    load_model,
    model_from_config,
    model_preset,
    normalize_kv_dtype,
    pages_for_budget,
    pages_per_request,
    parse_bytes,
    parse_count,
    parse_tokens,
    size,
    weight_bytes,
)

GiB = 1024**3
KiB = 1024


# ---- the seed's figures (004: "Le cache KV expliqué") ----------------------------------------------


def test_seed_70b_class_4096_tokens_bf16() -> None:
    # Issue 5: 80 layers, 8 KV heads, head_dim 128, bf16, 4,096 tokens, batch 1 = 1,342,177,280 B (1.34 GB).
    assert kv_cache_bytes(80, 8, 128, 4096, "bf16", 1) == 1_342_177_280
    assert round(1_342_177_280 / 1e9, 2) == 1.34


def test_seed_same_model_as_mha_is_8x() -> None:
    gqa = kv_cache_bytes(80, 8, 128, 4096)
    mha = kv_cache_bytes(80, 64, 128, 4096)
    assert mha == 10_737_418_240 == 8 * gqa
    assert round(mha / 1e9, 1) == 10.7


def test_seed_32_layers_per_token_is_128_kib() -> None:
    # 32 × 2 × 8 × 128 × 2 octets = 131 072 octets = 128 Kio par jeton.
    assert kv_cache_bytes(32, 8, 128, 1) == 131_072 == 128 * KiB


def test_seed_80_layers_per_token_is_320_kib() -> None:
    # 80 × 2 × 8 × 128 × 2 = 327 680 octets = 320 Kio par jeton.
    assert kv_cache_bytes(80, 8, 128, 1) == 327_680 == 320 * KiB


def test_seed_calculator_32k_is_4_gib() -> None:
    # kv_cache_gib(couches=32, kv_heads=8, head_dim=128, tokens=32768, bytes_per_element=2) -> 4,0
    assert kv_cache_bytes(32, 8, 128, 32768) / GiB == 4.0


@pytest.mark.parametrize(
    ("tokens", "kv_dtype", "gib"),
    [(32768, "bf16", 4), (32768, "fp8", 2), (131072, "bf16", 16), (131072, "fp8", 8)],
)
def test_seed_contexts_and_fp8_halving(tokens: int, kv_dtype: str, gib: int) -> None:
    # "cache 32K BF16 ≈ 4 Gio devient Cache FP8 32K ≈ 2 Gio; BF16 128K ≈ 16 Gio devient FP8 128K ≈ 8 Gio".
    assert kv_cache_bytes(32, 8, 128, tokens, kv_dtype) == gib * GiB


def test_seed_four_32k_requests_are_16_gib() -> None:
    assert kv_cache_bytes(32, 8, 128, 32768, batch=4) == 16 * GiB == 4 * kv_cache_bytes(32, 8, 128, 32768)


def test_seed_prompt_and_output_tokens_cost_the_same() -> None:
    # 24,000 prompt + 8,000 output and 4,000 prompt + 28,000 output both end at 32,000 active tokens.
    spec = model_preset("llama-3.1-8b")
    assert size(spec, 24_000 + 8_000).kv_bytes == size(spec, 4_000 + 28_000).kv_bytes == 32_000 * 131_072


def test_seed_gqa_vs_query_heads_overestimates_4x() -> None:
    # Using num_attention_heads (32) instead of num_key_value_heads (8) over-estimates the cache 4x.
    gqa = model_from_config(llama_like())
    mha = model_from_config(llama_like(num_key_value_heads=None))
    assert mha.bytes_per_token() == 4 * gqa.bytes_per_token() == 4 * 131_072


def test_seed_mha_gqa_mqa_at_same_layers_and_head_dim() -> None:
    per_token = {heads: kv_cache_bytes(32, heads, 128, 1) for heads in (32, 8, 1)}
    assert per_token == {32: 524_288, 8: 131_072, 1: 16_384}
    mqa = model_from_config(llama_like(num_key_value_heads=None, multi_query=True))
    assert mqa.bytes_per_token() == 16_384


def test_seed_100_users_of_8000_tokens() -> None:
    assert kv_cache_bytes(32, 8, 128, 8_000, batch=100) == 100 * 8_000 * 131_072 == 104_857_600_000


def test_seed_16k_to_128k_is_8x() -> None:
    assert kv_cache_bytes(32, 8, 128, 128_000) == 8 * kv_cache_bytes(32, 8, 128, 16_000)


def test_seed_70b_in_4_bits_is_35_gb_of_weights() -> None:
    # "un modèle 70B en 4 bits nécessite environ 35 Go" (weights only).
    assert weight_bytes(70 * 10**9, "int4") == 35 * 10**9
    assert weight_bytes(70 * 10**9, "bf16") == 140 * 10**9


def test_seed_weight_precision_does_not_change_cache() -> None:
    # "modèle 4 bits beaucoup plus petit + le même cache BF16"
    bf16_weights = size(llama_like(torch_dtype="bfloat16"), 32768)
    int4_weights = size(
        llama_like(torch_dtype=None, quantization_config={"quant_method": "awq", "bits": 4}), 32768
    )
    assert bf16_weights.kv_bytes == int4_weights.kv_bytes == 4 * GiB
    assert model_from_config(
        llama_like(quantization_config={"quant_method": "awq", "bits": 4})
    ).weight_dtype == ("int4")


def test_seed_paged_attention_examples_waste_less_than_one_page() -> None:
    # Users of 2,000 / 19,000 / 7,000 tokens at 16-token pages.
    for tokens, pages in ((2_000, 125), (19_000, 1_188), (7_000, 438)):
        assert pages_per_request(tokens, 16) == pages
        assert 0 <= pages * 16 - tokens < 16


def test_seed_five_20k_requests_weigh_as_much_as_one_100k() -> None:
    # "Cinq requêtes de 20 000 jetons peuvent avoir plus d'impact qu'une seule requête de 100 000".
    assert 5 * pages_per_request(20_000, 16) == pages_per_request(100_000, 16) == 6_250
    assert 5 * pages_per_request(20_000, 64) == 1_565 > pages_per_request(100_000, 64) == 1_563


def test_seed_mistral_window_bounds_cache_whatever_the_context() -> None:
    spec = model_preset("mistral-7b")
    bounded = kv_cache_bytes(32, 8, 128, 4096)
    assert bounded == 536_870_912
    for context in (4096, 4097, 32768, 131072, 1_000_000):
        assert size(spec, context).kv_bytes == bounded
    assert size(spec, 1000).kv_bytes == kv_cache_bytes(32, 8, 128, 1000)


# ---- the formula and its helpers --------------------------------------------------------------------


def test_kv_cache_bytes_formula_on_a_grid() -> None:
    for layers, heads, dim, tokens, batch in [(1, 1, 1, 1, 1), (3, 5, 7, 11, 13), (61, 1, 576, 1000, 2)]:
        for name, nbytes in (("fp32", 4), ("bf16", 2), ("fp16", 2), ("fp8", 1), ("int8", 1)):
            expected = 2 * layers * heads * dim * tokens * batch * nbytes
            assert kv_cache_bytes(layers, heads, dim, tokens, name, batch) == expected


def test_int4_is_half_a_byte_rounded_up() -> None:
    assert kv_cache_bytes(32, 8, 128, 32768, "int4") == 1 * GiB
    assert kv_cache_bytes(1, 1, 1, 1, "int4") == 1  # K and V: 2 elements = 8 bits
    assert kv_cache_bytes(0, 1, 1, 1, "int4") == 0
    # An odd element count (one 1-wide latent per token) rounds up to a whole byte.
    latent = ModelSpec("odd", (LayerGroup("mla", 1, 1, 1, num_tensors=1, tp_sharded=False),), num_layers=1)
    assert [latent.kv_bytes(n, "int4") for n in (1, 2, 3)] == [1, 1, 2]


def test_kv_dtype_bytes_and_aliases() -> None:
    expected = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
    for name, nbytes in expected.items():
        assert kv_dtype_bytes(name) == nbytes
        assert kv_dtype_bytes(name.upper()) == nbytes
    for alias in ("fp8_e4m3", "E4M3", "FP8_E4M3", "float8_e4m3fn"):
        assert kv_dtype_bytes(alias) == 1.0
        assert normalize_kv_dtype(alias) == "fp8"
    assert kv_dtype_bytes("bfloat16") == 2.0
    assert kv_dtype_bits("int4") == 4


@pytest.mark.parametrize("bad", ["fp4", "int2", "", "bf 16", "e5m3"])
def test_unknown_kv_dtype_is_a_config_error_naming_the_field(bad: str) -> None:
    with pytest.raises(ConfigError, match="kv_dtype") as info:
        kv_dtype_bytes(bad)
    assert isinstance(info.value, ValueError) and isinstance(info.value, KVCoreError)
    with pytest.raises(ConfigError, match="kv_dtype"):
        kv_cache_bytes(1, 1, 1, 1, bad)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((-1, 8, 128, 1), "num_layers"),
        ((32, -8, 128, 1), "num_kv_heads"),
        ((32, 8, 0.5, 1), "head_dim"),
        ((32, 8, 128, True), "num_tokens"),
        ((32, 8, 128, "4k"), "num_tokens"),
    ],
)
def test_kv_cache_bytes_rejects_bad_counts(args: tuple[object, ...], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        kv_cache_bytes(*args)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="batch"):
        kv_cache_bytes(32, 8, 128, 1, batch=-1)


def test_pages_for_budget() -> None:
    page = kv_cache_bytes(32, 8, 128, 16)
    assert page == 2 * 1024 * 1024
    assert pages_for_budget(10 * page, page) == 10
    assert pages_for_budget(10 * page + page - 1, page) == 10
    assert pages_for_budget(page - 1, page) == 0
    assert pages_for_budget(-5 * page, page) == 0
    with pytest.raises(ConfigError, match="page_bytes"):
        pages_for_budget(100, 0)
    with pytest.raises(ConfigError, match="budget_bytes"):
        pages_for_budget(1.5, 1)  # type: ignore[arg-type]


def test_pages_per_request_window_bound_is_worst_alignment() -> None:
    # A 4,096-token window over 16-token pages spans 257 pages when it does not start on a page edge.
    assert pages_per_request(4097, 16, window=4096) == 257
    assert pages_per_request(10**6, 16, window=4096) == 257
    assert pages_per_request(100, 16, window=4096) == 7
    # Check the bound against a brute-force count of the pages a window touches at every offset.
    for window, page in ((4096, 16), (1000, 16), (7, 3), (5, 8), (1, 4), (16, 16), (17, 16)):
        worst = max((n - 1) // page - (n - window) // page + 1 for n in range(window, window + 4 * page))
        assert pages_per_request(10**6, page, window) == worst


def test_units() -> None:
    assert parse_tokens("32k") == parse_tokens("32K") == 32768
    assert parse_tokens("128k") == 131072
    assert parse_tokens("1.5k") == 1536
    assert parse_tokens("1m") == 1024**2
    assert parse_tokens("32,000") == 32000
    assert parse_tokens(4096) == 4096
    assert parse_bytes("80GiB") == 80 * GiB
    assert parse_bytes("24GB") == 24 * 10**9
    assert parse_bytes("81559MiB") == 81559 * 1024**2
    assert parse_bytes("1048576") == 1048576
    assert parse_count("70.6B") == 70_600_000_000
    assert parse_count("8.03b") == 8_030_000_000
    # A decimal exponent, as parameter counts are often written (exact: no float in between).
    assert parse_count("8e9") == parse_count("8E9") == 8 * 10**9
    assert parse_count("8.03e9") == 8_030_000_000
    assert parse_count("1e3k") == 10**6
    assert parse_bytes("1e9") == 10**9
    assert parse_bytes("1.5e3KiB") == 1500 * 1024
    assert parse_tokens("1e5") == 100_000
    for bad in ("1e-3", "e9", "1e", "8.0301e2", "1e100", "1e99"):
        with pytest.raises(ConfigError, match="params"):
            parse_count(bad, "params")
    for bad in ("32q", "-1", "1.00001k", "k"):
        with pytest.raises(ConfigError, match="context"):
            parse_tokens(bad, "context")
    with pytest.raises(ConfigError, match="gpu_mem"):
        parse_bytes("80 gigs", "gpu_mem")
    assert format_bytes(1_342_177_280) == "1,342,177,280 B (1.25 GiB, 1.34 GB)"
    assert format_bytes(131_072) == "131,072 B (128.00 KiB, 131.07 kB)"
    assert format_bytes(512) == "512 B"


# ---- model descriptions from configs -------------------------------------------------------------------


def test_head_dim_derived_from_hidden_size_or_explicit() -> None:
    derived = model_from_config(llama_like())
    assert [(g.kind, g.num_layers, g.num_kv_heads, g.head_dim) for g in derived.groups] == [
        ("full_attention", 32, 8, 128)
    ]
    # Qwen3-32B: head_dim 128 although hidden_size / heads = 5120 / 64 = 80.
    explicit = model_from_config(llama_like(hidden_size=5120, num_attention_heads=64, head_dim=128))
    assert explicit.groups[0].head_dim == 128


def test_mla_caches_one_latent_not_k_and_v() -> None:
    spec = model_from_config(
        {
            "model_type": "deepseek_v3",
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "hidden_size": 7168,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "v_head_dim": 128,
        }
    )
    assert spec.is_mla
    assert spec.bytes_per_token() == 61 * (512 + 64) * 2 == 70_272
    # Tensor parallelism does not split the latent: every GPU keeps it whole.
    assert spec.bytes_per_token(tp=8) == 70_272


def test_sliding_window_alternation_gemma2() -> None:
    spec = model_from_config(
        llama_like(model_type="gemma2", num_hidden_layers=42, head_dim=256, sliding_window=4096)
    )
    kinds = {g.kind: (g.num_layers, g.window) for g in spec.groups}
    assert kinds == {"sliding_attention": (21, 4096), "full_attention": (21, None)}
    per_layer = 2 * 8 * 256 * 2
    assert size(spec, 8192).kv_bytes == 21 * per_layer * 4096 + 21 * per_layer * 8192


def test_sliding_window_pattern_gemma3() -> None:
    spec = model_from_config(
        llama_like(
            model_type="gemma3_text", num_hidden_layers=26, sliding_window=512, sliding_window_pattern=6
        )
    )
    assert {g.kind: g.num_layers for g in spec.groups} == {"sliding_attention": 22, "full_attention": 4}


def test_layer_types_must_agree_with_pattern() -> None:
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(12)]
    agree = llama_like(num_hidden_layers=12, sliding_window=512, sliding_window_pattern=6, layer_types=types)
    assert {g.kind: g.num_layers for g in model_from_config(agree).groups} == {
        "sliding_attention": 10,
        "full_attention": 2,
    }
    with pytest.raises(ConfigError, match=r"layer_types.*sliding_window_pattern"):
        model_from_config({**agree, "sliding_window_pattern": 4})


def test_qwen_use_sliding_window_and_max_window_layers() -> None:
    off = model_from_config(llama_like(model_type="qwen2", sliding_window=4096, use_sliding_window=False))
    assert [g.kind for g in off.groups] == ["full_attention"]
    on = model_from_config(
        llama_like(model_type="qwen2", sliding_window=4096, use_sliding_window=True, max_window_layers=28)
    )
    assert {g.kind: g.num_layers for g in on.groups} == {"full_attention": 28, "sliding_attention": 4}
    with pytest.raises(ConfigError, match="max_window_layers"):
        model_from_config(llama_like(model_type="qwen2", sliding_window=4096, use_sliding_window=True))


def test_kv_shared_layers_cache_nothing() -> None:
    types = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(20)]
    spec = model_from_config(
        llama_like(num_hidden_layers=20, sliding_window=512, layer_types=types, num_kv_shared_layers=10)
    )
    assert spec.num_kv_shared_layers == 10
    assert {g.kind: g.num_layers for g in spec.groups} == {"sliding_attention": 8, "full_attention": 2}
    assert spec.bytes_per_token() == 10 * 2 * 8 * 128 * 2


def test_linear_attention_state_is_constant() -> None:
    spec = model_preset("qwen3-next-80b-a3b")
    kinds = {g.kind: g.num_layers for g in spec.groups}
    assert kinds == {"linear_attention": 36, "full_attention": 12}
    # Per layer: recurrent 32 × 128 × 128 + conv (4 - 1) × (2 × 16 × 128 + 32 × 128) elements, bf16.
    per_layer = (32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128)) * 2
    assert spec.state_bytes() == 36 * per_layer == 39_518_208
    assert spec.bytes_per_token() == 12 * 2 * 2 * 256 * 2
    short, long = size(spec, 1000, batch=3), size(spec, 100_000, batch=3)
    assert short.state_bytes == long.state_bytes == 3 * 36 * per_layer
    assert long.total_bytes == 3 * (12 * 2 * 2 * 256 * 2 * 100_000 + 36 * per_layer)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"num_hidden_layers": "32"}, "num_hidden_layers"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"num_key_value_heads": 5}, "num_key_value_heads"),
        ({"num_key_value_heads": 64}, "num_key_value_heads"),
        ({"hidden_size": 4100}, "head_dim"),
        ({"hidden_size": None}, "head_dim"),
        ({"multi_query": True}, "multi_query"),
        ({"sliding_window": 4096}, "sliding_window"),  # llama: which layers would use it?
        ({"sliding_window": -1, "model_type": "mistral"}, "sliding_window"),
        ({"layer_types": ["full_attention"] * 31}, "layer_types"),
        ({"layer_types": ["full_attention"] * 31 + ["mamba"]}, r"layer_types\[31\]"),
        ({"layer_types": ["sliding_attention"] * 32}, "sliding_window"),
        ({"attention_chunk_size": 8192}, "attention_chunk_size"),
        ({"use_sliding_window": True}, "sliding_window"),
        ({"is_encoder_decoder": True}, "is_encoder_decoder"),
        ({"sliding_window": 4096, "sliding_window_size": 2048, "model_type": "mistral"}, "sliding_window"),
        ({"num_kv_shared_layers": 32}, "num_kv_shared_layers"),
        ({"kv_lora_rank": 512}, "qk_rope_head_dim"),
    ],
)
def test_bad_configs_name_the_field(overrides: dict[str, object], field: str) -> None:
    config = llama_like()
    for key, value in overrides.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    with pytest.raises(ConfigError, match=field):
        model_from_config(config)


def test_multimodal_text_config_is_read() -> None:
    spec = model_from_config({"model_type": "llava", "text_config": llama_like(), "vision_config": {"x": 1}})
    assert spec.bytes_per_token() == 131_072


def test_config_from_path_and_directory(tmp_path: Path) -> None:
    (tmp_path / "my-model").mkdir()
    path = tmp_path / "my-model" / "config.json"
    path.write_text(json.dumps(llama_like()))
    by_file = load_model(str(path))
    by_dir = load_model(tmp_path / "my-model")
    assert by_file.name == by_dir.name == "my-model"
    assert by_file.bytes_per_token() == by_dir.bytes_per_token() == 131_072
    (tmp_path / "broken.json").write_text("{ not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model(str(tmp_path / "broken.json"))
    with pytest.raises(ConfigError, match="no such file"):
        load_model(str(tmp_path / "missing.json"))


def test_layer_group_invariants() -> None:
    with pytest.raises(ConfigError, match="window"):
        LayerGroup("sliding_attention", 4, 8, 128)
    with pytest.raises(ConfigError, match="window"):
        LayerGroup("full_attention", 4, 8, 128, window=16)
    with pytest.raises(ConfigError, match="kind"):
        LayerGroup("rwkv", 4, 8, 128)
    with pytest.raises(ConfigError, match="mamba"):  # a known kind, but a state kind caches no K/V
        LayerGroup("mamba", 4, 8, 128)
    with pytest.raises(ConfigError, match="num_layers"):
        ModelSpec("x", (LayerGroup("full_attention", 4, 8, 128),), num_layers=5)


def test_tensor_parallel_splits_or_replicates_heads() -> None:
    spec = model_from_config(llama_like())
    assert spec.bytes_per_token(tp=2) == 131_072 // 2
    assert spec.bytes_per_token(tp=8) == 131_072 // 8
    # 8 KV heads over 16 GPUs: each keeps one head (replicated), the per-GPU cache stops shrinking.
    assert spec.bytes_per_token(tp=16) == 131_072 // 8
    with pytest.raises(ConfigError, match="tp"):
        spec.bytes_per_token(tp=3)
    with pytest.raises(ConfigError, match="tp"):
        spec.bytes_per_token(tp=0)


def test_quantized_scales_are_separate_from_the_formula() -> None:
    # fp8: one fp32 scale per layer, K/V tensor and KV head (the pool's layout): 32 × 2 × 8 × 4 bytes.
    report = size("llama-3.1-8b", 32768, kv_dtype="fp8", batch=4)
    assert report.kv_bytes == kv_cache_bytes(32, 8, 128, 32768, "fp8", 4) == 8 * GiB
    assert report.scale_bytes == 32 * 2 * 8 * 4 == 2048
    assert report.total_bytes == 8 * GiB + 2048
    assert size("llama-3.1-8b", 32768, kv_dtype="bf16").scale_bytes == 0


def test_size_report_groups_sum_to_totals() -> None:
    report = size("gemma-2-9b", 100_000, batch=3, kv_dtype="int8")
    assert sum(g.kv_bytes for g in report.groups) == report.kv_bytes
    assert sum(g.scale_bytes for g in report.groups) == report.scale_bytes
    per_layer = 2 * 8 * 256  # elements per token per layer, int8 = 1 byte
    assert report.kv_bytes == 3 * (21 * per_layer * 4096 + 21 * per_layer * 100_000)
    assert report.sequence_bytes == report.kv_bytes // 3
    assert any("exceeds the model's maximum" in n for n in report.notes)


# ---- presets ----------------------------------------------------------------------------------------


def test_presets_all_load_and_have_known_shapes() -> None:
    for name in MODEL_PRESETS:
        spec = model_preset(name)
        assert spec.source == "preset" and spec.name == name
        assert spec.bytes_per_token() > 0
    expected = {
        "llama-3.1-8b": 32 * 2 * 8 * 128 * 2,
        "llama-3.1-70b": 80 * 2 * 8 * 128 * 2,
        "llama-3.1-405b": 126 * 2 * 8 * 128 * 2,
        "mistral-7b": 32 * 2 * 8 * 128 * 2,
        "mixtral-8x22b": 56 * 2 * 8 * 128 * 2,
        "qwen2.5-7b": 28 * 2 * 4 * 128 * 2,
        "qwen2.5-0.5b": 24 * 2 * 2 * 64 * 2,
        "qwen3-30b-a3b": 48 * 2 * 4 * 128 * 2,
        "gemma-3-27b": 62 * 2 * 16 * 128 * 2,
        "deepseek-v2": 60 * 576 * 2,
        "deepseek-v3": 61 * 576 * 2,
        "phi-3-mini-4k": 32 * 2 * 32 * 96 * 2,
        "phi-3-medium-4k": 40 * 2 * 10 * 128 * 2,
    }
    for name, per_token in expected.items():
        assert model_preset(name).bytes_per_token() == per_token, name


def test_preset_names_are_forgiving() -> None:
    assert model_preset("meta-llama/Llama-3.1-8B-Instruct").name == "llama-3.1-8b"
    assert model_preset("Meta-Llama-3.1-70B").name == "llama-3.1-70b"
    assert model_preset("Qwen/Qwen3-8B").name == "qwen3-8b"
    assert model_preset("mistralai/Mistral-7B-v0.1").name == "mistral-7b"
    assert model_preset("google/gemma-3-1b-it").name == "gemma-3-1b"
    assert gpu_preset("RTX 4090") is GPU_PRESETS["RTX-4090"]
    assert gpu_preset("h100-80g") is gpu_preset("H100") is GPU_PRESETS["H100-80G"]
    assert gpu_preset("H200-141G").mem_bytes == 143771 * 1024**2


def test_unknown_presets_suggest_close_names() -> None:
    with pytest.raises(ConfigError, match=r"did you mean 'llama-3\.1-8b'") as info:
        model_preset("lama-3.1-8b")
    assert "model" in str(info.value)
    with pytest.raises(ConfigError, match="did you mean 'H100-80G'"):
        gpu_preset("H10-80G")
    with pytest.raises(ConfigError, match="known presets"):
        model_preset("zzzzzzzz")


def test_import_uses_the_standard_library_only() -> None:
    # A fresh interpreter: importing kvcore.sizing must not pull numpy or any optional package itself.
    code = (
        "import sys, kvcore\n"
        "before = set(sys.modules)\n"
        "import kvcore.sizing, kvcore.sizing.cli\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names) - {'kvcore'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
