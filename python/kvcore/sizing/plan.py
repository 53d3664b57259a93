"""The two questions operators ask first: how big is the cache (:func:`size`), and what fits (:func:`plan`).

``size`` answers in exact bytes for one model, context, batch and cache precision, per layer group.

``plan`` sizes a deployment in the usual order: take the weights (measured, or parameters × weight
precision), compute K/V bytes per token, keep a runtime reserve (a plan that uses 31.99 GB of a 32 GB
GPU is not a plan), and divide what is left into pool pages. From the page count it
derives how many tokens can be active, how many requests of a given length (or prompt + output mix) can
run together, and the longest context at a given concurrency. Everything is per GPU: under tensor
parallelism each GPU holds ``1/tp`` of the weights, its share of the K/V heads and its own pool with the
same number of pages.

Layout assumed: kvcore's manager with KV-cache groups (:meth:`ModelSpec.kv_cache_groups`). Each group of
layers has its own page table per sequence and every group has the same number of layer slots, so all
pages of the one pool have the same size, ``group_page_bytes``: ``page_size`` tokens of one group. Page
0 is the reserved null page, so a pool of ``num_pages`` pages serves ``num_pages - 1``. In decode, a
sequence of ``n`` tokens holds ``ceil(n / page_size)`` pages in each full group and at most
``(W - 2) // page_size + 2`` (a window of ``W`` tokens, whatever its alignment) in each window group;
its pages are the sum over groups. A model whose layers are all of one type (Llama, Mistral 7B, DeepSeek)
has a single group, the classic one-page-table layout; a hybrid one (Gemma 2/3, gpt-oss) gets its window
groups bounded while its full groups grow with the context.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from kvcore._json import show
from kvcore.exceptions import ConfigError
from kvcore.sizing.dtypes import (
    SCALE_BYTES,
    is_quantized_kv_dtype,
    kv_dtype_bits,
    normalize_kv_dtype,
    normalize_weight_dtype,
    weight_dtype_bits,
)
from kvcore.sizing.formula import (
    MAX_INT,
    _window_pages,
    bits_to_bytes,
    check_int,
    pages_for_budget,
    pages_per_request,
)
from kvcore.sizing.model import KVCacheGroup, ModelSpec, load_model
from kvcore.sizing.presets import GpuSpec, gpu_preset
from kvcore.sizing.units import format_bytes

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_RESERVE_FRACTION",
    "MAX_KV_CACHE_GROUPS",
    "GroupSize",
    "Plan",
    "SizeReport",
    "pages_per_request",
    "plan",
    "size",
]

# Tokens per page unless told otherwise (KVCacheManager's and KVPool's default; vLLM's default block size).
DEFAULT_PAGE_SIZE = 16
# Share of GPU memory kept for the CUDA context, activations, graphs and fragmentation when no reserve is
# given: the complement of vLLM's default gpu_memory_utilization of 0.9.
DEFAULT_RESERVE_FRACTION = 0.10
# Most KV-cache groups KVCacheManager accepts (MAX_GROUPS in rust/manager/groups.rs; a test checks the two
# agree): a plan with more could not be built.
MAX_KV_CACHE_GROUPS = 64
# The manager's bounds (rust/manager/mod.rs): tokens per page, and pages with int32 ids.
MAX_PAGE_SIZE = 2**20
MAX_NUM_PAGES = 2**31 - 1

ModelLike = ModelSpec | Mapping[str, Any] | str | os.PathLike[str]


@dataclass(frozen=True, slots=True)
class GroupSize:
    """Bytes of one layer group for the sizes in a :class:`SizeReport` (all figures on one GPU)."""

    # Layer kind (kvcore.sizing.LAYER_KINDS).
    kind: str
    # Layers in the group; >= 1.
    num_layers: int
    # K/V heads per layer that one GPU keeps after tensor parallelism; 0 for constant-state layers.
    kv_heads_per_gpu: int
    # Elements per head per token (MLA: the latent width); 0 for constant-state layers.
    head_dim: int
    # Tensors per head per token: 2 (K, V), 1 (MLA latent), 0 (constant state).
    num_tensors: int
    # Tokens after which the group stops growing; None = whole context.
    window: int | None
    # K/V bytes one token adds to the group while below its window (no scales); >= 0.
    bytes_per_token: int
    # Tokens each layer of the group holds for one sequence of the context; <= context_len.
    cached_tokens: int
    # K/V bytes of the whole batch in this group (windows applied, no scales).
    kv_bytes: int
    # Quantization-scale bytes of this group in the pool, a constant (0 for fp32/fp16/bf16).
    scale_bytes: int
    # Constant-state bytes of the whole batch in this group (linear_attention only).
    state_bytes: int


@dataclass(frozen=True, slots=True)
class SizeReport:
    """How much cache one model needs for ``batch`` sequences of ``context_len`` tokens (one GPU)."""

    # Model name as resolved (preset or config name).
    model: str
    # Layer structure in one line (ModelSpec.describe()).
    description: str
    # Canonical cache precision.
    kv_dtype: str
    # Tensor-parallel degree; figures are per GPU; >= 1.
    tp: int
    # Tokens per sequence (prompt + output); >= 0.
    context_len: int
    # Sequences of that length; >= 0.
    batch: int
    # K/V bytes one token adds while the context is below every window (no scales).
    bytes_per_token: int
    # K/V bytes of one sequence (windows applied, no scales, no state).
    sequence_bytes: int
    # K/V bytes of the batch (windows applied, no scales, no state): the plain formula for full attention.
    kv_bytes: int
    # Scale bytes of the pool (one fp32 per layer, K/V tensor and KV head; 0 unless fp8/int8/int4).
    scale_bytes: int
    # Constant-state bytes of the batch.
    state_bytes: int
    # kv_bytes + scale_bytes + state_bytes: what the batch really occupies.
    total_bytes: int
    # Per layer group breakdown; sums to the totals (up to one byte of int4 rounding per group).
    groups: tuple[GroupSize, ...]
    # Remarks an operator should read (windows, MLA, replication, context beyond the model's maximum).
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (the ``--json`` output)."""
        return dataclasses.asdict(self)


