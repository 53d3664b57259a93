"""kvcore's own table of well-known models and GPUs.

Why a table of our own: operators size a deployment before they have downloaded anything, and the
numbers that matter (layers, K/V heads, head_dim, windows, MLA ranks) are architectural facts published
in each model's ``config.json``. Each preset is written in that same HF form and goes through the same
parser as a real config (:func:`kvcore.sizing.model_from_config`), so a preset can never size a model
differently from its config. Parameter counts are the rounded totals of the model cards (3 significant
figures): good enough to estimate weights, and overridden by a measured ``weight_bytes`` whenever one
is available.

GPU memory is the total that ``nvidia-smi`` reports for the board (MiB), i.e. what the driver can hand
out before CUDA context and runtime overheads, which the plan's runtime reserve covers.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

from kvcore._json import show
from kvcore.exceptions import ConfigError
from kvcore.sizing.formula import check_int
from kvcore.sizing.model import ModelSpec, model_from_config
from kvcore.sizing.units import MiB

__all__ = [
    "GPU_PRESETS",
    "MODEL_PRESETS",
    "GpuSpec",
    "ModelPreset",
    "gpu_preset",
    "model_preset",
]


@dataclass(frozen=True, slots=True)
class ModelPreset:
    """A model as its HF config describes it, plus its parameter count."""

    # The fields of the model's config.json that sizing reads (HF names and meanings).
    config: dict[str, Any]
    # Total parameters from the model card, rounded to 3 significant figures; None when not published.
    num_params: int | None


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator's memory, the only GPU property sizing needs."""

    # Display name, e.g. "H100-80G".
    name: str
    # Memory of one board in bytes (nvidia-smi total); >= 1.
    mem_bytes: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError(f"gpu name: expected a string, got {show(self.name)}")
        check_int(self.mem_bytes, "gpu_mem_bytes", minimum=1)


def _dense(
    layers: int,
    heads: int,
    kv_heads: int,
    hidden: int,
    max_pos: int,
    head_dim: int | None = None,
    model_type: str = "llama",
    **extra: Any,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model_type": model_type,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_size": hidden,
        "max_position_embeddings": max_pos,
        "torch_dtype": "bfloat16",
    }
    if head_dim is not None:
        config["head_dim"] = head_dim
    config.update(extra)
    return config


def _qwen(layers: int, heads: int, kv_heads: int, hidden: int, max_pos: int, **extra: Any) -> dict[str, Any]:
    # Qwen configs carry a sliding_window that is off (use_sliding_window false); keep that explicit.
    return _dense(layers, heads, kv_heads, hidden, max_pos, use_sliding_window=False, **extra)


def _mla(
    layers: int, heads: int, hidden: int, model_type: str = "deepseek_v3", **extra: Any
) -> dict[str, Any]:
    return _dense(
        layers,
        heads,
        heads,
        hidden,
        163840,
        model_type=model_type,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        **extra,
    )


def _gemma3(
    layers: int, heads: int, kv_heads: int, head_dim: int, hidden: int, window: int, max_pos: int
) -> dict[str, Any]:
    return _dense(
        layers,
        heads,
        kv_heads,
        hidden,
        max_pos,
        head_dim,
        model_type="gemma3_text",
        sliding_window=window,
        sliding_window_pattern=6,
    )


def _gpt_oss(layers: int) -> dict[str, Any]:
    # Sliding (128 tokens) and full attention alternate, starting with sliding; the MoE experts are MXFP4.
    return _dense(
        layers,
        64,
        8,
        2880,
        131072,
        64,
        model_type="gpt_oss",
        sliding_window=128,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        quantization_config={"quant_method": "mxfp4"},
    )


def _b(billions: float) -> int:
    return round(billions * 10**9)


