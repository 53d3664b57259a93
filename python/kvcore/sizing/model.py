"""What a model caches per token: layer groups read from an HF ``config.json``, a dict or a preset.

Why layer *groups*: the plain formula assumes every layer caches K and V for the whole context. Modern
models do not. Sliding-window layers stop growing at their window (Mistral 7B, Gemma 2/3/4), MLA layers
cache one compressed latent instead of K and V (DeepSeek V2/V3), linear-attention layers keep a
constant-size state (Qwen3-Next), and hybrids mix them. A :class:`ModelSpec` is therefore a list of
:class:`LayerGroup`, each with one per-token cost and one growth rule, and every byte figure in kvcore
is a sum over groups.

Why also :class:`KVCacheGroup`: a layer group says what layers *cost*; a KV-cache group says how the
manager *pages* them. ``KVCacheManager(groups=[...])`` keeps one page table per sequence per KV-cache
group, so a sliding group frees the pages that left its window while a full group keeps them all, and
every page of the shared pool has the same byte size. :meth:`ModelSpec.kv_cache_groups` derives that
layout from the layer groups (the rule is in its docstring).

Reading configs follows the Hugging Face semantics of each field and never guesses: a field whose
meaning kvcore cannot pin down (a ``sliding_window`` on an architecture whose windowed layers it does
not know, a ``layer_types`` entry it has never seen, two fields that disagree) raises
:class:`~kvcore.exceptions.ConfigError` naming the field.

Config files are read as strict JSON (:mod:`kvcore._json`: UTF-8, finite numbers, bounded nesting) of at
most :data:`MAX_CONFIG_BYTES`; a model has at most :data:`MAX_LAYERS` layers, and every integer field is
at most int64. Errors read from a file name the file.

Tensor parallelism divides K/V heads across GPUs. When a model has fewer K/V heads than GPUs, heads are
replicated (each GPU keeps ``max(1, kv_heads // tp)`` heads), so the per-GPU cache stops shrinking. An
MLA latent is not split by heads at all: every GPU keeps the whole latent.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcore._json import JSONInputError, decode_utf8, loads, show
from kvcore.exceptions import ConfigError
from kvcore.sizing.dtypes import (
    SCALE_BYTES,
    is_quantized_kv_dtype,
    kv_dtype_bits,
    normalize_kv_dtype,
    normalize_weight_dtype,
    weight_dtype_bits,
)
from kvcore.sizing.formula import MAX_INT, bits_to_bytes, check_int, pages_per_request

__all__ = [
    "LAYER_KINDS",
    "MAX_CONFIG_BYTES",
    "MAX_LAYERS",
    "KVCacheGroup",
    "LayerGroup",
    "ModelSpec",
    "kv_cache_groups",
    "load_model",
    "model_from_config",
]

# Most decoder layers a config may declare. Far above any published model (Llama 3.1 405B has 126), and
# low enough that the per-layer lists built while reading a config stay small whatever the file says.
MAX_LAYERS = 65_536
# Largest config.json read (real ones are a few KiB): a bound on memory for a path to something else.
MAX_CONFIG_BYTES = 64 * 2**20

# What a group of layers keeps per token.
#   full_attention     K and V of every token of the context
#   sliding_attention  K and V of the last `window` tokens (the cache stops growing at the window)
#   chunked_attention  K and V of the current attention chunk (at most `window` = attention_chunk_size)
#   mla                one latent vector (kv_lora_rank + qk_rope_head_dim) per token, not K and V
#   linear_attention   no per-token cache: a constant-size recurrent + convolution state per sequence
#   mamba              no per-token cache: a constant-size SSM + convolution state per sequence (Jamba,
#                      Nemotron-H)
#   mlp                nothing at all: a layer without attention or state (Nemotron-H's MLP/MoE layers)
LAYER_KINDS: tuple[str, ...] = (
    "full_attention",
    "sliding_attention",
    "chunked_attention",
    "mla",
    "linear_attention",
    "mamba",
    "mlp",
)
# Kinds that keep a constant state per sequence instead of a per-token cache.
_STATE_KINDS = ("linear_attention", "mamba")


def _check_tp(tp: int) -> int:
    return check_int(tp, "tp", minimum=1)


@dataclass(frozen=True, slots=True)
class LayerGroup:
    """Layers that cache the same thing per token and grow by the same rule.

    A group exists so that a hybrid model is a short list of (count, per-token cost, growth rule)
    triples rather than one formula with special cases. Sizes here are for the whole model; the
    ``*_per_gpu`` methods apply tensor parallelism.
    """

    # One of LAYER_KINDS.
    kind: str
    # Layers in the group; >= 1.
    num_layers: int
    # K/V heads per layer across the whole model (before tensor parallelism); >= 1 for cached kinds
    # (1 for MLA's latent), 0 for linear_attention, mamba and mlp.
    num_kv_heads: int
    # Elements per head per token; >= 1 for cached kinds (MLA: kv_lora_rank + qk_rope_head_dim), 0 otherwise.
    head_dim: int
    # Tensors cached per token and head: 2 (K and V), 1 (MLA latent), 0 (linear_attention, mamba, mlp).
    num_tensors: int = 2
    # Tokens after which a layer stops growing (sliding window, attention chunk); None = whole context.
    # Set exactly for sliding_attention and chunked_attention, None for the other kinds; >= 1.
    window: int | None = None
    # Constant bytes per sequence per layer (linear_attention and mamba state, >= 1); 0 for the other kinds.
    state_bytes: int = 0
    # Whether tensor parallelism splits this group by head (False for MLA: each GPU keeps the latent).
    tp_sharded: bool = True

    def __post_init__(self) -> None:
        if self.kind not in LAYER_KINDS:
            raise ConfigError(
                f"kind: unknown layer kind {self.kind!r}; expected one of {', '.join(LAYER_KINDS)}"
            )
        check_int(self.num_layers, "num_layers", minimum=1)
        check_int(self.state_bytes, "state_bytes")
        # Integers, not merely numbers that compare equal to one (2.0 == 2).
        check_int(self.num_kv_heads, "num_kv_heads")
        check_int(self.head_dim, "head_dim")
        check_int(self.num_tensors, "num_tensors")
        if self.window is not None:
            check_int(self.window, "window", minimum=1)
        if not isinstance(self.tp_sharded, bool):
            raise ConfigError(f"tp_sharded: expected true or false, got {show(self.tp_sharded)}")
        if self.kind in _STATE_KINDS or self.kind == "mlp":
            if self.num_kv_heads or self.head_dim or self.num_tensors or self.window is not None:
                raise ConfigError(f"{self.kind}: a layer without attention caches no per-token K/V")
            if self.kind == "mlp":
                if self.state_bytes:
                    raise ConfigError("state_bytes: mlp layers keep no state")
                return
            check_int(self.state_bytes, "state_bytes", minimum=1)
            return
        check_int(self.num_kv_heads, "num_kv_heads", minimum=1)
        check_int(self.head_dim, "head_dim", minimum=1)
        if self.num_tensors not in (1, 2):
            raise ConfigError(f"num_tensors: must be 1 (MLA latent) or 2 (K and V), got {self.num_tensors!r}")
        if self.state_bytes:
            raise ConfigError(f"state_bytes: only linear_attention groups keep a state, not {self.kind}")
        windowed = self.kind in ("sliding_attention", "chunked_attention")
        if windowed:
            check_int(self.window, "window", minimum=1)
        elif self.window is not None:
            raise ConfigError(f"window: {self.kind} layers have no window, got {self.window!r}")

    @property
    def caches_tokens(self) -> bool:
        """True when the layers keep something per token (every kind but linear_attention, mamba, mlp)."""
        return self.num_tensors > 0

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """Heads one GPU keeps under ``tp``-way tensor parallelism.

        Heads are split evenly when ``kv_heads >= tp`` and replicated when ``kv_heads < tp`` (each GPU
        keeps one head, ``max(1, kv_heads // tp)``); MLA latents are never split.

        Raises:
            ConfigError: ``tp`` and the head count do not divide one another (no engine shards that way).
        """
        _check_tp(tp)
        heads = self.num_kv_heads
        if not self.tp_sharded or tp == 1 or heads == 0:
            return heads
        if heads >= tp:
            if heads % tp:
                raise ConfigError(f"tp: {heads} KV heads cannot be split evenly across {tp} GPUs")
            return heads // tp
        if tp % heads:
            raise ConfigError(f"tp: {tp} GPUs cannot replicate {heads} KV heads evenly")
        return 1

    def elements_per_token(self, tp: int = 1) -> int:
        """Cached elements per token for the whole group on one GPU (before any window applies)."""
        return self.num_layers * self.num_tensors * self.kv_heads_per_gpu(tp) * self.head_dim

    def cached_tokens(self, num_tokens: int) -> int:
        """Tokens a layer of this group holds for a sequence of ``num_tokens`` (0 for constant state)."""
        check_int(num_tokens, "num_tokens")
        if not self.caches_tokens:
            return 0
        return num_tokens if self.window is None else min(num_tokens, self.window)

    def scale_bytes(self, kv_dtype: str, tp: int = 1) -> int:
        """Scale bytes of the group on one GPU: one fp32 per layer, tensor and KV head if quantized.

        A constant of the pool, not a cost per token (see :mod:`kvcore.sizing.dtypes`).
        """
        heads = self.kv_heads_per_gpu(tp)
        if not is_quantized_kv_dtype(kv_dtype):
            return 0
        return SCALE_BYTES * self.num_layers * self.num_tensors * heads

    def state_bytes_per_gpu(self, tp: int = 1) -> int:
        """Constant state of one sequence for the whole group on one GPU (split by head, rounded up)."""
        _check_tp(tp)
        total = self.num_layers * self.state_bytes
        if not self.tp_sharded:
            return total
        return -(-total // tp)

    def describe(self) -> str:
        """One line: ``'25 sliding_attention (window 1,024)'``."""
        text = f"{self.num_layers} {self.kind}"
        if self.window is not None:
            text += f" (window {self.window:,})"
        return text


@dataclass(frozen=True, slots=True)
class KVCacheGroup:
    """Layers that share one page table per sequence: one entry of ``KVCacheManager(groups=...)``.

    Why it exists: with one page table for all layers, the full-attention layers of a hybrid model keep
    every page of a sequence alive, so its sliding layers cannot give back what left their window. With
    one page table per group (vLLM's hybrid allocator), a sliding group holds only the pages its window
    touches. All groups draw on one pool of equal-size pages, so every group is laid out for the same
    number of layer slots (``group_size``); a group with fewer layers leaves the rest of each of its pages
    empty (``num_padding_layers``). Built by :meth:`ModelSpec.kv_cache_groups`.
    """

    # One of LAYER_KINDS except linear_attention, mamba and mlp (nothing per token to page).
    kind: str
    # Tokens each layer keeps (sliding window, attention chunk); None for full_attention and mla; >= 1.
    # What the manager takes: ``groups=[g.window for g in groups]``.
    window: int | None
    # [num_layers] decoder-layer indices of the group, strictly ascending, each >= 0; at least one.
    layer_indices: tuple[int, ...]
    # Layer slots one page of the group is laid out for (the same in every group of a model);
    # >= len(layer_indices); the difference is padding.
    group_size: int
    # K/V heads per layer across the whole model (before tensor parallelism); >= 1 (1 for an MLA latent).
    num_kv_heads: int
    # Elements per head per token (MLA: kv_lora_rank + qk_rope_head_dim); >= 1.
    head_dim: int
    # Tensors cached per token and head: 2 (K and V) or 1 (MLA latent).
    num_tensors: int = 2
    # Whether tensor parallelism splits the group by head (False for MLA: each GPU keeps the latent).
    tp_sharded: bool = True

    def __post_init__(self) -> None:
        if self.kind in _STATE_KINDS or self.kind == "mlp":
            raise ConfigError(f"kind: {self.kind} layers keep no per-token K/V; they are not paged")
        indices = self.layer_indices
        if not isinstance(indices, tuple) or not indices:
            raise ConfigError(
                f"layer_indices: expected a non-empty tuple of layer indices, got {show(indices)}"
            )
        previous = -1
        for i, layer in enumerate(indices):
            check_int(layer, f"layer_indices[{i}]")
            if layer <= previous:
                raise ConfigError(f"layer_indices[{i}]: indices must be strictly ascending, got {layer}")
            previous = layer
        check_int(self.group_size, "group_size", minimum=len(indices))
        self._slot_shape()  # the shape fields, checked as a LayerGroup checks them

    def _slot_shape(self) -> LayerGroup:
        """``group_size`` layers of this group's shape: what one of its pages is laid out for."""
        return LayerGroup(
            self.kind,
            self.group_size,
            self.num_kv_heads,
            self.head_dim,
            self.num_tensors,
            self.window,
            tp_sharded=self.tp_sharded,
        )

    @property
    def num_layers(self) -> int:
        """Layers of the model in this group."""
        return len(self.layer_indices)

    @property
    def num_padding_layers(self) -> int:
        """Layer slots of each page that no layer of this group fills (``group_size - num_layers``)."""
        return self.group_size - len(self.layer_indices)

    def page_bytes(self, page_size: int, kv_dtype: str = "bf16", tp: int = 1) -> int:
        """Bytes one page of this group needs on one GPU: ``page_size`` tokens of ``group_size`` layer
        slots of its shape, padding included, no scales. The pool's page is the largest of these over the
        model's groups (:meth:`ModelSpec.group_page_bytes`)."""
        check_int(page_size, "page_size", minimum=1)
        return bits_to_bytes(page_size * self._slot_shape().elements_per_token(tp) * kv_dtype_bits(kv_dtype))

    def used_page_bytes(self, page_size: int, kv_dtype: str = "bf16", tp: int = 1) -> int:
        """Bytes of one page that the group's own layers fill (``page_bytes`` less the padding slots)."""
        check_int(page_size, "page_size", minimum=1)
        elements = self._slot_shape().elements_per_token(tp) // self.group_size * self.num_layers
        return bits_to_bytes(page_size * elements * kv_dtype_bits(kv_dtype))

    def pages_per_sequence(self, num_tokens: int, page_size: int) -> int:
        """Pages of this group one sequence of ``num_tokens`` holds in decode: ``ceil(n / page_size)``, at
        most ``(W - 2) // page_size + 2`` for a window of ``W`` (pages wholly before ``n - W`` released)."""
        return pages_per_request(num_tokens, page_size, self.window)

    def describe(self) -> str:
        """One line: ``'4 sliding_attention (window 512), layers 0-3'`` (padding, if any, at the end)."""
        text = f"{self.num_layers} {self.kind}"
        if self.window is not None:
            text += f" (window {self.window:,})"
        text += f", layers {_layer_list(self.layer_indices)}"
        if self.num_padding_layers:
            text += f", {self.num_padding_layers} padding slot{'s' if self.num_padding_layers != 1 else ''}"
        return text


def _layer_list(indices: tuple[int, ...]) -> str:
    """Layer indices in a few characters: ``0-3``, ``0-4,6-10``, ``1,3,5,...,41``."""
    runs: list[list[int]] = []
    for layer in indices:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    text = [f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs]
    if len(runs) <= 4:
        return ",".join(text)
    if len(runs) == len(indices) and len({b - a for a, b in itertools.pairwise(indices)}) == 1:
        return f"{indices[0]},{indices[1]},{indices[2]},...,{indices[-1]}"
    return ",".join(text[:3]) + f",...,{text[-1]}"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Everything kvcore needs to size a model's cache: its layer groups and a few facts around them.

    Built from a config (:func:`model_from_config`), a preset or a name (:func:`load_model`), or by
    hand for an architecture no config describes. All byte methods return exact integers; quantization
    scales are only counted where a method says so.
    """

    # Preset name, or the config's file/directory name ("config" for a dict).
    name: str
    # Layer groups in order of first appearance; at least one group; kinds may repeat only if their
    # shapes differ.
    groups: tuple[LayerGroup, ...]
    # Decoder layers; == sum(g.num_layers for g in groups) + num_kv_shared_layers.
    num_layers: int
    # Trailing layers that reuse an earlier layer's K/V (Gemma 3n/4 `num_kv_shared_layers`); they cache
    # nothing themselves; >= 0.
    num_kv_shared_layers: int = 0
    # Longest context the model supports (max_position_embeddings); None if not stated; >= 1.
    max_context_len: int | None = None
    # Total parameters (presets: the rounded model-card figure); None when unknown; >= 1.
    num_params: int | None = None
    # Precision of the checkpoint's weights as declared (torch_dtype / quantization_config); None if not.
    weight_dtype: str | None = None
    # Where the description came from: "preset", a file path, or "dict".
    source: str = "dict"
    # [num_layers - num_kv_shared_layers] index into `groups` of each layer that owns a cache, in layer
    # order (a config's layer_types); None = the groups' layers one after the other, in group order.
    layer_group_index: tuple[int, ...] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError(f"name: expected a string, got {show(self.name)}")
        if not isinstance(self.source, str):
            raise ConfigError(f"source: expected a string, got {show(self.source)}")
        if not isinstance(self.groups, tuple) or not all(isinstance(g, LayerGroup) for g in self.groups):
            raise ConfigError(f"groups: expected a tuple of LayerGroup, got {show(self.groups)}")
        if not self.groups:
            raise ConfigError(f"{self.name}: a model needs at least one layer group")
        check_int(self.num_kv_shared_layers, "num_kv_shared_layers")
        counted = sum(g.num_layers for g in self.groups) + self.num_kv_shared_layers
        if check_int(self.num_layers, "num_layers", minimum=1) != counted:
            raise ConfigError(
                f"num_layers: {self.num_layers} layers but the groups and shared layers count {counted}"
            )
        if self.max_context_len is not None:
            check_int(self.max_context_len, "max_context_len", minimum=1)
        if self.num_params is not None:
            check_int(self.num_params, "num_params", minimum=1)
        if self.weight_dtype is not None:
            normalize_weight_dtype(self.weight_dtype)
        if self.layer_group_index is not None:
            self._check_layer_group_index(self.layer_group_index)

    def _check_layer_group_index(self, index: object) -> None:
        own = self.num_layers - self.num_kv_shared_layers
        if not isinstance(index, tuple) or len(index) != own:
            raise ConfigError(
                f"layer_group_index: expected a tuple of {own} group indices, got {show(index)}"
            )
        counts = [0] * len(self.groups)
        for layer, group in enumerate(index):
            check_int(group, f"layer_group_index[{layer}]", maximum=len(self.groups) - 1)
            counts[group] += 1
        for group, count in zip(self.groups, counts, strict=True):
            if count != group.num_layers:
                raise ConfigError(f"layer_group_index: names {count} layers of the {group.describe()} group")

    # ---- structure -------------------------------------------------------------------------------

    @property
    def cache_groups(self) -> tuple[LayerGroup, ...]:
        """Groups that keep something per token (everything but constant-state layers)."""
        return tuple(g for g in self.groups if g.caches_tokens)

    @property
    def is_mla(self) -> bool:
        """True when the attention layers cache an MLA latent instead of K and V."""
        return any(g.kind == "mla" for g in self.groups)

    def window_bound(self) -> int | None:
        """Tokens after which a whole sequence stops growing: the largest window, if *every* cached
        group has one (Mistral 7B: 4,096); None when any layer keeps the whole context."""
        windows = [g.window for g in self.cache_groups]
        if not windows or any(w is None for w in windows):
            return None
        return max(w for w in windows if w is not None)

    def kv_cache_groups(self) -> tuple[KVCacheGroup, ...]:
        """The manager's KV-cache groups for this model (empty if no layer caches tokens).

        The rule is vLLM's hybrid allocator with a uniform page size (``vllm/v1/core/kv_cache_utils.py``,
        ``_get_kv_cache_groups_uniform_page_size``): each layer group that caches tokens is one attention
        type; the group size is the smallest number of layers of one type, or the largest when that is
        below 1.25 times the smallest (12 sliding + 13 full layers: groups of 13, not 12 + 12 + 1); a type
        of ``n`` layers makes ``ceil(n / size)`` groups and its ``i``-th layer, in layer order, goes to
        group ``i mod ceil(n / size)`` (vLLM's ``layers[i::num_groups]``), so a type whose count does not
        divide leaves a padding slot in each of its last groups. Groups come type by type, in order of
        first appearance. So Llama and Mistral 7B have one group of 32 layers, Gemma 2 9B one sliding and
        one full group of 21, Gemma 3 1B six sliding groups of 4 slots (the last two with 3 layers and a
        padding slot each) and one full group of 4. MLA layers form full groups; chunked layers window
        groups (a window of the chunk size holds every chunk); constant-state and mlp layers no group
        (their state, if any, is set aside per request).

        Raises:
            ConfigError: more than MAX_LAYERS layers (each group lists its layers).
        """
        if self.num_layers > MAX_LAYERS:
            raise ConfigError(f"num_layers: {self.num_layers:,} layers is more than {MAX_LAYERS:,}")
        index = self.layer_group_index
        if index is None:
            index = tuple(i for i, g in enumerate(self.groups) for _ in range(g.num_layers))
        layers_of: list[list[int]] = [[] for _ in self.groups]
        for layer, group in enumerate(index):
            layers_of[group].append(layer)
        typed = [(g, layers_of[i]) for i, g in enumerate(self.groups) if g.caches_tokens]
        if not typed:
            return ()
        # vLLM counts every layer type with a cache spec, constant-state ones (Mamba, linear attention)
        # included, though kvcore sets their state aside instead of paging it.
        counted = [g.num_layers for g in self.groups if g.caches_tokens or g.state_bytes > 0]
        fewest, most = min(counted), max(counted)
        # vLLM's test, `max_num_layers < min_num_layers * 1.25`, in integers.
        size = most if 4 * most < 5 * fewest else fewest
        out: list[KVCacheGroup] = []
        for g, layers in typed:
            num_groups = -(-len(layers) // size)
            for start in range(num_groups):
                out.append(
                    KVCacheGroup(
                        kind=g.kind,
                        window=g.window,
                        layer_indices=tuple(layers[start::num_groups]),
                        group_size=size,
                        num_kv_heads=g.num_kv_heads,
                        head_dim=g.head_dim,
                        num_tensors=g.num_tensors,
                        tp_sharded=g.tp_sharded,
                    )
                )
        return tuple(out)

    def kv_cache_windows(self) -> list[int | None]:
        """``KVCacheManager(groups=...)`` for this model: each KV-cache group's window, None = full."""
        return [g.window for g in self.kv_cache_groups()]

    def validate_tp(self, tp: int) -> None:
        """Raise ConfigError (naming ``tp``) if some group's heads cannot be sharded ``tp`` ways."""
        for group in self.groups:
            group.kv_heads_per_gpu(tp)

    def describe(self) -> str:
        """One line: ``'30 layers: 25 sliding_attention (window 1,024) + 5 full_attention'``."""
        parts = [g.describe() for g in self.groups]
        if self.num_kv_shared_layers:
            parts.append(f"{self.num_kv_shared_layers} kv_shared (no own cache)")
        return f"{self.num_layers} layers: " + " + ".join(parts)

    # ---- bytes -----------------------------------------------------------------------------------

    def elements_per_token(self, tp: int = 1) -> int:
        """Cached elements per token over all layers on one GPU, before windows bound anything."""
        _check_tp(tp)
        return sum(g.elements_per_token(tp) for g in self.cache_groups)

    def bytes_per_token(self, kv_dtype: str = "bf16", tp: int = 1) -> int:
        """K/V bytes each new token adds while the context is shorter than every window (no scales).

        32 layers × 2 × 8 heads × 128 × 2 bytes = 131,072 bytes (128 KiB) for a Llama-3.1-8B-like model.
        """
        return bits_to_bytes(self.elements_per_token(tp) * kv_dtype_bits(kv_dtype))

    def kv_bytes(self, num_tokens: int, kv_dtype: str = "bf16", batch: int = 1, tp: int = 1) -> int:
        """K/V bytes of ``batch`` sequences of ``num_tokens`` tokens on one GPU; windows applied, no
        scales, no constant state. For a full-attention model this equals :func:`kv_cache_bytes`."""
        check_int(num_tokens, "num_tokens")
        check_int(batch, "batch")
        _check_tp(tp)
        elements = sum(g.elements_per_token(tp) * g.cached_tokens(num_tokens) for g in self.cache_groups)
        return bits_to_bytes(elements * batch * kv_dtype_bits(kv_dtype))

    def scale_bytes(self, kv_dtype: str = "bf16", tp: int = 1) -> int:
        """Scale bytes of a pool on one GPU (0 unless fp8/int8/int4): a constant, whatever the tokens."""
        normalize_kv_dtype(kv_dtype)
        _check_tp(tp)
        return sum(g.scale_bytes(kv_dtype, tp) for g in self.cache_groups)

    def state_bytes(self, batch: int = 1, tp: int = 1) -> int:
        """Constant-state bytes of ``batch`` sequences on one GPU, whatever their length."""
        check_int(batch, "batch")
        return batch * sum(g.state_bytes_per_gpu(tp) for g in self.groups)

    def total_bytes(self, num_tokens: int, kv_dtype: str = "bf16", batch: int = 1, tp: int = 1) -> int:
        """Everything ``batch`` sequences of ``num_tokens`` tokens keep on one GPU: K/V (windows
        applied), the pool's scales if the precision is quantized, and constant state."""
        return (
            self.kv_bytes(num_tokens, kv_dtype, batch, tp)
            + self.scale_bytes(kv_dtype, tp)
            + self.state_bytes(batch, tp)
        )

    def page_bytes(self, page_size: int, kv_dtype: str = "bf16", tp: int = 1) -> int:
        """Bytes of one pool page on one GPU: ``page_size`` tokens of K/V for every caching layer.

        kvcore's pool has one page table per sequence, so one page holds a token range for *all*
        layers; that is the unit :func:`pages_for_budget` counts. For a uniform full-attention model
        it is ``kv_cache_bytes(layers, kv_heads, head_dim, page_size, kv_dtype)``, what ``KVPool`` uses.
        """
        check_int(page_size, "page_size", minimum=1)
        return bits_to_bytes(page_size * self.elements_per_token(tp) * kv_dtype_bits(kv_dtype))

    def group_page_bytes(self, page_size: int, kv_dtype: str = "bf16", tp: int = 1) -> int:
        """Bytes of one page of the pool a KV-cache-grouped manager uses, on one GPU.

        One page holds ``page_size`` tokens of one KV-cache group: ``group_size`` layer slots of K/V
        (no scales, which the pool keeps once beside its pages, see :meth:`scale_bytes`). When the types
        differ in shape (Gemma 4's wider full layers), it is the largest group's need, so every group fits.
        Equals :meth:`page_bytes` when the model has a single group (every layer of one type).

        Raises:
            ConfigError: a bad argument, or no layer that caches tokens.
        """
        check_int(page_size, "page_size", minimum=1)
        normalize_kv_dtype(kv_dtype)
        _check_tp(tp)
        groups = self.kv_cache_groups()
        if not groups:
            raise ConfigError(f"model: {self.name} has no layer that caches tokens; there is nothing to page")
        return max(g.page_bytes(page_size, kv_dtype, tp) for g in groups)

    def pages_per_sequence(self, num_tokens: int, page_size: int) -> int:
        """Pages one sequence of ``num_tokens`` holds in decode under the KV-cache groups: the sum over
        groups of ``ceil(n / page_size)`` (full) or ``min(ceil(n / page_size), (W - 2) // page_size + 2)``
        (window ``W``)."""
        check_int(num_tokens, "num_tokens")
        check_int(page_size, "page_size", minimum=1)
        return sum(g.pages_per_sequence(num_tokens, page_size) for g in self.kv_cache_groups())

    def weight_bytes_estimate(self, weight_dtype: str | None = None) -> int | None:
        """Parameters × weight width, if both are known (``weight_dtype`` overrides the declared one)."""
        if weight_dtype is not None:
            normalize_weight_dtype(weight_dtype)
        dtype = weight_dtype or self.weight_dtype
        if self.num_params is None or dtype is None:
            return None
        return bits_to_bytes(self.num_params * weight_dtype_bits(dtype))


# ---- reading configs -----------------------------------------------------------------------------

# Architectures whose `sliding_window` applies to every layer when nothing else says which layers use it
# (HF: MistralAttention, MixtralAttention, Phi3Attention, Starcoder2Attention pass it to every layer).
_ALL_LAYERS_SLIDE = frozenset({"mistral", "mixtral", "phi3", "phimoe", "starcoder2"})
# Architectures with an implied alternation when the config states none (HF defaults):
# Gemma 2 alternates sliding/full starting with sliding; Gemma 3 has 5 sliding then 1 full.
_IMPLIED_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6}
# Attention shapes an architecture's HF config class defaults to when its config.json leaves them out
# (HF fills them in at load time, so the checkpoint has them): Gemma's head_dim is 256 whatever
# hidden_size / num_attention_heads gives (gemma-3-12b: 3840 / 16 = 240, its heads are 256 wide).
_HF_ATTENTION_DEFAULTS: dict[str, dict[str, int]] = {
    "gemma": {"num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256},
    "gemma2": {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256},
    "gemma3": {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256},
    "gemma3_text": {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256},
}
# Sub-configs that hold the language model of a multimodal config.
_TEXT_CONFIG_KEYS = ("text_config", "language_config", "llm_config")
_KNOWN_LAYER_TYPES = frozenset(
    {"full_attention", "sliding_attention", "chunked_attention", "linear_attention"}
)


class _Fields:
    """Typed access to one config mapping; every error names the field with its path."""

    def __init__(self, data: Mapping[str, Any], prefix: str, label: str) -> None:
        self.data = data
        self.prefix = prefix
        self.label = label

    def path(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.label}: {self.path(key)}: {message}")

    def raw(self, *keys: str) -> tuple[str, Any]:
        """First of ``keys`` that is present and not null, as (key, value); aliases must agree."""
        found: list[tuple[str, Any]] = [(k, self.data[k]) for k in keys if self.data.get(k) is not None]
        if not found:
            return keys[0], None
        for key, value in found:
            # Only scalars are compared: == on two lists nested 900 deep would exhaust the stack.
            if not isinstance(value, (int, float, str)):
                raise self.fail(key, f"expected a number or a string, got {show(value)}")
        for key, value in found[1:]:
            if value != found[0][1]:
                raise self.fail(
                    found[0][0],
                    f"{show(found[0][1])} contradicts {self.path(key)} = {show(value)}; they must agree",
                )
        return found[0]

    def int_(
        self, *keys: str, minimum: int = 1, maximum: int = MAX_INT, required: bool = False
    ) -> int | None:
        key, value = self.raw(*keys)
        if value is None:
            if required:
                raise self.fail(key, "missing (needed to size the KV cache)")
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {show(value)}")
        if value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {show(value)}")
        if value > maximum:
            raise self.fail(key, f"must be <= {maximum:,}, got {show(value)}")
        return value

    def need(self, *keys: str, minimum: int = 1, maximum: int = MAX_INT) -> int:
        value = self.int_(*keys, minimum=minimum, maximum=maximum, required=True)
        assert value is not None
        return value

    def str_(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {show(value)}")
        return value

    def flag(self, key: str) -> bool | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {show(value)}")
        return value


def _json_type(value: object) -> str:
    """The JSON name of a parsed value's type (for messages about a file's content)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _read_config_file(path: Path) -> tuple[Mapping[str, Any], str]:
    try:
        if path.is_dir():
            path = path / "config.json"
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; a FIFO, a device or
        # a socket is then refused below, before anything is read from it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            regular = stat.S_ISREG(os.fstat(f.fileno()).st_mode)
            data_bytes = f.read(MAX_CONFIG_BYTES + 1) if regular else b""
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigError(
            f"config: cannot read {str(path)!r}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    if not regular:
        raise ConfigError(f"config: {str(path)!r} is not a regular file (a FIFO, device or socket?)")
    if len(data_bytes) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"config: {str(path)!r} is larger than {MAX_CONFIG_BYTES:,} bytes: not a config.json"
        )
    # A UTF-8 byte-order mark (some Windows editors write one) is not part of the JSON text.
    data_bytes = data_bytes.removeprefix(b"\xef\xbb\xbf")
    try:
        data = loads(decode_utf8(data_bytes))
    except JSONInputError as exc:
        raise ConfigError(f"config: {str(path)!r}: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"config: {str(path)!r} holds a JSON {_json_type(data)}, not an object")
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return data, name


def _text_fields(config: Mapping[str, Any], label: str) -> _Fields:
    """The mapping that describes the language model (top level, or text_config of a multimodal one)."""
    top = _Fields(config, "", label)
    if top.raw("num_hidden_layers", "n_layer", "num_layers")[1] is not None:
        return top
    for key in _TEXT_CONFIG_KEYS:
        sub = config.get(key)
        if isinstance(sub, Mapping):
            return _Fields(sub, f"{key}.", label)
    raise top.fail("num_hidden_layers", "missing (needed to size the KV cache)")


def _weight_dtype(config: Mapping[str, Any], fields: _Fields) -> str | None:
    """Declared weight precision: quantization_config first, then torch_dtype/dtype; None if unknown."""
    for source in (fields.data, config):
        quant = source.get("quantization_config")
        if isinstance(quant, Mapping):
            method = quant.get("quant_method")
            method = method.lower() if isinstance(method, str) else ""
            if method in ("fp8", "fbgemm_fp8"):
                return "fp8"
            if method == "mxfp4":
                return "fp4"
            bits = quant.get("bits", quant.get("w_bit"))
            if bits in (4, 8):
                return "int4" if bits == 4 else "int8"
            return None
    return _torch_dtype(config, fields)


def _torch_dtype(config: Mapping[str, Any], fields: _Fields) -> str | None:
    """The declared ``torch_dtype`` / ``dtype`` (the first one found), normalized; None if none or
    unknown."""
    for source in (fields.data, config):
        for key in ("torch_dtype", "dtype"):
            value = source.get(key)
            if isinstance(value, str):
                try:
                    return normalize_weight_dtype(value)
                except ConfigError:
                    return None
    return None


def _state_dtype(config: Mapping[str, Any], fields: _Fields, what: str) -> str:
    """The precision of a constant state: the activations' (``torch_dtype`` / ``dtype``), never the
    quantized weights' (a 4-bit checkpoint keeps its state in bf16).

    Raises:
        ConfigError: no known dtype declared.
    """
    dtype = _torch_dtype(config, fields)
    if dtype is None:
        raise fields.fail("torch_dtype", f"missing or unknown; it sets the precision of {what}")
    return dtype


# Fields that lay out a hybrid model's layers in a way kvcore does not size: refused, never ignored.
_UNSIZED_LAYOUT_FIELDS = {
    # Mllama: these layers attend to the image tokens, and cache the vision encoder's K/V, not the text's.
    "cross_attention_layers": "cross-attention layers cache the image tokens' K/V, not the text's; "
    "kvcore cannot size them from a text context",
    # Bamba, Zamba: Mamba hybrids whose state kvcore does not model.
    "attn_layer_indices": "a Mamba hybrid layout kvcore does not model",
    "layers_block_type": "a Mamba hybrid layout kvcore does not model",
}
# Architectures that must state their hybrid layout (HF has defaults for it; kvcore does not guess).
_NEEDS_LAYOUT = {"jamba": "attn_layer_period", "nemotron_h": "hybrid_override_pattern"}
# Nemotron-H hybrid_override_pattern characters: Mamba2, attention, MLP, MoE.
_NEMOTRON_H_KINDS = {"M": "mamba", "*": "full_attention", "-": "mlp", "E": "mlp"}


def _layer_kinds(f: _Fields, num_layers: int, model_type: str, window: int | None) -> list[str]:
    """Kind of each layer, from explicit fields first and documented architecture defaults second."""
    hybrid = _hybrid_kinds(f, num_layers, model_type, window)
    if hybrid is not None:
        return hybrid
    layer_types = f.data.get("layer_types")
    pattern = f.int_("sliding_window_pattern")
    if layer_types is not None:
        if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
            raise f.fail("layer_types", "expected a list of strings")
        if len(layer_types) != num_layers:
            raise f.fail("layer_types", f"has {len(layer_types)} entries for {num_layers} layers")
        for i, kind in enumerate(layer_types):
            if kind not in _KNOWN_LAYER_TYPES:
                raise f.fail(
                    f"layer_types[{i}]",
                    f"unknown layer type {kind!r}; kvcore knows {', '.join(sorted(_KNOWN_LAYER_TYPES))}",
                )
        if pattern is not None:
            implied = _pattern_kinds(num_layers, pattern)
            if layer_types != implied:
                raise f.fail("layer_types", f"contradicts sliding_window_pattern = {pattern}")
        return list(layer_types)
    if f.data.get("attention_chunk_size") is not None:
        if model_type in ("llama4", "llama4_text"):
            return _llama4_kinds(f, num_layers)
        raise f.fail("attention_chunk_size", "is set but no layer_types says which layers are chunked")
    interval = f.int_("full_attention_interval")
    if interval is not None:
        return [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)
        ]
    if pattern is not None:
        return _pattern_kinds(num_layers, pattern)
    if model_type in _IMPLIED_PATTERN and window is not None:
        return _pattern_kinds(num_layers, _IMPLIED_PATTERN[model_type])
    use_sliding = f.flag("use_sliding_window")
    if use_sliding is not None:
        # Qwen2/Qwen3 semantics: the window applies only when use_sliding_window is true, and then only to
        # layers from max_window_layers on.
        if not use_sliding:
            return ["full_attention"] * num_layers
        if window is None:
            raise f.fail("sliding_window", "missing while use_sliding_window is true")
        first = f.need("max_window_layers", minimum=0)
        return ["full_attention" if i < first else "sliding_attention" for i in range(num_layers)]
    if window is None:
        return ["full_attention"] * num_layers
    if model_type in _ALL_LAYERS_SLIDE:
        return ["sliding_attention"] * num_layers
    raise f.fail(
        "sliding_window",
        f"is {window} but kvcore does not know which layers of model_type {model_type!r} use it; "
        "add 'layer_types' (one 'full_attention'/'sliding_attention' per layer) to the config",
    )


def _llama4_kinds(f: _Fields, num_layers: int) -> list[str]:
    """Llama 4's layers without ``layer_types`` (HF ``Llama4TextConfig``): ``no_rope_layers[i]`` is 1
    for a RoPE layer, which attends in chunks, 0 for a NoPE layer, which attends to everything; an
    empty or missing list means every ``no_rope_layer_interval``-th layer (4) is NoPE."""
    flags = f.data.get("no_rope_layers")
    if flags:
        if not isinstance(flags, list) or not all(type(x) is int and x in (0, 1) for x in flags):
            raise f.fail("no_rope_layers", "expected a list of 0 (NoPE: full attention) or 1 (RoPE: chunked)")
        if len(flags) != num_layers:
            raise f.fail("no_rope_layers", f"has {len(flags)} entries for {num_layers} layers")
    else:
        if flags is not None and not isinstance(flags, list):
            raise f.fail("no_rope_layers", "expected a list of 0 (NoPE: full attention) or 1 (RoPE: chunked)")
        interval = f.int_("no_rope_layer_interval") or 4
        flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
    return ["chunked_attention" if x else "full_attention" for x in flags]


def _hybrid_kinds(f: _Fields, num_layers: int, model_type: str, window: int | None) -> list[str] | None:
    """Layer kinds of a Mamba hybrid (Jamba, Nemotron-H), or None when the config is not one."""
    period_raw = f.data.get("attn_layer_period")
    pattern = f.data.get("hybrid_override_pattern")
    if period_raw is None and pattern is None:
        needed = _NEEDS_LAYOUT.get(model_type)
        if needed is not None:
            raise f.fail(needed, f"missing; it says which layers of model_type {model_type!r} attend")
        return None
    if period_raw is not None and pattern is not None:
        raise f.fail("attn_layer_period", "and hybrid_override_pattern both lay out the layers")
    for key in ("layer_types", "sliding_window_pattern", "full_attention_interval"):
        if f.data.get(key) is not None:
            source = "attn_layer_period" if period_raw is not None else "hybrid_override_pattern"
            raise f.fail(key, f"contradicts {source}: only one field may lay out the layers")
    if window is not None:
        raise f.fail("sliding_window", "is set on a Mamba hybrid; kvcore does not know which layers use it")
    if period_raw is not None:
        # HF Jamba: layer i attends when i % attn_layer_period == attn_layer_offset; the others are Mamba.
        period = f.need("attn_layer_period")
        offset = f.need("attn_layer_offset", minimum=0, maximum=period - 1)
        return ["full_attention" if i % period == offset else "mamba" for i in range(num_layers)]
    if not isinstance(pattern, str):
        raise f.fail("hybrid_override_pattern", f"expected a string, got {show(pattern)}")
    if len(pattern) != num_layers:
        raise f.fail("hybrid_override_pattern", f"has {len(pattern)} characters for {num_layers} layers")
    for i, char in enumerate(pattern):
        if char not in _NEMOTRON_H_KINDS:
            raise f.fail(
                "hybrid_override_pattern",
                f"character {i} is {char!r}; kvcore knows M (Mamba2), * (attention), - (MLP), E (MoE)",
            )
    return [_NEMOTRON_H_KINDS[char] for char in pattern]


def _pattern_kinds(num_layers: int, pattern: int) -> list[str]:
    # HF Gemma 3 / Cohere 2: layer i is full attention when (i + 1) is a multiple of the pattern.
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)]


def model_from_config(
    config: Mapping[str, Any] | str | os.PathLike[str], *, name: str | None = None
) -> ModelSpec:
    """Describe a model from an HF ``config.json`` (a path, a directory holding one, or the parsed dict).

    Fields read (aliases in brackets), with the HF meaning of each:

    - layers ``num_hidden_layers`` [n_layer, num_layers]; multimodal configs are read from ``text_config``;
    - K/V heads ``num_key_value_heads`` [num_kv_heads, n_head_kv, multi_query_group_num], else
      ``multi_query`` -> 1 (MQA), else ``num_attention_heads`` (MHA);
    - ``head_dim``, else the architecture's HF default (Gemma 1-3: 256; their head counts too, 16/16
      for Gemma, 8/4 for Gemma 2 and 3), else ``hidden_size / num_attention_heads`` (must divide exactly);
    - Falcon: ``multi_query`` is ignored when ``new_decoder_architecture`` is true (HF ``FalconConfig``);
    - MLA: ``kv_lora_rank`` + ``qk_rope_head_dim`` elements, one latent per token per layer;
    - windows: ``layer_types`` (full/sliding/chunked/linear_attention), Llama 4's
      ``attention_chunk_size`` with ``no_rope_layers`` (or every ``no_rope_layer_interval``-th layer, 4,
      full), ``sliding_window_pattern``, ``full_attention_interval``, ``use_sliding_window`` +
      ``max_window_layers`` (Qwen), ``sliding_window`` [sliding_window_size] applied to every layer
      only for Mistral-family architectures, implied alternation for Gemma 2 (1:1) and Gemma 3 (5:1)
      when the config states none;
    - Gemma 4 full-attention layers: ``global_head_dim`` and, with ``attention_k_eq_v``,
      ``num_global_key_value_heads``. K and V are still both cached: K=V shares the projection, but the
      cached K is normalised and rotated and V is not, so they differ;
    - ``num_kv_shared_layers``: trailing layers that reuse earlier K/V and cache nothing;
    - linear-attention state (Qwen3-Next): ``linear_num_value_heads × linear_key_head_dim ×
      linear_value_head_dim`` recurrent + ``(linear_conv_kernel_dim - 1) × (2 × linear_num_key_heads ×
      linear_key_head_dim + linear_num_value_heads × linear_value_head_dim)`` convolution elements per
      layer, in the checkpoint's dtype (``torch_dtype``), independent of the cache precision;
    - Mamba hybrids: Jamba's ``attn_layer_period`` + ``attn_layer_offset`` (layer ``i`` attends when
      ``i % period == offset``, the others are Mamba1), Nemotron-H's ``hybrid_override_pattern`` (one
      character per layer: ``*`` attention, ``M`` Mamba2, ``-``/``E`` MLP/MoE, which cache nothing); only
      the attention layers cache K/V; the Mamba state is a constant per sequence (:func:`_mamba_group`,
      vLLM's state shapes), in the checkpoint's dtype, split evenly under tensor parallelism (vLLM
      replicates Mamba2's groups when ``n_groups`` < tp, which this does not count);
    - refused, never ignored: ``cross_attention_layers`` (Mllama: those layers cache the image tokens'
      K/V), ``attn_layer_indices`` (Bamba), ``layers_block_type`` (Zamba).

    A config file must be a regular file (a FIFO or a device is refused before anything is read); a
    leading UTF-8 byte-order mark is skipped.

    The MTP layers of DeepSeek V3 (``num_nextn_predict_layers``) are not counted: they are a speculative
    decoding add-on, not part of ``num_hidden_layers``.

    Raises:
        ConfigError: a missing, malformed, unknown or contradictory field (the message names it).
    """
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"name: expected a string, got {show(name)}")
    source = "dict"
    where = None  # the file, for error messages
    if isinstance(config, (str, os.PathLike)):
        source = os.fspath(config)
        if not isinstance(source, str):
            raise ConfigError(f"config: expected a text path, got {show(source)}")
        config, file_name = _read_config_file(Path(source))
        name = name or file_name
        where = f"config {source!r}"
    if not isinstance(config, Mapping):
        raise ConfigError(f"config: expected a mapping or a path, got {type(config).__name__}")
    label = name or "config"
    f = _text_fields(config, where or label)
    top = _Fields(config, "", f.label)
    for fields in (top, f):
        if fields.flag("is_encoder_decoder"):
            raise fields.fail(
                "is_encoder_decoder", "encoder-decoder models are not supported (decoder-only only)"
            )

    num_layers = f.need("num_hidden_layers", "n_layer", "num_layers", maximum=MAX_LAYERS)
    model_type = f.str_("model_type") or top.str_("model_type") or ""
    max_context = f.int_("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
    shared = f.int_("num_kv_shared_layers", minimum=0) or 0
    if shared >= num_layers:
        raise f.fail(
            "num_kv_shared_layers", f"{shared} shared layers leave no layer of {num_layers} to own a cache"
        )
    own = num_layers - shared

    _, window_raw = f.raw("sliding_window", "sliding_window_size")
    window = f.int_("sliding_window", "sliding_window_size")

    for key, why in _UNSIZED_LAYOUT_FIELDS.items():
        if f.data.get(key) is not None:
            raise f.fail(key, f"{why}; not supported")
    groups: list[LayerGroup]
    layer_group_index: tuple[int, ...] | None = None  # MLA: one group, in order
    kv_lora_rank = f.int_("kv_lora_rank")
    if kv_lora_rank is not None:
        laid_out = ("layer_types", "attn_layer_period", "hybrid_override_pattern")
        if window_raw is not None or any(f.data.get(k) is not None for k in laid_out):
            raise f.fail(
                "kv_lora_rank", "MLA with sliding-window or typed layers is not a layout kvcore knows"
            )
        latent = kv_lora_rank + f.need("qk_rope_head_dim", minimum=0)
        groups = [LayerGroup("mla", own, num_kv_heads=1, head_dim=latent, num_tensors=1, tp_sharded=False)]
    else:
        if own != num_layers and any(
            f.data.get(k) is not None for k in ("attn_layer_period", "hybrid_override_pattern")
        ):
            raise f.fail(
                "num_kv_shared_layers", "shared K/V layers with a Mamba hybrid layout is not one kvcore knows"
            )
        kinds = _layer_kinds(f, num_layers, model_type, window)[:own]
        groups = _attention_groups(f, config, kinds, window, model_type)
        # _attention_groups makes one group per kind, in order of first appearance.
        position = {kind: i for i, kind in enumerate(dict.fromkeys(kinds))}
        layer_group_index = tuple(position[kind] for kind in kinds)

    return ModelSpec(
        name=label,
        groups=tuple(groups),
        num_layers=num_layers,
        num_kv_shared_layers=shared,
        max_context_len=max_context,
        weight_dtype=_weight_dtype(config, f),
        source=source,
        layer_group_index=layer_group_index,
    )


def _attention_groups(
    f: _Fields, config: Mapping[str, Any], kinds: list[str], window: int | None, model_type: str
) -> list[LayerGroup]:
    defaults = _HF_ATTENTION_DEFAULTS.get(model_type, {})
    num_heads = f.int_("num_attention_heads", "n_head", "num_heads")
    if num_heads is None:
        num_heads = defaults.get("num_attention_heads")
    kv_heads = f.int_("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
    # Falcon: the new decoder architecture (40B, 180B) ignores multi_query (HF FalconConfig).
    mqa = f.flag("multi_query") and not f.flag("new_decoder_architecture")
    if kv_heads is None and not mqa:
        kv_heads = defaults.get("num_key_value_heads")
    if mqa:
        if kv_heads not in (None, 1):
            raise f.fail("multi_query", f"is true but num_key_value_heads = {kv_heads}")
        kv_heads = 1
    if kv_heads is None:
        if num_heads is None:
            raise f.fail("num_key_value_heads", "missing, and no num_attention_heads to fall back on (MHA)")
        kv_heads = num_heads
    if num_heads is not None and (kv_heads > num_heads or num_heads % kv_heads):
        raise f.fail("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads = {num_heads}")
    head_dim = f.int_("head_dim")
    if head_dim is None:
        head_dim = defaults.get("head_dim")
    if head_dim is None:
        hidden = f.int_("hidden_size", "n_embd", "d_model")
        if hidden is None or num_heads is None:
            raise f.fail("head_dim", "missing, and hidden_size / num_attention_heads is not available")
        if hidden % num_heads:
            raise f.fail(
                "head_dim", f"missing, and hidden_size {hidden} is not a multiple of {num_heads} heads"
            )
        head_dim = hidden // num_heads

    # Full-attention layers of Gemma 4 have their own shape.
    full_head_dim = f.int_("global_head_dim") or head_dim
    full_kv_heads = kv_heads
    if f.flag("attention_k_eq_v"):
        full_kv_heads = f.int_("num_global_key_value_heads") or kv_heads
        # Grouped-query attention on the full layers too: the query heads split evenly over their K/V heads.
        if num_heads is not None and (full_kv_heads > num_heads or num_heads % full_kv_heads):
            raise f.fail(
                "num_global_key_value_heads",
                f"{full_kv_heads} does not divide num_attention_heads = {num_heads}",
            )

    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    groups: list[LayerGroup] = []
    for kind, count in counts.items():
        if kind == "full_attention":
            groups.append(LayerGroup(kind, count, full_kv_heads, full_head_dim))
        elif kind == "sliding_attention":
            if window is None:
                raise f.fail("sliding_window", "missing, but some layers are sliding_attention")
            groups.append(LayerGroup(kind, count, kv_heads, head_dim, window=window))
        elif kind == "chunked_attention":
            chunk = f.need("attention_chunk_size")
            groups.append(LayerGroup(kind, count, kv_heads, head_dim, window=chunk))
        elif kind == "mamba":
            groups.append(_mamba_group(f, config, count))
        elif kind == "mlp":
            groups.append(LayerGroup(kind, count, 0, 0, num_tensors=0))
        else:
            groups.append(_linear_attention_group(f, config, count))
    return groups


def _mamba_group(f: _Fields, config: Mapping[str, Any], count: int) -> LayerGroup:
    """Constant state of a Mamba layer, as vLLM keeps it (``MambaStateShapeCalculator``), in the
    checkpoint's precision: Mamba1 (Jamba) ``d_inner × (d_conv - 1)`` convolution + ``d_inner × d_state``
    SSM elements, ``d_inner = mamba_expand × hidden_size``; Mamba2 (Nemotron-H) ``(conv_kernel - 1) ×
    (d_inner + 2 × n_groups × ssm_state_size)`` + ``mamba_num_heads × mamba_head_dim × ssm_state_size``,
    ``d_inner = mamba_num_heads × mamba_head_dim``."""
    if f.data.get("hybrid_override_pattern") is not None:
        heads = f.need("mamba_num_heads")
        head_dim = f.need("mamba_head_dim")
        d_state = f.need("ssm_state_size")
        kernel = f.need("conv_kernel")
        inner = heads * head_dim
        elements = (kernel - 1) * (inner + 2 * f.need("n_groups") * d_state) + inner * d_state
    else:
        inner = f.need("mamba_expand") * f.need("hidden_size")
        elements = inner * (f.need("mamba_d_conv") - 1) + inner * f.need("mamba_d_state")
    dtype = _state_dtype(config, f, "the Mamba state")
    bits = elements * weight_dtype_bits(dtype)
    if f.data.get("hybrid_override_pattern") is not None:
        # vLLM keeps Mamba2's SSM state in `mamba_ssm_cache_dtype`, float32 by default ("only float32
        # is known to have no accuracy issues"); its convolution state in the model's precision.
        ssm = f.data.get("mamba_ssm_cache_dtype", "float32")
        if not isinstance(ssm, str):
            raise f.fail("mamba_ssm_cache_dtype", "expected a dtype name, e.g. float32")
        ssm = dtype if ssm == "auto" else ssm
        try:
            ssm_bits = weight_dtype_bits(ssm)
        except ConfigError:
            raise f.fail("mamba_ssm_cache_dtype", f"unknown dtype {ssm!r}") from None
        ssm_elements = inner * d_state
        bits = (elements - ssm_elements) * weight_dtype_bits(dtype) + ssm_elements * ssm_bits
    return LayerGroup("mamba", count, 0, 0, num_tensors=0, state_bytes=bits_to_bytes(bits))


def _linear_attention_group(f: _Fields, config: Mapping[str, Any], count: int) -> LayerGroup:
    """Constant state of a Gated-DeltaNet layer (Qwen3-Next), in the checkpoint's precision."""
    k_heads = f.need("linear_num_key_heads")
    v_heads = f.need("linear_num_value_heads")
    k_dim = f.need("linear_key_head_dim")
    v_dim = f.need("linear_value_head_dim")
    kernel = f.need("linear_conv_kernel_dim")
    dtype = _state_dtype(config, f, "the linear-attention state")
    recurrent = v_heads * k_dim * v_dim
    conv = (kernel - 1) * (2 * k_heads * k_dim + v_heads * v_dim)
    state = bits_to_bytes((recurrent + conv) * weight_dtype_bits(dtype))
    return LayerGroup("linear_attention", count, 0, 0, num_tensors=0, state_bytes=state)


def _exists(path: str) -> bool:
    try:
        return Path(path).exists()
    except (OSError, ValueError):  # a name too long for a path, or holding a NUL: not a file
        return False


def load_model(model: ModelSpec | Mapping[str, Any] | str | os.PathLike[str]) -> ModelSpec:
    """A :class:`ModelSpec` from whatever an operator has at hand.

    Accepts a ModelSpec (returned as is), a config dict, a path to a ``config.json`` (or to a directory
    holding one), or a preset name such as ``llama-3.1-70b`` / ``meta-llama/Llama-3.1-70B-Instruct``.

    Raises:
        ConfigError: no such file and no such preset (the message suggests close preset names).
    """
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        return model_from_config(model)
    if isinstance(model, os.PathLike) or (isinstance(model, str) and _exists(model)):
        return model_from_config(model)
    if not isinstance(model, str):
        raise ConfigError(
            f"model: expected a preset name, a path or a config dict, got {type(model).__name__}"
        )
    from kvcore.sizing.presets import model_preset

    looks_like_file = model.endswith(".json") or model.startswith((".", "/", "~"))
    if looks_like_file:
        raise ConfigError(f"model: no such file {model!r}")
    return model_preset(model)


def kv_cache_groups(
    model: ModelSpec | Mapping[str, Any] | str | os.PathLike[str],
) -> tuple[KVCacheGroup, ...]:
    """The manager's KV-cache groups of a model (a ModelSpec, config dict, path or preset name); see
    :meth:`ModelSpec.kv_cache_groups` for the rule. ``[g.window for g in groups]`` is what
    ``KVCacheManager(groups=...)`` takes.

    Raises:
        ConfigError: the model cannot be read (the message names the field).
    """
    return load_model(model).kv_cache_groups()
