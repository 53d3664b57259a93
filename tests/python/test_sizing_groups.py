"""KV-cache groups (one page table per group of layers) and the plan that pages with them.

Every expectation is worked out here, from the layer types and the paging rule, not from kvcore's code:
the groups from the raw ``config.json`` fields (:func:`reference_groups`), the pages a sequence holds by
growing it one token at a time and releasing what leaves each window (:func:`peak_pages`), and the pool
and the concurrency by dividing bytes by hand. The real configs are read in place, never copied.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_sizing_configs import CONFIG_DIR, CONFIG_FILES, reference_layers

import kvcore.cli
from kvcore.exceptions import ConfigError
from kvcore.sizing import (
    KVCacheGroup,
    LayerGroup,
    ModelSpec,
    kv_cache_bytes,
    kv_cache_groups,
    model_from_config,
    model_preset,
    plan,
)

needs_configs = pytest.mark.skipif(not CONFIG_FILES, reason=f"no configs in {CONFIG_DIR}")

EVEN = tuple(range(0, 42, 2))
ODD = tuple(range(1, 42, 2))


def config(name: str) -> Path:
    path = CONFIG_DIR / name
    if not path.is_file():
        pytest.skip(f"no {path}")
    return path


def gpt_oss_config(num_layers: int) -> dict[str, Any]:
    """The attention fields of openai/gpt-oss-20b's config.json (gpt-oss-120b: 36 layers)."""
    return {
        "model_type": "gpt_oss",
        "num_hidden_layers": num_layers,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "hidden_size": 2880,
        "max_position_embeddings": 131072,
        "sliding_window": 128,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)],
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "mxfp4"},
    }


def shape(groups: tuple[KVCacheGroup, ...]) -> list[tuple[str, int | None, tuple[int, ...], int]]:
    return [(g.kind, g.window, g.layer_indices, g.group_size) for g in groups]


# ---- a model of the grouping and of the paging ------------------------------------------------------