MODEL_PRESETS: dict[str, ModelPreset] = {
    # Llama 3.x (GQA, 8 KV heads throughout).
    "llama-3-8b": ModelPreset(_dense(32, 32, 8, 4096, 8192), _b(8.03)),
    "llama-3-70b": ModelPreset(_dense(80, 64, 8, 8192, 8192), _b(70.6)),
    "llama-3.1-8b": ModelPreset(_dense(32, 32, 8, 4096, 131072), _b(8.03)),
    "llama-3.1-70b": ModelPreset(_dense(80, 64, 8, 8192, 131072), _b(70.6)),
    "llama-3.1-405b": ModelPreset(_dense(126, 128, 8, 16384, 131072), _b(405)),
    "llama-3.2-1b": ModelPreset(_dense(16, 32, 8, 2048, 131072, head_dim=64), _b(1.24)),
    "llama-3.2-3b": ModelPreset(_dense(28, 24, 8, 3072, 131072, head_dim=128), _b(3.21)),
    "llama-3.3-70b": ModelPreset(_dense(80, 64, 8, 8192, 131072), _b(70.6)),
    # Mistral: every layer slides over 4,096 tokens in Mistral 7B v0.1; Mixtral has no window.
    "mistral-7b": ModelPreset(
        _dense(32, 32, 8, 4096, 32768, model_type="mistral", sliding_window=4096), _b(7.24)
    ),
    "mixtral-8x7b": ModelPreset(_dense(32, 32, 8, 4096, 32768, model_type="mixtral"), _b(46.7)),
    "mixtral-8x22b": ModelPreset(_dense(56, 48, 8, 6144, 65536, model_type="mixtral"), _b(141)),
    # Qwen 2.5 (sliding window off).
    "qwen2.5-0.5b": ModelPreset(_qwen(24, 14, 2, 896, 32768), _b(0.494)),
    "qwen2.5-1.5b": ModelPreset(_qwen(28, 12, 2, 1536, 32768), _b(1.54)),
    "qwen2.5-3b": ModelPreset(_qwen(36, 16, 2, 2048, 32768), _b(3.09)),
    "qwen2.5-7b": ModelPreset(_qwen(28, 28, 4, 3584, 32768), _b(7.61)),
    "qwen2.5-14b": ModelPreset(_qwen(48, 40, 8, 5120, 32768), _b(14.7)),
    "qwen2.5-32b": ModelPreset(_qwen(64, 40, 8, 5120, 32768), _b(32.5)),
    "qwen2.5-72b": ModelPreset(_qwen(80, 64, 8, 8192, 32768), _b(72.7)),
    # Qwen 3 (head_dim 128 regardless of hidden size).
    "qwen3-0.6b": ModelPreset(_qwen(28, 16, 8, 1024, 40960, head_dim=128), _b(0.6)),
    "qwen3-1.7b": ModelPreset(_qwen(28, 16, 8, 2048, 40960, head_dim=128), _b(1.7)),
    "qwen3-4b": ModelPreset(_qwen(36, 32, 8, 2560, 40960, head_dim=128), _b(4.0)),
    "qwen3-8b": ModelPreset(_qwen(36, 32, 8, 4096, 40960, head_dim=128), _b(8.2)),
    "qwen3-14b": ModelPreset(_qwen(40, 40, 8, 5120, 40960, head_dim=128), _b(14.8)),
    "qwen3-32b": ModelPreset(_qwen(64, 64, 8, 5120, 40960, head_dim=128), _b(32.8)),
    "qwen3-30b-a3b": ModelPreset(_qwen(48, 32, 4, 2048, 40960, head_dim=128), _b(30.5)),
    "qwen3-235b-a22b": ModelPreset(_qwen(94, 64, 4, 4096, 40960, head_dim=128), _b(235)),
    # Qwen3-Next: 3 Gated-DeltaNet layers (constant state) for every full-attention layer.
    "qwen3-next-80b-a3b": ModelPreset(
        _dense(
            48,
            16,
            2,
            2048,
            262144,
            head_dim=256,
            model_type="qwen3_next",
            full_attention_interval=4,
            linear_num_key_heads=16,
            linear_num_value_heads=32,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_conv_kernel_dim=4,
        ),
        _b(80),
    ),
    # Gemma 2: sliding (4,096) and full attention alternate, starting with sliding.
    "gemma-2-2b": ModelPreset(
        _dense(26, 8, 4, 2304, 8192, 256, model_type="gemma2", sliding_window=4096), _b(2.61)
    ),
    "gemma-2-9b": ModelPreset(
        _dense(42, 16, 8, 3584, 8192, 256, model_type="gemma2", sliding_window=4096), _b(9.24)
    ),
    "gemma-2-27b": ModelPreset(
        _dense(46, 32, 16, 4608, 8192, 128, model_type="gemma2", sliding_window=4096), _b(27.2)
    ),
    # Gemma 3: five sliding layers, then one full-attention layer.
    "gemma-3-1b": ModelPreset(_gemma3(26, 4, 1, 256, 1152, 512, 32768), _b(1.0)),
    "gemma-3-4b": ModelPreset(_gemma3(34, 8, 4, 256, 2560, 1024, 131072), _b(4.3)),
    "gemma-3-12b": ModelPreset(_gemma3(48, 16, 8, 256, 3840, 1024, 131072), _b(12.2)),
    "gemma-3-27b": ModelPreset(_gemma3(62, 32, 16, 128, 5376, 1024, 131072), _b(27.4)),
    # Gemma 4 26B-A4B: like Gemma 3's 5:1 pattern, with wider, K=V full-attention layers.
    "gemma-4-26b-a4b": ModelPreset(
        _dense(
            30,
            16,
            8,
            2816,
            262144,
            256,
            model_type="gemma4_text",
            sliding_window=1024,
            layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(30)],
            global_head_dim=512,
            num_global_key_value_heads=2,
            attention_k_eq_v=True,
            num_kv_shared_layers=0,
        ),
        None,
    ),
    # gpt-oss: 64 query heads, 8 KV heads of 64. The weight estimate counts 4 bits per parameter, below the
    # checkpoint (attention and embeddings stay bf16, MXFP4 carries block scales): prefer weight_bytes.
    "gpt-oss-20b": ModelPreset(_gpt_oss(24), _b(20.9)),
    "gpt-oss-120b": ModelPreset(_gpt_oss(36), _b(117)),
    # DeepSeek: MLA, one latent of kv_lora_rank + qk_rope_head_dim = 576 elements per token and layer.
    "deepseek-v2": ModelPreset(_mla(60, 128, 5120, "deepseek_v2"), _b(236)),
    "deepseek-v2-lite": ModelPreset(_mla(27, 16, 2048, "deepseek_v2"), _b(15.7)),
    "deepseek-v3": ModelPreset(_mla(61, 128, 7168, quantization_config={"quant_method": "fp8"}), _b(671)),
    "deepseek-r1": ModelPreset(_mla(61, 128, 7168, quantization_config={"quant_method": "fp8"}), _b(671)),
    # Phi-3: MHA (32 KV heads) with a sliding window on every layer (2,047 for 4k, 262,144 for 128k).
    "phi-3-mini-4k": ModelPreset(
        _dense(32, 32, 32, 3072, 4096, model_type="phi3", sliding_window=2047), _b(3.82)
    ),
    "phi-3-mini-128k": ModelPreset(
        _dense(32, 32, 32, 3072, 131072, model_type="phi3", sliding_window=262144), _b(3.82)
    ),
    "phi-3-medium-4k": ModelPreset(
        _dense(40, 40, 10, 5120, 4096, model_type="phi3", sliding_window=2047), _b(14.0)
    ),
    "phi-3.5-mini": ModelPreset(
        _dense(32, 32, 32, 3072, 131072, model_type="phi3", sliding_window=262144), _b(3.82)
    ),
}