def size(
    model: ModelLike, context_len: int, *, batch: int = 1, kv_dtype: str = "bf16", tp: int = 1
) -> SizeReport:
    """Exact cache bytes for ``batch`` sequences of ``context_len`` tokens, per layer group, per GPU.

    Args:
        model: a ModelSpec, config dict, path to a config.json, or preset name.
        context_len: tokens per sequence, prompt and output together (24,000 + 8,000 = 32,000 active).
        batch: sequences of that length held at once.
        kv_dtype: cache precision (independent of the weight precision).
        tp: tensor-parallel degree; K/V heads are split across GPUs, or replicated when fewer than ``tp``.

    Raises:
        ConfigError: bad argument or model description (the message names the field).
    """
    spec = load_model(model)
    kv_dtype = normalize_kv_dtype(kv_dtype)
    check_int(context_len, "context_len")
    check_int(batch, "batch")
    check_int(tp, "tp", minimum=1)
    spec.validate_tp(tp)
    bits = kv_dtype_bits(kv_dtype)
    groups = []
    for g in spec.groups:
        cached = g.cached_tokens(context_len)
        groups.append(
            GroupSize(
                kind=g.kind,
                num_layers=g.num_layers,
                kv_heads_per_gpu=g.kv_heads_per_gpu(tp),
                head_dim=g.head_dim,
                num_tensors=g.num_tensors,
                window=g.window,
                bytes_per_token=bits_to_bytes(g.elements_per_token(tp) * bits),
                cached_tokens=cached,
                kv_bytes=bits_to_bytes(g.elements_per_token(tp) * cached * batch * bits),
                scale_bytes=g.scale_bytes(kv_dtype, tp),
                state_bytes=g.state_bytes_per_gpu(tp) * batch,
            )
        )
    kv_bytes = spec.kv_bytes(context_len, kv_dtype, batch, tp)
    scale_bytes = spec.scale_bytes(kv_dtype, tp)
    state_bytes = spec.state_bytes(batch, tp)
    return SizeReport(
        model=spec.name,
        description=spec.describe(),
        kv_dtype=kv_dtype,
        tp=tp,
        context_len=context_len,
        batch=batch,
        bytes_per_token=spec.bytes_per_token(kv_dtype, tp),
        sequence_bytes=spec.kv_bytes(context_len, kv_dtype, 1, tp),
        kv_bytes=kv_bytes,
        scale_bytes=scale_bytes,
        state_bytes=state_bytes,
        total_bytes=kv_bytes + scale_bytes + state_bytes,
        groups=tuple(groups),
        notes=tuple(_size_notes(spec, kv_dtype, context_len, tp)),
    )