def reference_groups(layers: list[tuple[int, int | None]]) -> tuple[int, list[tuple[int | None, list[int]]]]:
    """(layer slots per group, [(window, layer indices)]) from (elements per token, window) per layer.

    vLLM's rule (``_get_kv_cache_groups_uniform_page_size``): a type is a (shape, window) pair; the group
    size is the smallest type's layer count, or the largest when it is below 1.25 times the smallest; a
    type of n layers makes g = ceil(n / size) groups, the i-th of them its layers[i::g]; types come in
    order of first appearance.
    """
    types: dict[tuple[int, int | None], list[int]] = {}
    for i, layer in enumerate(layers):
        types.setdefault(layer, []).append(i)
    fewest = min(len(v) for v in types.values())
    most = max(len(v) for v in types.values())
    size = most if most < fewest * 1.25 else fewest
    groups = []
    for (_, window), members in types.items():
        num_groups = -(-len(members) // size)
        groups += [(window, members[i::num_groups]) for i in range(num_groups)]
    return size, groups


def held_pages(num_tokens: int, page_size: int, window: int | None) -> int:
    """Pages one group holds for a sequence of ``num_tokens``: from the page of the oldest kept token
    (pages wholly before position n - W are released) to the page of the newest."""
    newest = (num_tokens - 1) // page_size
    oldest = 0 if window is None or num_tokens <= window else (num_tokens - window) // page_size
    return newest - oldest + 1


def peak_pages(num_tokens: int, page_size: int, windows: list[int | None]) -> int:
    """Most pages a sequence held while it grew to ``num_tokens``, one token at a time, over all groups."""
    return sum(max(held_pages(m, page_size, w) for m in range(1, num_tokens + 1)) for w in windows)


def longest_context(usable: int, concurrency: int, page_size: int, windows: list[int | None]) -> int | None:
    """Grow ``concurrency`` equal sequences one page of tokens at a time while their pages fit; None when
    they never stop fitting (every group windowed)."""
    peaks = [0] * len(windows)
    tokens = 0
    while True:
        grown = [
            max(peak, max(held_pages(m, page_size, w) for m in range(tokens + 1, tokens + page_size + 1)))
            for peak, w in zip(peaks, windows, strict=True)
        ]
        if concurrency * sum(grown) > usable:
            return tokens
        if grown == peaks and tokens > 0:
            return None
        peaks, tokens = grown, tokens + page_size


# ---- the groups of real models ------------------------------------------------------------------------


@needs_configs
@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_groups_of_every_config_match_the_reference(path: Path) -> None:
    raw = json.loads(path.read_text())
    size, expected = reference_groups(reference_layers(raw))
    groups = model_from_config(path).kv_cache_groups()
    assert [(g.window, list(g.layer_indices)) for g in groups] == expected
    assert {g.group_size for g in groups} == {size}
    assert kv_cache_groups(path) == groups  # the function reads a path as load_model does


def test_mistral_7b_is_one_window_group() -> None:
    groups = kv_cache_groups(config("mistral-7b-v0.1.json"))
    assert shape(groups) == [("sliding_attention", 4096, tuple(range(32)), 32)]
    assert groups[0].num_padding_layers == 0


def test_llama_3_1_8b_is_one_full_group_and_pages_as_before() -> None:
    spec = model_from_config(config("llama-3.1-8b.json"))
    assert shape(spec.kv_cache_groups()) == [("full_attention", None, tuple(range(32)), 32)]
    assert spec.kv_cache_windows() == [None]
    # One group: the grouped page is the classic all-layer page, 2 MiB at 16 tokens.
    for kv_dtype in ("bf16", "fp8", "int4"):
        assert spec.group_page_bytes(16, kv_dtype) == spec.page_bytes(16, kv_dtype)
    assert spec.group_page_bytes(16) == kv_cache_bytes(32, 8, 128, 16) == 2 * 2**20


def test_gemma_2_alternates_one_sliding_and_one_full_group() -> None:
    nine = kv_cache_groups(config("gemma-2-9b.json"))
    assert shape(nine) == [("sliding_attention", 4096, EVEN, 21), ("full_attention", None, ODD, 21)]
    twenty_seven = kv_cache_groups(config("gemma-2-27b.json"))
    assert shape(twenty_seven) == [
        ("sliding_attention", 4096, tuple(range(0, 46, 2)), 23),
        ("full_attention", None, tuple(range(1, 46, 2)), 23),
    ]


def test_gemma_3_1b_has_six_sliding_groups_two_padded_and_a_full_one() -> None:
    # 26 layers, every sixth full: full 5, 11, 17, 23; 22 sliding. Groups of 4 (the full count); the
    # 22 sliding layers make ceil(22 / 4) = 6 groups, the i-th taking every sixth sliding layer from i.
    groups = kv_cache_groups(config("gemma-3-1b-it.json"))
    assert shape(groups) == [
        ("sliding_attention", 512, (0, 7, 14, 21), 4),
        ("sliding_attention", 512, (1, 8, 15, 22), 4),
        ("sliding_attention", 512, (2, 9, 16, 24), 4),
        ("sliding_attention", 512, (3, 10, 18, 25), 4),
        ("sliding_attention", 512, (4, 12, 19), 4),
        ("sliding_attention", 512, (6, 13, 20), 4),
        ("full_attention", None, (5, 11, 17, 23), 4),
    ]
    assert [g.num_padding_layers for g in groups] == [0, 0, 0, 0, 1, 1, 0]
    assert model_preset("gemma-3-1b").kv_cache_windows() == [512] * 6 + [None]


@pytest.mark.parametrize(("name", "num_layers"), [("gpt-oss-20b", 24), ("gpt-oss-120b", 36)])
def test_gpt_oss_preset_and_config_alternate_128_token_windows(
    name: str, num_layers: int, tmp_path: Path
) -> None:
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(gpt_oss_config(num_layers)))
    from_file = model_from_config(path)
    preset = model_preset(f"openai/{name}")
    assert preset.name == name and from_file.name == name
    assert preset.groups == from_file.groups
    assert preset.layer_group_index == from_file.layer_group_index
    half = num_layers // 2
    assert [(g.kind, g.num_layers, g.window) for g in from_file.groups] == [
        ("sliding_attention", half, 128),
        ("full_attention", half, None),
    ]
    assert shape(kv_cache_groups(path)) == [
        ("sliding_attention", 128, tuple(range(0, num_layers, 2)), half),
        ("full_attention", None, tuple(range(1, num_layers, 2)), half),
    ]
    assert from_file.bytes_per_token() == num_layers * 2 * 8 * 64 * 2
    assert from_file.weight_dtype == "fp4"


