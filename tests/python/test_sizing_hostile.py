"""kvcore.sizing's Python API against bad input: every public function, constructor and method raises
ConfigError for a wrong type or an absurd value, never a bare TypeError, AttributeError, ValueError,
OverflowError or MemoryError from somewhere inside."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kv_helpers import llama_like

import kvcore.sizing as sizing
from kvcore.exceptions import ConfigError
from kvcore.sizing import (
    GpuSpec,
    LayerGroup,
    ModelSpec,
    format_bytes,
    gpu_preset,
    kv_cache_bytes,
    load_model,
    model_from_config,
    model_preset,
    parse_bytes,
    parse_count,
    parse_tokens,
    plan,
    size,
)

LLAMA = llama_like()

# Valid keyword arguments of every public function of kvcore.sizing: each argument is replaced in turn
# by a wrong one, the others staying valid.
VALID: dict[str, dict[str, Any]] = {
    "format_bytes": dict(value=1024),
    "gpu_preset": dict(name="H100-80G"),
    "is_quantized_kv_dtype": dict(kv_dtype="fp8"),
    "kv_cache_bytes": dict(
        num_layers=32, num_kv_heads=8, head_dim=128, num_tokens=16, kv_dtype="bf16", batch=1
    ),
    "kv_cache_groups": dict(model="gemma-3-1b"),
    "kv_dtype_bits": dict(kv_dtype="bf16"),
    "kv_dtype_bytes": dict(kv_dtype="bf16"),
    "load_model": dict(model="llama-3.1-8b"),
    "model_from_config": dict(config=LLAMA, name="llama"),
    "model_preset": dict(name="llama-3.1-8b"),
    "normalize_kv_dtype": dict(kv_dtype="bf16"),
    "normalize_weight_dtype": dict(weight_dtype="bf16"),
    "pages_for_budget": dict(budget_bytes=10**9, page_bytes=4096),
    "pages_per_request": dict(num_tokens=100, page_size=16, window=64),
    "parse_bytes": dict(text="1GiB"),
    "parse_count": dict(text="8B"),
    "parse_tokens": dict(text="32k"),
    "plan": dict(
        model="llama-3.1-8b",
        gpu="H100-80G",
        tp=1,
        kv_dtype="bf16",
        weight_bytes=16 * 10**9,
        weight_dtype="bf16",
        reserve_bytes=2 * 2**30,
        reserve_fraction=0.1,
        page_size=16,
        context_len=4096,
        concurrency=4,
        requests=[(100, 10)],
    ),
    "size": dict(model="llama-3.1-8b", context_len=4096, batch=2, kv_dtype="fp8", tp=2),
    "weight_bytes": dict(num_params=8 * 10**9, weight_dtype="bf16"),
    "weight_dtype_bits": dict(weight_dtype="int4"),
}
# A value of each wrong kind: not a number, not a name, a container, bytes, a float, far beyond int64;
# None too, where None is not the default.
WRONG: list[Any] = [object(), b"7", [1], 1.5, 10**30]
# The one right after all: a byte count prints at any size.
ALLOWED = [("format_bytes", "value", 10**30)]


def public_functions() -> list[str]:
    return sorted(n for n in sizing.__all__ if inspect.isfunction(getattr(sizing, n)))


def test_every_public_function_has_valid_arguments_here() -> None:
    assert set(public_functions()) == set(VALID)
    for name, kwargs in VALID.items():
        getattr(sizing, name)(**kwargs)  # the baseline call succeeds


@pytest.mark.parametrize("name", public_functions())
def test_wrong_arguments_raise_config_error(name: str) -> None:
    func: Callable[..., Any] = getattr(sizing, name)
    params = inspect.signature(func).parameters
    for param in VALID[name]:
        wrongs = WRONG + ([None] if params[param].default is not None else [])
        for wrong in wrongs:
            if (name, param, wrong) in ALLOWED:
                continue
            try:
                func(**{**VALID[name], param: wrong})
            except ConfigError:
                continue
            except Exception as exc:  # the point is which class it is
                pytest.fail(f"{name}({param}={wrong!r:.40}) raised {type(exc).__name__}: {exc}")
            pytest.fail(f"{name}({param}={wrong!r:.40}) raised nothing")


@pytest.mark.parametrize("func", [parse_tokens, parse_bytes, parse_count])
@pytest.mark.parametrize("text", [None, 1.5, b"4k", ["4k"], "9" * 5000, "0." + "1" * 5000])
def test_unit_parsers(func: Callable[..., int], text: object) -> None:
    with pytest.raises(ConfigError):
        func(text)


@pytest.mark.parametrize("func", [model_preset, gpu_preset])
@pytest.mark.parametrize("name", [None, 3, b"h100", ["llama-3.1-8b"]])
def test_preset_lookups(func: Callable[[Any], object], name: object) -> None:
    with pytest.raises(ConfigError):
        func(name)


def test_format_bytes_takes_integers_only() -> None:
    for value in ("1024", None, 1.5, True):
        with pytest.raises(ConfigError):
            format_bytes(value)  # type: ignore[arg-type]


def test_paths_that_the_os_refuses() -> None:
    # Path("a" * 5000).exists() raises OSError (ENAMETOOLONG): it is simply not a file.
    with pytest.raises(ConfigError, match="unknown preset"):
        load_model("a" * 5000)
    # A NUL makes every os call raise ValueError.
    with pytest.raises(ConfigError, match="cannot read"):
        model_from_config("config\0.json")


def test_layer_count_far_beyond_any_model_is_refused_before_allocating() -> None:
    # 2**40 layers would be a list of 2**40 layer kinds (8 TiB).
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        model_from_config({**LLAMA, "num_hidden_layers": 2**40})


def test_numbers_beyond_int64_are_refused() -> None:
    with pytest.raises(ConfigError, match="num_tokens"):
        kv_cache_bytes(32, 8, 128, 10**5000)
    with pytest.raises(ConfigError, match="context_len"):
        size("llama-3.1-8b", 10**5000)
    with pytest.raises(ConfigError, match="head_dim"):
        model_from_config({**LLAMA, "head_dim": 2**64})


def test_config_file_with_non_finite_number(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA)[:-1] + ', "rope_theta": Infinity}')
    with pytest.raises(ConfigError, match="Infinity"):
        load_model(str(path))


def test_plan_requests_must_be_a_sequence_of_pairs() -> None:
    for requests in (None, 5, "24k+8k", {"a": 1}):
        with pytest.raises(ConfigError, match="requests"):
            plan("llama-3.1-8b", gpu="H100-80G", requests=requests)  # type: ignore[arg-type]


def test_constructors_check_their_fields() -> None:
    group = LayerGroup("full_attention", 32, 8, 128)
    bad_specs: list[dict[str, Any]] = [
        dict(name=None),
        dict(groups=None),
        dict(groups=(1,)),
        dict(groups=[group]),
        dict(source=None),
    ]
    for bad in bad_specs:
        with pytest.raises(ConfigError):
            ModelSpec(**{**dict(name="x", groups=(group,), num_layers=32), **bad})
    with pytest.raises(ConfigError):
        LayerGroup("full_attention", 32, 8, 128, tp_sharded=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        GpuSpec(None, 80 * 2**30)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="name"):
        model_from_config(LLAMA, name=5)  # type: ignore[arg-type]


@pytest.mark.parametrize("preset", ["llama-3.1-8b", "deepseek-v3", "qwen3-next-80b-a3b", "gemma-3-1b"])
def test_model_methods_check_their_arguments(preset: str) -> None:
    spec = model_preset(preset)
    calls: list[tuple[Callable[..., Any], dict[str, Any]]] = [
        (spec.elements_per_token, dict(tp=1)),
        (spec.bytes_per_token, dict(kv_dtype="bf16", tp=1)),
        (spec.kv_bytes, dict(num_tokens=10, kv_dtype="bf16", batch=1, tp=1)),
        (spec.scale_bytes, dict(kv_dtype="fp8", tp=1)),
        (spec.state_bytes, dict(batch=1, tp=1)),
        (spec.total_bytes, dict(num_tokens=10, kv_dtype="bf16", batch=1, tp=1)),
        (spec.page_bytes, dict(page_size=16, kv_dtype="bf16", tp=1)),
        (spec.validate_tp, dict(tp=1)),
        (spec.group_page_bytes, dict(page_size=16, kv_dtype="bf16", tp=1)),
        (spec.pages_per_sequence, dict(num_tokens=10, page_size=16)),
    ]
    for kv_group in spec.kv_cache_groups():
        calls += [
            (kv_group.page_bytes, dict(page_size=16, kv_dtype="bf16", tp=1)),
            (kv_group.used_page_bytes, dict(page_size=16, kv_dtype="bf16", tp=1)),
            (kv_group.pages_per_sequence, dict(num_tokens=10, page_size=16)),
        ]
    for g in spec.groups:
        calls += [
            (g.kv_heads_per_gpu, dict(tp=1)),
            (g.elements_per_token, dict(tp=1)),
            (g.cached_tokens, dict(num_tokens=10)),
            (g.scale_bytes, dict(kv_dtype="bf16", tp=1)),
            (g.state_bytes_per_gpu, dict(tp=1)),
        ]
    for method, kwargs in calls:
        method(**kwargs)
        for param in kwargs:
            for wrong in (object(), "2", None):
                with pytest.raises(ConfigError):
                    method(**{**kwargs, param: wrong})


@pytest.mark.parametrize("global_kv_heads", [3, 5, 64])
def test_global_kv_heads_must_divide_the_query_heads(global_kv_heads: int) -> None:
    # Gemma 4's full layers (attention_k_eq_v) take num_global_key_value_heads, checked as
    # num_key_value_heads is: 3 K/V heads for 32 query heads was sized as a model.
    cfg = llama_like(attention_k_eq_v=True, global_head_dim=256, num_global_key_value_heads=global_kv_heads)
    with pytest.raises(ConfigError, match=f"num_global_key_value_heads: {global_kv_heads} does not divide"):
        model_from_config(cfg)
    for ok in (1, 4, 32):  # every divisor is a valid grouping: the full layers then cache `ok` heads
        spec = model_from_config({**cfg, "num_global_key_value_heads": ok})
        (full,) = spec.groups
        assert (full.num_kv_heads, full.head_dim) == (ok, 256)
