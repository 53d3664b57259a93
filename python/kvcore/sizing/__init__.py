"""Sizing and capacity planning: the single source of truth for K/V bytes and pages in kvcore.

Why it exists: a model that fits in GPU memory can still run out of it once long prompts or many
requests arrive, because every active token keeps K and V in every attention layer. This package
computes those bytes exactly (GQA/MQA/MHA, MLA, sliding-window and hybrid layers, constant-state layers,
any cache precision, tensor parallelism) and plans a deployment: pages for the pool, active tokens,
concurrent requests, longest context, with the manager's KV-cache groups (:class:`KVCacheGroup`: one page
table per group of layers, so a hybrid model's sliding layers release what left their window). The pool
and the manager size themselves with :func:`kv_cache_bytes`, :meth:`ModelSpec.page_bytes` (one page
table) or :meth:`ModelSpec.group_page_bytes` (KV-cache groups) and :func:`pages_for_budget`, so the
planner and the allocator cannot disagree. It imports nothing beyond the standard library.

Quick use::

    >>> from kvcore.sizing import kv_cache_bytes, size
    >>> kv_cache_bytes(80, 8, 128, 4096)          # 70B-class, bf16, 4,096 tokens
    1342177280
    >>> size("mistral-7b", 131072).kv_bytes       # bounded by the 4,096-token window
    536870912

Command line: ``kvcore size MODEL --context 32k --batch 4 --kv-dtype fp8`` and ``kvcore plan MODEL --gpu
H100-80G --context 32k``.
"""

from __future__ import annotations

from kvcore.sizing.dtypes import (
    KV_DTYPES,
    SCALE_BYTES,
    WEIGHT_DTYPES,
    is_quantized_kv_dtype,
    kv_dtype_bits,
    kv_dtype_bytes,
    normalize_kv_dtype,
    normalize_weight_dtype,
    weight_dtype_bits,
)
from kvcore.sizing.formula import kv_cache_bytes, pages_for_budget, pages_per_request, weight_bytes
from kvcore.sizing.model import (
    LAYER_KINDS,
    MAX_CONFIG_BYTES,
    MAX_LAYERS,
    KVCacheGroup,
    LayerGroup,
    ModelSpec,
    kv_cache_groups,
    load_model,
    model_from_config,
)
from kvcore.sizing.plan import (
    DEFAULT_PAGE_SIZE,
    DEFAULT_RESERVE_FRACTION,
    MAX_KV_CACHE_GROUPS,
    GroupSize,
    Plan,
    SizeReport,
    plan,
    size,
)
from kvcore.sizing.presets import GPU_PRESETS, MODEL_PRESETS, GpuSpec, ModelPreset, gpu_preset, model_preset
from kvcore.sizing.units import format_bytes, parse_bytes, parse_count, parse_tokens

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_RESERVE_FRACTION",
    "GPU_PRESETS",
    "KV_DTYPES",
    "LAYER_KINDS",
    "MAX_CONFIG_BYTES",
    "MAX_KV_CACHE_GROUPS",
    "MAX_LAYERS",
    "MODEL_PRESETS",
    "SCALE_BYTES",
    "WEIGHT_DTYPES",
    "GpuSpec",
    "GroupSize",
    "KVCacheGroup",
    "LayerGroup",
    "ModelPreset",
    "ModelSpec",
    "Plan",
    "SizeReport",
    "format_bytes",
    "gpu_preset",
    "is_quantized_kv_dtype",
    "kv_cache_bytes",
    "kv_cache_groups",
    "kv_dtype_bits",
    "kv_dtype_bytes",
    "load_model",
    "model_from_config",
    "model_preset",
    "normalize_kv_dtype",
    "normalize_weight_dtype",
    "pages_for_budget",
    "pages_per_request",
    "parse_bytes",
    "parse_count",
    "parse_tokens",
    "plan",
    "size",
    "weight_bytes",
    "weight_dtype_bits",
]