# Other names for the same models (after normalisation: lower case, organisation and -instruct dropped).
_MODEL_ALIASES: dict[str, str] = {
    "mistral-7b-v0.1": "mistral-7b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mixtral-8x22b-v0.1": "mixtral-8x22b",
    "gemma-3-1b-pt": "gemma-3-1b",
    "phi-3-mini": "phi-3-mini-4k",
    "phi-3-mini-4k-instruct": "phi-3-mini-4k",
    "phi-3.5-mini-instruct": "phi-3.5-mini",
    "qwen3-next-80b-a3b-thinking": "qwen3-next-80b-a3b",
}

GPU_PRESETS: dict[str, GpuSpec] = {
    gpu.name: gpu
    for gpu in (
        GpuSpec("H100-80G", 81559 * MiB),
        GpuSpec("H200-141G", 143771 * MiB),
        GpuSpec("A100-80G", 81920 * MiB),
        GpuSpec("A100-40G", 40960 * MiB),
        GpuSpec("L40S", 46068 * MiB),
        GpuSpec("L4", 23034 * MiB),
        GpuSpec("RTX-4090", 24564 * MiB),
        GpuSpec("RTX-5090", 32607 * MiB),
    )
}

_GPU_ALIASES: dict[str, str] = {
    "h100": "H100-80G",
    "h200": "H200-141G",
    "4090": "RTX-4090",
    "5090": "RTX-5090",
}