def _size_notes(spec: ModelSpec, kv_dtype: str, context_len: int, tp: int) -> list[str]:
    notes: list[str] = []
    for g in spec.groups:
        if g.window is not None and context_len > g.window:
            notes.append(f"{g.kind} layers stop growing at {g.window:,} tokens (window)")
        if g.kind == "mla":
            notes.append("MLA: one latent per token and layer (not K and V); every GPU keeps it under tp")
        if g.kind in ("linear_attention", "mamba"):
            notes.append(f"{g.kind} layers keep a constant state per sequence, whatever its length")
        if g.kind == "mlp":
            notes.append("mlp layers (no attention) cache nothing")
        if g.tp_sharded and 0 < g.num_kv_heads < tp:
            notes.append(f"{g.num_kv_heads} KV heads < tp {tp}: heads are replicated, each GPU keeps 1")
    if spec.num_kv_shared_layers:
        notes.append(f"{spec.num_kv_shared_layers} trailing layers reuse earlier K/V and cache nothing")
    if is_quantized_kv_dtype(kv_dtype):
        notes.append(
            f"scales: one fp32 ({SCALE_BYTES} B) per layer, K/V tensor and KV head, counted in total_bytes"
        )
    if spec.max_context_len is not None and context_len > spec.max_context_len:
        notes.append(
            f"context {context_len:,} exceeds the model's maximum of {spec.max_context_len:,} tokens"
        )
    return list(dict.fromkeys(notes))


