"""Every real HF config in ../shared/data/configs/ sized exactly, against a per-layer reference.

The reference below reads the raw JSON fields and walks the layers one by one, without kvcore's parser;
the literal table holds the per-token figures worked out by hand (they agree with MANIFEST.json, except
for Gemma 4, see ``test_manifest_figures``). The data files are read in place and never copied.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvcore.sizing import kv_cache_bytes, model_from_config, model_preset, size

CONFIG_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "configs"
CONFIG_FILES = (
    sorted(p for p in CONFIG_DIR.glob("*.json") if p.name != "MANIFEST.json") if CONFIG_DIR.is_dir() else []
)

pytestmark = pytest.mark.skipif(not CONFIG_FILES, reason=f"no configs in {CONFIG_DIR}")

# bf16 K/V bytes per token (all layers, before any window), worked out by hand from each config.
EXPECTED_BF16_PER_TOKEN = {
    "llama-3.1-8b.json": 32 * 2 * 8 * 128 * 2,  # 131,072
    "llama-3.1-70b.json": 80 * 2 * 8 * 128 * 2,  # 327,680
    "llama-3.1-405b.json": 126 * 2 * 8 * 128 * 2,  # 516,096
    "mixtral-8x7b-v0.1.json": 32 * 2 * 8 * 128 * 2,
    "mixtral-8x22b-v0.1.json": 56 * 2 * 8 * 128 * 2,
    "qwen3-8b.json": 36 * 2 * 8 * 128 * 2,
    "qwen3-32b.json": 64 * 2 * 8 * 128 * 2,  # head_dim 128, not 5120 / 64
    "qwen3-30b-a3b.json": 48 * 2 * 4 * 128 * 2,
    "qwen3-235b-a22b.json": 94 * 2 * 4 * 128 * 2,
    "qwen2.5-3b.json": 36 * 2 * 2 * 128 * 2,  # use_sliding_window false
    "deepseek-v3.json": 61 * (512 + 64) * 2,  # MLA: one latent, 70,272
    "deepseek-r1.json": 61 * (512 + 64) * 2,
    "deepseek-v2-lite.json": 27 * (512 + 64) * 2,  # 31,104
    "mistral-7b-v0.1.json": 32 * 2 * 8 * 128 * 2,
    "gemma-2-9b.json": 42 * 2 * 8 * 256 * 2,
    "gemma-2-27b.json": 46 * 2 * 16 * 128 * 2,
    "gemma-3-1b-it.json": 26 * 2 * 1 * 256 * 2,
    # 25 sliding layers (8 heads × 256) + 5 full layers (2 global heads × 512, K and V both cached).
    "gemma-4-26b-a4b.json": 25 * 2 * 8 * 256 * 2 + 5 * 2 * 2 * 512 * 2,  # 225,280
    "phi-3.5-mini-instruct.json": 32 * 2 * 32 * 96 * 2,  # MHA, head_dim 3072 / 32
}

# (sliding layers, full layers, window) of the windowed configs; every other config is full attention.
EXPECTED_WINDOWS = {
    "mistral-7b-v0.1.json": (32, 0, 4096),
    "phi-3.5-mini-instruct.json": (32, 0, 262144),
    "gemma-2-9b.json": (21, 21, 4096),
    "gemma-2-27b.json": (23, 23, 4096),
    "gemma-3-1b-it.json": (22, 4, 512),
    "gemma-4-26b-a4b.json": (25, 5, 1024),
}

# Config file -> the preset that describes the same model.
PRESET_OF = {
    "llama-3.1-8b.json": "llama-3.1-8b",
    "llama-3.1-70b.json": "llama-3.1-70b",
    "llama-3.1-405b.json": "llama-3.1-405b",
    "mixtral-8x7b-v0.1.json": "mixtral-8x7b",
    "mixtral-8x22b-v0.1.json": "mixtral-8x22b",
    "qwen3-8b.json": "qwen3-8b",
    "qwen3-32b.json": "qwen3-32b",
    "qwen3-30b-a3b.json": "qwen3-30b-a3b",
    "qwen3-235b-a22b.json": "qwen3-235b-a22b",
    "qwen2.5-3b.json": "qwen2.5-3b",
    "deepseek-v3.json": "deepseek-v3",
    "deepseek-r1.json": "deepseek-r1",
    "deepseek-v2-lite.json": "deepseek-v2-lite",
    "mistral-7b-v0.1.json": "mistral-7b",
    "gemma-2-9b.json": "gemma-2-9b",
    "gemma-2-27b.json": "gemma-2-27b",
    "gemma-3-1b-it.json": "gemma-3-1b",
    "gemma-4-26b-a4b.json": "gemma-4-26b-a4b",
    "phi-3.5-mini-instruct.json": "phi-3.5-mini",
}

CONTEXTS = (1, 511, 512, 513, 1024, 4095, 4096, 4097, 32768, 131072, 262144, 300000)


def reference_layers(raw: dict[str, Any]) -> list[tuple[int, int | None]]:
    """(elements per token, window or None) for each layer that owns a cache, read from raw fields."""
    cfg = raw if "num_hidden_layers" in raw else raw["text_config"]
    num_layers = cfg["num_hidden_layers"]
    if cfg.get("kv_lora_rank"):
        return [(cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], None)] * num_layers
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    window = cfg.get("sliding_window")
    if "layer_types" in cfg:
        sliding = [t == "sliding_attention" for t in cfg["layer_types"]]
    elif "sliding_window_pattern" in cfg:
        sliding = [(i + 1) % cfg["sliding_window_pattern"] != 0 for i in range(num_layers)]
    elif cfg["model_type"] == "gemma2":
        sliding = [i % 2 == 0 for i in range(num_layers)]
    elif window is None or cfg.get("use_sliding_window") is False:
        sliding = [False] * num_layers
    else:
        assert cfg["model_type"] in ("mistral", "phi3"), cfg["model_type"]
        sliding = [True] * num_layers
    layers: list[tuple[int, int | None]] = []
    for i in range(num_layers - cfg.get("num_kv_shared_layers", 0)):
        if sliding[i]:
            layers.append((2 * kv_heads * head_dim, window))
        else:
            full_heads: int = cfg["num_global_key_value_heads"] if cfg.get("attention_k_eq_v") else kv_heads
            layers.append((2 * full_heads * (cfg.get("global_head_dim") or head_dim), None))
    return layers


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_config_matches_per_layer_reference(path: Path) -> None:
    raw = load(path)
    spec = model_from_config(path)
    layers = reference_layers(raw)
    assert spec.elements_per_token() == sum(e for e, _ in layers)
    for dtype, bits in (("bf16", 16), ("fp8", 8), ("fp32", 32), ("int4", 4)):
        assert spec.bytes_per_token(dtype) == sum(e for e, _ in layers) * bits // 8
    for n in CONTEXTS:
        expected = sum(e * (n if w is None else min(n, w)) for e, w in layers) * 2
        assert spec.kv_bytes(n) == expected, (path.name, n)
        assert size(path, n, batch=3).kv_bytes == 3 * expected


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_config_literal_figures(path: Path) -> None:
    if path.name not in EXPECTED_BF16_PER_TOKEN:
        pytest.skip(f"{path.name}: no hand-worked figure (checked against the reference only)")
    spec = model_from_config(path)
    assert spec.bytes_per_token("bf16") == EXPECTED_BF16_PER_TOKEN[path.name]
    sliding = sum(g.num_layers for g in spec.groups if g.kind == "sliding_attention")
    full = sum(g.num_layers for g in spec.groups if g.kind in ("full_attention", "mla"))
    windows = {g.window for g in spec.groups if g.window is not None}
    if path.name in EXPECTED_WINDOWS:
        n_sliding, n_full, window = EXPECTED_WINDOWS[path.name]
        assert (sliding, full, windows) == (n_sliding, n_full, {window})
    else:
        assert (sliding, windows) == (0, set())


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_config_and_preset_agree(path: Path) -> None:
    if path.name not in PRESET_OF:
        pytest.skip(f"{path.name}: no preset for this model")
    from_file = model_from_config(path)
    preset = model_preset(PRESET_OF[path.name])
    assert preset.groups == from_file.groups
    assert preset.max_context_len == from_file.max_context_len
    assert preset.num_layers == from_file.num_layers


def test_manifest_figures() -> None:
    manifest_path = CONFIG_DIR / "MANIFEST.json"
    if not manifest_path.is_file():
        pytest.skip("no MANIFEST.json")
    for entry in json.loads(manifest_path.read_text()):
        spec = model_from_config(CONFIG_DIR / entry["file"])
        published = entry["kv_computed_bf16"]["kv_bytes_per_token"]
        if entry["file"] == "gemma-4-26b-a4b.json":
            # MANIFEST assumes attention_k_eq_v stores one tensor. It does not: K is normalised and rotated,
            # V is not, and both are cached (HF Gemma4 attention updates the cache with K and V), so the
            # 5 full-attention layers cost 2 × 2 × 512 × 2 bytes, not 2 × 512 × 2.
            assert spec.bytes_per_token() == published + 5 * 2 * 512 * 2
        else:
            assert spec.bytes_per_token() == published, entry["file"]


def test_mistral_config_window_bounds_the_cache() -> None:
    spec = model_from_config(CONFIG_DIR / "mistral-7b-v0.1.json")
    bound = kv_cache_bytes(32, 8, 128, 4096)
    assert [spec.kv_bytes(n) for n in (4096, 8192, 32768, 10**6)] == [bound] * 4


def test_deepseek_mla_versus_mha_equivalent() -> None:
    raw = load(CONFIG_DIR / "deepseek-v3.json")
    spec = model_from_config(raw)
    # Without MLA every head would cache K (nope 128 + rope 64) and V (128): 4,997,120 B per token.
    k_dim = raw["qk_nope_head_dim"] + raw["qk_rope_head_dim"]
    mha_equivalent = 61 * 128 * (k_dim + raw["v_head_dim"]) * 2
    assert mha_equivalent == 4_997_120
    assert spec.bytes_per_token() == 70_272
    assert mha_equivalent // spec.bytes_per_token() == 71