def test_mla_and_constant_state_layers() -> None:
    # DeepSeek's latent pages like a full layer; Qwen3-Next's Gated-DeltaNet layers are not paged.
    assert shape(kv_cache_groups("deepseek-v2-lite")) == [("mla", None, tuple(range(27)), 27)]
    assert model_preset("deepseek-v2-lite").group_page_bytes(16) == 16 * 27 * (512 + 64) * 2
    groups = kv_cache_groups("qwen3-next-80b-a3b")
    assert shape(groups) == [("full_attention", None, tuple(range(3, 48, 4)), 12)]


def test_hand_built_spec_takes_its_groups_in_order() -> None:
    spec = ModelSpec(
        "hand",
        (LayerGroup("full_attention", 2, 8, 128), LayerGroup("sliding_attention", 5, 8, 128, window=64)),
        num_layers=7,
    )
    assert shape(spec.kv_cache_groups()) == [
        ("full_attention", None, (0, 1), 2),
        ("sliding_attention", 64, (2, 5), 2),
        ("sliding_attention", 64, (3, 6), 2),
        ("sliding_attention", 64, (4,), 2),
    ]
    ordered = ModelSpec("hand", spec.groups, num_layers=7, layer_group_index=(1, 1, 0, 1, 1, 0, 1))
    assert [g.layer_indices for g in ordered.kv_cache_groups()] == [(2, 5), (0, 4), (1, 6), (3,)]


@pytest.mark.parametrize(
    "index", [[0, 0, 1], (0, 0), (0, 0, 2), (0, 1, 1), (0, 0, True), (0, 0, -1)], ids=repr
)
def test_layer_group_index_must_name_each_group_its_layers(index: object) -> None:
    groups = (LayerGroup("full_attention", 2, 8, 128), LayerGroup("sliding_attention", 1, 8, 128, window=64))
    with pytest.raises(ConfigError, match="layer_group_index"):
        ModelSpec("x", groups, num_layers=3, layer_group_index=index)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(kind="linear_attention"), "linear_attention"),
        (dict(kind="mamba"), "kind"),
        (dict(window=None), "window"),
        (dict(layer_indices=()), "layer_indices"),
        (dict(layer_indices=[0, 1]), "layer_indices"),
        (dict(layer_indices=(1, 0)), "ascending"),
        (dict(layer_indices=(0, 0)), "ascending"),
        (dict(layer_indices=(-1, 0)), "layer_indices"),
        (dict(group_size=1), "group_size"),
        (dict(num_kv_heads=0), "num_kv_heads"),
        (dict(tp_sharded=None), "tp_sharded"),
    ],
)
def test_kv_cache_group_checks_its_fields(fields: dict[str, Any], message: str) -> None:
    valid: dict[str, Any] = dict(
        kind="sliding_attention", window=128, layer_indices=(0, 2), group_size=2, num_kv_heads=8, head_dim=64
    )
    KVCacheGroup(**valid)
    with pytest.raises(ConfigError, match=message):
        KVCacheGroup(**{**valid, **fields})


# ---- page bytes ---------------------------------------------------------------------------------------


def test_group_page_bytes_by_hand() -> None:
    gemma2 = model_from_config(config("gemma-2-9b.json"))
    # 16 tokens × 21 layers × K and V × 8 heads × 256 × 2 bytes: half of the all-layer page.
    assert gemma2.group_page_bytes(16) == 16 * 21 * 2 * 8 * 256 * 2 == 2_752_512
    assert gemma2.page_bytes(16) == 2 * 2_752_512
    assert gemma2.group_page_bytes(16, "fp8") == 2_752_512 // 2
    assert gemma2.group_page_bytes(16, tp=2) == 2_752_512 // 2  # 4 of the 8 KV heads per GPU
    assert gemma2.group_page_bytes(32, "int4") == 32 * 21 * 2 * 8 * 256 // 2
    gemma3 = model_from_config(config("gemma-3-1b-it.json"))
    assert gemma3.group_page_bytes(16) == 16 * 4 * 2 * 1 * 256 * 2 == 65_536
    assert model_preset("gpt-oss-20b").group_page_bytes(16) == 16 * 12 * 2 * 8 * 64 * 2 == 393_216
    assert model_preset("gpt-oss-120b").group_page_bytes(16) == 16 * 18 * 2 * 8 * 64 * 2