# ---- plan ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """What fits on one GPU of a deployment, and the page count to give the pool (all per GPU).

    Invariant: ``weight_bytes_per_gpu + reserve_bytes + scale_bytes + num_pages * page_bytes +
    state_reserved_bytes <= gpu_mem_bytes`` whenever ``fits`` is True. When False it may not hold even
    with ``kv_budget_bytes >= 0``: the scales or the state set aside alone can exceed a small budget
    (``num_pages`` is then 0 and ``shortfall_bytes`` says by how much).
    """

    # Model name as resolved.
    model: str
    # GPU name (preset) or "custom".
    gpu: str
    # Memory of one GPU in bytes; >= 1.
    gpu_mem_bytes: int
    # Tensor-parallel degree (GPUs sharing the model); >= 1.
    tp: int
    # Canonical cache precision.
    kv_dtype: str
    # Tokens per page; >= 1.
    page_size: int
    # Weights of the whole model in bytes; >= 0.
    weight_bytes: int
    # Where weight_bytes came from: "measured" or "<params> params x <dtype>".
    weight_source: str
    # Weights one GPU holds: ceil(weight_bytes / tp).
    weight_bytes_per_gpu: int
    # Runtime reserve per GPU (CUDA context, activations, graphs); >= 0.
    reserve_bytes: int
    # gpu_mem_bytes - weight_bytes_per_gpu - reserve_bytes; negative when weights and reserve do not fit.
    kv_budget_bytes: int
    # Bytes of one pool page on one GPU: page_size tokens of one KV-cache group (group_size layer slots,
    # ModelSpec.group_page_bytes); >= 1.
    page_bytes: int
    # The manager's KV-cache groups (ModelSpec.kv_cache_groups), in the order KVCacheManager takes them.
    groups: tuple[KVCacheGroup, ...]
    # [len(groups)] window of each group, None = full attention: KVCacheManager(groups=list(...)).
    group_windows: tuple[int | None, ...]
    # Layer slots of each group's pages (the smallest number of layers of one attention type); >= 1.
    group_size: int
    # Layer slots over all groups that no layer fills (the last group of a type, when its count does not
    # divide); >= 0.
    padding_layers: int
    # Scales the pool keeps beside its pages on one GPU (fp8/int8/int4; else 0); set aside before pages.
    scale_bytes: int
    # Constant-state bytes per request on one GPU (linear_attention and mamba layers; 0 for most models).
    state_bytes_per_request: int
    # Requests whose constant state is set aside before pages are counted: the largest request count the
    # plan states (concurrency, max_requests_at_context, max_requests_for_mix, max_requests_worst_case),
    # so that none of them exceeds it; 0 without constant state; >= 0.
    state_reserved_requests: int
    # state_reserved_requests * state_bytes_per_request.
    state_reserved_bytes: int
    # Pages to give the pool (KVCacheManager(num_pages=...)), null page 0 included; >= 0.
    num_pages: int
    # Pages requests can use: num_pages - 1 (page 0 is the null page); >= 0.
    usable_pages: int
    # usable_pages * page_size: tokens that can be active at once over all requests (token slots when the
    # model has several groups: a token takes one in each group that holds it).
    max_active_tokens: int
    # num_pages * page_bytes: memory the pool takes.
    pool_bytes: int
    # Tokens per request asked about (None if not asked).
    context_len: int | None
    # Pages one request of context_len holds, summed over groups (None if not asked).
    pages_per_request: int | None
    # Bytes of those pages that no layer fills: padding slots, and smaller groups in a larger page (None if
    # not asked; 0 for a model of one attention type).
    padding_bytes_per_request: int | None
    # Requests of context_len that fit together in this pool, each with its constant state (None if not
    # asked); <= state_reserved_requests when the model keeps state.
    max_requests_at_context: int | None
    # Concurrent requests asked about (None if not asked).
    concurrency: int | None
    # Longest context at `concurrency` requests (None if not asked, or if unbounded: see next field).
    max_context_at_concurrency: int | None
    # True when every group is windowed and `concurrency` requests of every window fit, so memory never
    # limits the context at that concurrency.
    context_unbounded: bool
    # prompt + output of each request of the distribution asked about (empty if none).
    request_lens: tuple[int, ...]
    # Requests of the distribution that fit on average (mean pages per request); None if no distribution.
    max_requests_for_mix: int | None
    # Requests that fit if all are as long as the longest of the distribution; None if no distribution.
    max_requests_worst_case: int | None
    # Whether the weights, reserve and what was asked (concurrency x length) fit.
    fits: bool
    # Bytes missing for what was asked to fit; 0 when it fits.
    shortfall_bytes: int
    # Human-readable warnings (does not fit and by how much, no reserve, context beyond the model).
    warnings: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (the ``--json`` output)."""
        return dataclasses.asdict(self)

    def manager_kwargs(self) -> dict[str, Any]:
        """The arguments of the matching manager: ``KVCacheManager(**plan.manager_kwargs())``.

        ``num_pages`` (null page included), ``page_size`` and ``groups`` (the window of each KV-cache
        group, None = full attention).
        """
        return {"num_pages": self.num_pages, "page_size": self.page_size, "groups": list(self.group_windows)}


def _resolve_gpu(gpu: GpuSpec | str | int) -> GpuSpec:
    if isinstance(gpu, GpuSpec):
        return gpu
    if isinstance(gpu, str):
        return gpu_preset(gpu)
    if isinstance(gpu, bool) or not isinstance(gpu, int):
        raise ConfigError(f"gpu: expected a GpuSpec, a preset name or a size in bytes, got {show(gpu)}")
    return GpuSpec("custom", check_int(gpu, "gpu_mem_bytes", minimum=1))