_SUFFIXES = ("-instruct", "-it", "-chat", "-base", "-hf")


def _model_key(name: str) -> str:
    key = name.strip().lower().rsplit("/", 1)[-1].replace("_", "-").replace(" ", "-")
    key = key.removeprefix("meta-")
    stripped = True
    while stripped:
        stripped = False
        for suffix in _SUFFIXES:
            if key.endswith(suffix) and key not in MODEL_PRESETS and key not in _MODEL_ALIASES:
                key = key.removesuffix(suffix)
                stripped = True
    return _MODEL_ALIASES.get(key, key)


def _gpu_key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _unknown(kind: str, name: str, choices: list[str]) -> ConfigError:
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=4, cutoff=0.5)
    if close:
        hint = (
            f"did you mean {', '.join(repr(by_lower[c]) for c in close)}? (all: kvcore size --list-presets)"
        )
    else:
        hint = f"known presets: {', '.join(sorted(choices))}"
    return ConfigError(f"{kind}: unknown preset {show(name)}; {hint}")


def model_preset(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of a preset, by name (``'llama-3.1-70b'``, ``'Qwen/Qwen3-8B'``, ...).

    Raises:
        ConfigError: unknown name; the message suggests the closest preset names.
    """
    if not isinstance(name, str):
        raise ConfigError(f"model: expected a preset name, got {show(name)}")
    key = _model_key(name)
    preset = MODEL_PRESETS.get(key)
    if preset is None:
        raise _unknown("model", key, list(MODEL_PRESETS))
    spec = model_from_config(preset.config, name=key)
    return dataclasses.replace(spec, num_params=preset.num_params, source="preset")


def gpu_preset(name: str) -> GpuSpec:
    """A GPU by name, ignoring case, spaces and dashes (``'RTX 4090'``, ``'h100-80g'``, ``'H200'``).

    Raises:
        ConfigError: unknown name; the message suggests the closest GPU names.
    """
    if not isinstance(name, str):
        raise ConfigError(f"gpu: expected a preset name, got {show(name)}")
    key = _gpu_key(name)
    by_key = {_gpu_key(n): gpu for n, gpu in GPU_PRESETS.items()}
    gpu = by_key.get(key) or (GPU_PRESETS[_GPU_ALIASES[key]] if key in _GPU_ALIASES else None)
    if gpu is None:
        raise _unknown("gpu", name, list(GPU_PRESETS))
    return gpu