def test_padding_slots_and_narrower_groups_leave_part_of_a_page_empty() -> None:
    gemma3 = model_from_config(config("gemma-3-1b-it.json"))
    for padded in gemma3.kv_cache_groups()[4:6]:  # 3 layers in 4 slots
        assert padded.page_bytes(16) == 65_536 and padded.used_page_bytes(16) == 65_536 * 3 // 4
    # Gemma 4: 25 sliding layers (8 heads × 256) and 5 full (2 heads × 512), groups of 5; a page is sized
    # for the wider sliding layers, so the full group fills half of each of its pages.
    gemma4 = model_from_config(config("gemma-4-26b-a4b.json"))
    groups = gemma4.kv_cache_groups()
    assert [g.window for g in groups] == [1024] * 5 + [None]
    assert gemma4.group_page_bytes(16) == 16 * 5 * 2 * 8 * 256 * 2 == 655_360
    assert groups[-1].used_page_bytes(16) == groups[-1].page_bytes(16) == 16 * 5 * 2 * 2 * 512 * 2


def test_model_without_paged_layers_has_no_group_page() -> None:
    state = LayerGroup("linear_attention", 4, 0, 0, num_tensors=0, state_bytes=1024)
    spec = ModelSpec("state-only", (state,), num_layers=4)
    assert spec.kv_cache_groups() == () and spec.pages_per_sequence(100, 16) == 0
    with pytest.raises(ConfigError, match="nothing to page"):
        spec.group_page_bytes(16)


# ---- pages per sequence and the plan ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "windows"),
    [
        ("gemma-2-9b.json", [4096, None]),
        ("gemma-3-1b-it.json", [512] * 6 + [None]),
        ("mistral-7b-v0.1.json", [4096]),
        ("llama-3.1-8b.json", [None]),
    ],
)
@pytest.mark.parametrize(
    ("num_tokens", "page_size"), [(1, 16), (700, 16), (4100, 16), (5000, 16), (9000, 32), (777, 7), (520, 32)]
)
def test_pages_per_sequence_is_the_peak_of_a_growing_sequence(
    name: str, windows: list[int | None], num_tokens: int, page_size: int
) -> None:
    spec = model_from_config(config(name))
    assert spec.kv_cache_windows() == windows
    expected = peak_pages(num_tokens, page_size, windows)
    pages = spec.pages_per_sequence(num_tokens, page_size)
    # The bound assumes a window's worst alignment: exact once the sequence has passed through it (at
    # most page_size - 1 tokens past the window), never below the peak before.
    exact = all(w is None or num_tokens <= w or num_tokens >= w + page_size - 1 for w in windows)
    if exact:
        assert pages == expected
    else:
        assert expected <= pages <= expected + len(windows)