def _weights(
    spec: ModelSpec, weight_bytes: int | None, num_params: int | None, weight_dtype: str | None
) -> tuple[int, str]:
    if weight_bytes is not None:
        if num_params is not None:
            raise ConfigError("weight_bytes: give either a measured weight_bytes or num_params, not both")
        return check_int(weight_bytes, "weight_bytes"), "measured"
    params = num_params if num_params is not None else spec.num_params
    if params is None:
        raise ConfigError(
            f"weight_bytes: unknown for {spec.name}; give a measured weight_bytes, or num_params (and "
            "weight_dtype): --weight-bytes or --params on the command line"
        )
    check_int(params, "num_params", minimum=1)
    dtype = weight_dtype or spec.weight_dtype
    if dtype is None:
        raise ConfigError(
            f"weight_dtype: {spec.name} does not declare its weight precision; give weight_dtype"
        )
    dtype = normalize_weight_dtype(dtype)
    return bits_to_bytes(params * weight_dtype_bits(dtype)), f"{params:,} params x {dtype}"


def plan(
    model: ModelLike,
    *,
    gpu: GpuSpec | str | int,
    tp: int = 1,
    kv_dtype: str = "bf16",
    weight_bytes: int | None = None,
    num_params: int | None = None,
    weight_dtype: str | None = None,
    reserve_bytes: int | None = None,
    reserve_fraction: float = DEFAULT_RESERVE_FRACTION,
    page_size: int = DEFAULT_PAGE_SIZE,
    context_len: int | None = None,
    concurrency: int | None = None,
    requests: Sequence[tuple[int, int]] = (),
) -> Plan:
    """Plan a deployment: pages for the pool and what they hold, always the largest that fits.

    Args:
        model: a ModelSpec, config dict, path to a config.json, or preset name.
        gpu: a GpuSpec, a GPU preset name (``'H100-80G'``), or the memory of one GPU in bytes.
        tp: tensor-parallel degree: each GPU holds ``1/tp`` of the weights and of the K/V heads (heads
            are replicated when there are fewer than ``tp``; MLA latents are replicated).
        kv_dtype: cache precision, independent of the weights'.
        weight_bytes: measured size of the whole checkpoint in bytes (preferred over an estimate).
        num_params: parameter count for an estimate (default: the preset's); with ``weight_dtype``
            (default: the precision the config declares).
        reserve_bytes: runtime reserve per GPU; default ``reserve_fraction`` of the GPU's memory.
        reserve_fraction: share of GPU memory reserved when ``reserve_bytes`` is not given; in [0, 1).
        page_size: tokens per page.
        context_len: tokens per request (prompt + output): how many such requests fit.
        concurrency: requests at once: the longest context each can have.
        requests: a distribution of (prompt_len, output_len) pairs, equally likely: how many fit on
            average and in the worst case.

    Returns:
        A :class:`Plan`, paged with the model's KV-cache groups; ``Plan.manager_kwargs()`` are the
        arguments of the matching ``KVCacheManager``. A request that does not fit is not an error:
        ``fits`` is False, ``shortfall_bytes`` says by how much, and ``warnings`` explains it.

    Constant state (Qwen3-Next, Jamba, Nemotron-H): each running request needs its state beside its
    pages, so state is set aside before pages are counted, for the largest request count the plan
    states; then every figure is computed against the one pool that remains, and capped at the requests
    whose state is set aside. Each figure is thus exact for ``KVCacheManager(**plan.manager_kwargs())``
    with those states: when ``fits`` is True, ``num_pages * page_bytes + state_reserved_bytes +
    scale_bytes`` never exceeds the KV budget (when False, the shortfall says by how much), and no
    request count the plan gives exceeds ``state_reserved_requests``. When several
    questions are asked at once, the pool is the one for the most demanding answer, so the others may
    be a little below what a plan for them alone would give.

    Raises:
        ConfigError: a bad argument, unknown preset, or missing weight information; or a model with
            more than :data:`MAX_KV_CACHE_GROUPS` KV-cache groups (no manager could be built for it).
    """
    spec = load_model(model)
    device = _resolve_gpu(gpu)
    kv_dtype = normalize_kv_dtype(kv_dtype)
    check_int(tp, "tp", minimum=1)
    spec.validate_tp(tp)
    check_int(page_size, "page_size", minimum=1, maximum=MAX_PAGE_SIZE)
    if context_len is not None:
        check_int(context_len, "context_len", minimum=1)
    if concurrency is not None:
        check_int(concurrency, "concurrency", minimum=1)
    if weight_dtype is not None:
        normalize_weight_dtype(weight_dtype)
    if isinstance(reserve_fraction, bool) or not isinstance(reserve_fraction, (int, float)):
        raise ConfigError(f"reserve_fraction: expected a number in [0, 1), got {show(reserve_fraction)}")
    if not 0 <= reserve_fraction < 1:
        raise ConfigError(f"reserve_fraction: must be in [0, 1), got {reserve_fraction}")
    if isinstance(requests, (str, bytes, Mapping)) or not isinstance(requests, Iterable):
        raise ConfigError(
            f"requests: expected a sequence of (prompt_len, output_len) pairs, got {show(requests)}"
        )
    request_lens: list[int] = []
    for i, pair in enumerate(requests):
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise ConfigError(f"requests[{i}]: expected a (prompt_len, output_len) pair, got {pair!r}")
        total = check_int(pair[0], f"requests[{i}].prompt_len") + check_int(
            pair[1], f"requests[{i}].output_len"
        )
        request_lens.append(check_int(total, f"requests[{i}] prompt_len + output_len", minimum=1))
    if not spec.cache_groups:
        raise ConfigError(f"model: {spec.name} has no layer that caches tokens; there is nothing to page")

    weights, weight_source = _weights(spec, weight_bytes, num_params, weight_dtype)
    weights_per_gpu = -(-weights // tp)
    if reserve_bytes is None:
        # The decimal the caller wrote (0.1 is 1/10, not the nearest double), rounded up: never under-reserve.
        share = Fraction(repr(float(reserve_fraction)))
        reserve = -(-(device.mem_bytes * share.numerator) // share.denominator)
    else:
        reserve = check_int(reserve_bytes, "reserve_bytes")

    budget = device.mem_bytes - weights_per_gpu - reserve
    groups = spec.kv_cache_groups()
    if len(groups) > MAX_KV_CACHE_GROUPS:
        raise ConfigError(
            f"model: {spec.name} pages as {len(groups)} KV-cache groups, but KVCacheManager takes at most "
            f"{MAX_KV_CACHE_GROUPS}; no pool can be planned for it"
        )
    page = spec.group_page_bytes(page_size, kv_dtype, tp)
    if page > MAX_INT:
        raise ConfigError(f"page_size: a page of {page:,} bytes of {spec.name} is beyond any memory")
    scales = spec.scale_bytes(kv_dtype, tp)
    state = spec.state_bytes(1, tp)
    # What pages and states can use: the pool's scales and its null page come first.
    room_for_requests = budget - scales - page

    def pages(num_tokens: int) -> int:
        return sum(g.pages_per_sequence(num_tokens, page_size) for g in groups)

    def cost(num_tokens: int) -> int:
        return pages(num_tokens) * page + state

    def requests_that_fit(num_tokens: int) -> int:
        return max(0, room_for_requests // cost(num_tokens)) if room_for_requests > 0 else 0

    # First, each question against the whole budget, every request with its state.
    max_at_context = requests_that_fit(context_len) if context_len is not None else None
    alone_at_context = max_at_context  # what a plan for context_len alone would give (for the warning)
    ctx_pages = pages(context_len) if context_len is not None else None
    padding_bytes = None
    if context_len is not None:
        padding_bytes = sum(
            g.pages_per_sequence(context_len, page_size) * (page - g.used_page_bytes(page_size, kv_dtype, tp))
            for g in groups
        )
    max_mix = worst = None
    if request_lens:
        total_cost = sum(cost(n) for n in request_lens)
        room = room_for_requests
        max_mix = max(0, room * len(request_lens) // total_cost) if room > 0 else 0
        worst = requests_that_fit(max(request_lens))

    # Constant state is set aside for the largest request count the plan states, then the pool is what
    # is left; every count is then re-read against that pool (and so never exceeds the states set aside).
    reserved_requests = 0
    if state:
        stated = [c for c in (concurrency, max_at_context, max_mix, worst) if c is not None]
        reserved_requests = max(stated, default=0)
    state_reserved = reserved_requests * state
    num_pages = pages_for_budget(max(0, budget - scales - state_reserved), page)
    if num_pages > MAX_NUM_PAGES:
        raise ConfigError(
            f"page_size: the pool would hold {num_pages:,} pages of {page_size} tokens, beyond the "
            f"{MAX_NUM_PAGES:,} a KVCacheManager holds (int32 page ids): use larger pages"
        )
    usable = max(0, num_pages - 1)
    if state:
        if max_at_context is not None and ctx_pages is not None:
            max_at_context = min(max_at_context, usable // ctx_pages)
        if worst is not None:
            worst = min(worst, usable // pages(max(request_lens)))
        if max_mix is not None:
            max_mix = min(max_mix, usable * len(request_lens) // sum(pages(n) for n in request_lens))

    max_context: int | None = None
    unbounded = False
    if concurrency is not None:
        # Pages each of `concurrency` requests may hold in this pool (their state is set aside above when
        # the model keeps one: reserved_requests >= concurrency).
        each = usable // concurrency
        windows = [g.window for g in groups]
        if (
            all(w is not None for w in windows)
            and sum(_window_pages(w, page_size) for w in windows if w is not None) <= each
        ):
            unbounded = True
        else:
            max_context = _longest_pages(pages, page_size, each) * page_size

    warnings: list[str] = []
    gpu_label = f"{device.name} ({format_bytes(device.mem_bytes)})"
    # Cache needed for what was asked; at least the null page and the first page of one request.
    need = scales + page + cost(1)
    if concurrency is not None and (context_len is not None or request_lens):
        longest = context_len if context_len is not None else max(request_lens)
        need = scales + page + concurrency * cost(longest)
    elif context_len is not None:
        need = scales + page + cost(context_len)
    elif request_lens:
        need = scales + page + cost(max(request_lens))
    elif concurrency is not None:
        need = scales + page + concurrency * cost(1)
    asked = _describe_ask(concurrency, context_len, request_lens)
    if context_len is not None and request_lens:
        # The mix must fit one of its longest requests too: it said "fits" while not one request of a
        # mix longer than context_len could be served.
        mix_need = scales + page + cost(max(request_lens))
        if mix_need > need:
            need, asked = mix_need, f"1 request of {max(request_lens):,} tokens (the mix's longest)"
    shortfall = max(0, need - budget)
    fits = shortfall == 0

    if budget < 0:
        warnings.append(
            f"does not fit: weights per GPU ({format_bytes(weights_per_gpu)}) + runtime reserve "
            f"({format_bytes(reserve)}) exceed the {gpu_label} by {format_bytes(-budget)}; "
            f"with the cache asked for, short by {format_bytes(shortfall)}"
        )
    elif not fits:
        detail = f"{asked} need{'s' if asked.startswith('1 ') else ''} {format_bytes(need)} of cache"
        warnings.append(
            f"does not fit: {detail} but {format_bytes(budget)} is left after weights and reserve: "
            f"short by {format_bytes(shortfall)}"
            + _alternatives(alone_at_context, context_len, concurrency, max_context, unbounded)
        )
    if reserve == 0:
        warnings.append("no runtime reserve: the CUDA context, activations and graphs need memory too")
    longest_asked = max([context_len or 0, *request_lens])
    if spec.max_context_len is not None and longest_asked > spec.max_context_len:
        warnings.append(
            f"context {longest_asked:,} exceeds the model's maximum of {spec.max_context_len:,} tokens"
        )
    if max_context is not None and spec.max_context_len is not None and max_context > spec.max_context_len:
        warnings.append(
            f"memory allows {max_context:,} tokens per request, beyond the model's maximum of "
            f"{spec.max_context_len:,}"
        )
    if state and reserved_requests == 0 and budget >= 0:
        if context_len is not None or request_lens:
            asked = f"{context_len:,} tokens" if context_len is not None else f"{max(request_lens):,} tokens"
            warnings.append(
                f"constant-state layers: no state set aside, since not one request of {asked} fits "
                f"(each needs {format_bytes(state)} of state beside its pages)"
            )
        else:
            warnings.append("constant-state layers: no state set aside; give concurrency or context_len")

    return Plan(
        model=spec.name,
        gpu=device.name,
        gpu_mem_bytes=device.mem_bytes,
        tp=tp,
        kv_dtype=kv_dtype,
        page_size=page_size,
        weight_bytes=weights,
        weight_source=weight_source,
        weight_bytes_per_gpu=weights_per_gpu,
        reserve_bytes=reserve,
        kv_budget_bytes=budget,
        page_bytes=page,
        groups=groups,
        group_windows=tuple(g.window for g in groups),
        group_size=groups[0].group_size,
        padding_layers=sum(g.num_padding_layers for g in groups),
        scale_bytes=scales,
        state_bytes_per_request=state,
        state_reserved_requests=reserved_requests,
        state_reserved_bytes=state_reserved,
        num_pages=num_pages,
        usable_pages=usable,
        max_active_tokens=usable * page_size,
        pool_bytes=num_pages * page,
        context_len=context_len,
        pages_per_request=ctx_pages,
        padding_bytes_per_request=padding_bytes,
        max_requests_at_context=max_at_context,
        concurrency=concurrency,
        max_context_at_concurrency=max_context,
        context_unbounded=unbounded,
        request_lens=tuple(request_lens),
        max_requests_for_mix=max_mix,
        max_requests_worst_case=worst,
        fits=fits,
        shortfall_bytes=shortfall,
        warnings=tuple(warnings),
    )


def _longest_pages(pages: Callable[[int], int], page_size: int, each: int) -> int:
    """Largest ``k`` with ``pages(k * page_size) <= each`` (``pages`` is non-decreasing, ``pages(0) == 0``).

    Called only when some group grows with the context or the windows together do not fit; then no
    ``k > each`` fits (a full group, or the largest window's group, alone holds ``k`` pages there), so
    the search stays in ``[0, each]``.
    """
    low, high = 0, each  # pages(low * page_size) <= each always holds
    while low < high:
        mid = (low + high + 1) // 2
        if pages(mid * page_size) <= each:
            low = mid
        else:
            high = mid - 1
    return low


def _describe_ask(concurrency: int | None, context_len: int | None, request_lens: Sequence[int]) -> str:
    count = concurrency if concurrency is not None else 1
    if context_len is not None:
        length = f"{context_len:,} tokens"
    elif request_lens:
        length = f"up to {max(request_lens):,} tokens"
    else:
        length = "one page"
    return f"{count} request{'s' if count != 1 else ''} of {length}"


def _alternatives(
    max_at_context: int | None,
    context_len: int | None,
    concurrency: int | None,
    max_context: int | None,
    unbounded: bool,
) -> str:
    parts = []
    if max_at_context is not None and context_len is not None:
        parts.append(f"{max_at_context} request(s) of {context_len:,} tokens fit")
    if concurrency is not None and not unbounded and max_context is not None:
        parts.append(f"at {concurrency} request(s) the longest context is {max_context:,} tokens")
    return "; " + "; ".join(parts) if parts else ""