@pytest.mark.parametrize(
    ("name", "kv_dtype", "tp", "context_len", "concurrency"),
    [
        ("gemma-2-9b.json", "bf16", 1, 32768, 3),
        ("gemma-2-9b.json", "fp8", 2, 20000, 5),
        ("gemma-2-27b.json", "bf16", 1, 8192, 2),
        ("gemma-3-1b-it.json", "bf16", 1, 32768, 4),
        ("gemma-3-1b-it.json", "int8", 1, 100_000, 1),
        ("llama-3.1-8b.json", "bf16", 1, 32768, 2),
        ("mistral-7b-v0.1.json", "bf16", 1, 32768, 3),
    ],
)
def test_plan_counts_pool_pages_sequences_and_concurrency_by_group(
    name: str, kv_dtype: str, tp: int, context_len: int, concurrency: int
) -> None:
    raw = json.loads(config(name).read_text())
    size, groups = reference_groups(reference_layers(raw))
    windows = [w for w, _ in groups]
    heads = raw.get("num_key_value_heads")
    head_dim = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
    bytes_per_element = {"bf16": 2, "fp8": 1, "int8": 1}[kv_dtype]
    page = 16 * size * 2 * (heads // tp) * head_dim * bytes_per_element
    layers = raw["num_hidden_layers"]
    scales = 0 if kv_dtype == "bf16" else 4 * layers * 2 * (heads // tp)
    budget = 20_000 * page + scales + 12_345  # no weights, no reserve: 20,000 pages and change
    p = plan(
        config(name),
        gpu=budget,
        tp=tp,
        kv_dtype=kv_dtype,
        weight_bytes=0,
        reserve_bytes=0,
        context_len=context_len,
        concurrency=concurrency,
    )
    per_sequence = peak_pages(context_len, 16, windows)
    assert (p.page_bytes, p.scale_bytes, p.group_size) == (page, scales, size)
    assert p.group_windows == tuple(windows)
    assert (p.num_pages, p.usable_pages) == (20_000, 19_999)
    assert p.pages_per_request == per_sequence
    assert p.max_requests_at_context == 19_999 // per_sequence
    assert p.fits == (concurrency * per_sequence <= 19_999)
    longest = longest_context(19_999, concurrency, 16, windows)
    assert p.context_unbounded == (longest is None)
    assert p.max_context_at_concurrency == longest
    assert p.manager_kwargs() == {"num_pages": 20_000, "page_size": 16, "groups": windows}


def test_hybrid_plan_beats_one_page_table() -> None:
    # Gemma 2 9B, 32K tokens: one page table holds 2,048 all-layer pages (2 × 21 layers); with groups a
    # request holds 2,048 full-group pages and 257 sliding ones, each half the size: 1.78x the requests.
    p = plan("gemma-2-9b", gpu="H100-80G", context_len=32768)
    one_table = (p.kv_budget_bytes // model_preset("gemma-2-9b").page_bytes(16) - 1) // 2048
    assert p.pages_per_request == 2048 + 257
    assert p.max_requests_at_context == (p.num_pages - 1) // 2305
    assert one_table < p.max_requests_at_context
    assert p.padding_layers == 0 and p.padding_bytes_per_request == 0


def test_gpt_oss_plan_bounds_its_sliding_group() -> None:
    # 128-token windows over 16-token pages: at most (128 - 2) // 16 + 2 = 9 pages, whatever the context.
    p = plan("gpt-oss-20b", gpu="H100-80G", weight_bytes=14 * 10**9, context_len=131072, concurrency=4)
    assert p.group_windows == (128, None)
    assert p.pages_per_request == 9 + 131072 // 16 == peak_pages(131072, 16, [128, None])
    assert p.page_bytes == 393_216
    assert p.num_pages == p.kv_budget_bytes // 393_216
    assert p.max_requests_at_context == (p.num_pages - 1) // p.pages_per_request


def test_padding_waste_is_reported() -> None:
    p = plan("gemma-3-1b", gpu="L4", context_len=32768)
    assert p.padding_layers == 2
    # The two padded sliding groups (3 layers in 4 slots) hold 33 pages each of a 32K request, each page
    # a quarter empty.
    assert p.padding_bytes_per_request == 2 * 33 * 65_536 // 4


def test_cli_plan_prints_the_groups(capsys: pytest.CaptureFixture[str]) -> None:
    code = kvcore.cli.main(["plan", "gemma-3-1b", "--gpu", "L4", "--context", "32k"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert "65,536 B (16 tokens of one KV-cache group of 4 layer slots)" in out
    assert "groups=[512, 512, 512, 512, 512, 512, None])" in out
    assert "group 1          4 sliding_attention (window 512), layers 1,8,15,22; 33 pages @ 32,768" in out
    assert "group 6          4 full_attention, layers 5,11,17,23; 2,048 pages @ 32,768" in out
    assert "3 sliding_attention (window 512), layers 6,13,20, 1 padding slot" in out
    assert "padding            2 empty layer slots; 1,081,344 B" in out
    assert "(2,246 pages each)" in out  # 6 × 33 + 2,048


def test_cli_plan_json_has_what_the_manager_needs(capsys: pytest.CaptureFixture[str]) -> None:
    code = kvcore.cli.main(["plan", "gemma-2-9b", "--gpu", "H100-80G", "--context", "32k", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["group_windows"] == [4096, None] and data["group_size"] == 21
    assert [g["layer_indices"] for g in data["groups"]] == [list(EVEN), list(ODD)]
    assert data["pages_per_request"] == 2305
    assert data["max_requests_at_context"] == (data["num_pages"] - 1) // 2305
