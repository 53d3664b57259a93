#!/usr/bin/env bash
# Build the venv that benches/peers/harness.py needs for its vLLM and SGLang rows.
#
#   bash benches/peers/setup.sh            # ~2 min with a fast PyPI mirror; ~5.4 GB (TRIM_CUDA=1)
#   VENV=/somewhere/else bash benches/peers/setup.sh
#
# The venv lives OUTSIDE the repository (default ${TMPDIR:-/tmp}/kvcore-peers-venv); nothing it installs
# or downloads is committed. Needs CPython 3.11 (the SGLang wheel is cp311; set PYTHON=... to choose the
# interpreter) and PyPI. kvcore itself is not installed: harness.py imports it from <repo>/python, where
# the built _kvcore.abi3.so lives.
#
# What it does, and why (see shared/research/peers.md for the original investigation):
#  1. torch 2.13.0 from PyPI with --no-deps. PyPI only has the CUDA build (+cu130; the +cpu wheels live
#     on download.pytorch.org, which this machine cannot reach). It does NOT import without the CUDA
#     runtime libraries (libtorch_cuda.so links cublas, cudnn, nccl, ...: "ValueError: libcublasLt.so.*
#     not found"), so the 13 nvidia-* runtime wheels it links against are installed too, --no-deps.
#     They load without a GPU or driver. torch 2.13 is inside SGLang's Rust TreeCore range (2.11-2.14).
#  2. vllm 0.33.0 and sglang 0.5.23 with --no-deps (their dependency trees pull flashinfer, CUDA
#     kernels and torch 2.14.x).
#  3. Only the packages that `import vllm.v1.core.kv_cache_manager` and
#     `import sglang.srt.mem_cache.{radix_cache,unified_radix_cache,allocator}` raised
#     ModuleNotFoundError/PackageNotFoundError for, found one round at a time, pinned, --no-deps.
#     torchvision 0.28.0 (the release paired with torch 2.13) imports fine once the CUDA libs exist.
#  4. TRIM_CUDA=1 (default) deletes CUDA libraries nothing loads at import time on a CPU machine (the
#     cuDNN engine libraries, NVRTC alt builds, profiler libs, static archives): about 0.6 GB.
#  5. A smoke test: every module the harness uses imports, SGLang builds its Rust TreeCore, and kvcore
#     imports from <repo>/python.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${VENV:-${TMPDIR:-/tmp}/kvcore-peers-venv}"
PYTHON="${PYTHON:-python3}"
TRIM_CUDA="${TRIM_CUDA:-1}"

case "$VENV" in
"$REPO"/*) echo "VENV=$VENV is inside the repository; put it elsewhere" >&2; exit 2 ;;
esac
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "need CPython 3.11 (the sglang 0.5.23 wheel is cp311); got $("$PYTHON" -V 2>&1). Set PYTHON=..." >&2
    exit 2
fi

t0=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps)

echo "== torch 2.13.0 (PyPI, +cu130) and the CUDA runtime libraries it links against"
"${PIP[@]}" \
    torch==2.13.0 \
    nvidia-cublas==13.1.1.3 \
    nvidia-cuda-cupti==13.0.85 \
    nvidia-cuda-nvrtc==13.0.88 \
    nvidia-cuda-runtime==13.0.96 \
    nvidia-cudnn-cu13==9.20.0.48 \
    nvidia-cufft==12.0.0.61 \
    nvidia-cufile==1.15.1.6 \
    nvidia-curand==10.4.0.35 \
    nvidia-cusparse==12.6.3.3 \
    nvidia-cusparselt-cu13==0.8.1 \
    nvidia-nccl-cu13==2.29.7 \
    nvidia-nvjitlink==13.5.37 \
    nvidia-nvshmem-cu13==3.4.5

echo "== vllm 0.33.0 and sglang 0.5.23 (--no-deps)"
"${PIP[@]}" vllm==0.33.0 sglang==0.5.23

echo "== import-time dependencies (pinned, --no-deps)"
"${PIP[@]}" \
    aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7 annotated-types==0.8.0 \
    anyio==4.16.0 apache-tvm-ffi==0.1.11 attrs==26.1.0 cachetools==8.0.2 cbor2==6.3.0 \
    certifi==2026.10.19.post1 cloudpickle==3.1.3 compressed-tensors==0.17.0 dill==0.4.1 fastapi==0.136.3 \
    filelock==4.3.1 frozenlist==1.8.0 fsspec==2026.9.0 gguf==0.19.0 h11==0.16.0 httpcore2==2.16.2 \
    httpx2==2.16.2 huggingface_hub==2.4.0 idna==3.20 ipython==9.18.1 Jinja2==3.1.6 llguidance==1.7.6 \
    loguru==0.7.3 MarkupSafe==3.0.4 mpmath==1.3.0 msgspec==0.22.0 multidict==7.2.1 networkx==3.6.1 \
    numpy==2.4.6 openai==3.57.0 openai-harmony==0.0.8 orjson==3.13.0 packaging==26.4 \
    partial-json-parser==0.2.1.1.post7 pillow==13.0.0 prometheus_client==0.26.0 propcache==0.5.4 \
    psutil==7.2.2 py-cpuinfo==9.0.0 pybase64==1.5.1 pydantic==2.14.4 pydantic_core==2.50.5 \
    Pygments==2.21.0 PyYAML==6.0.4 pyzmq==27.3.0 regex==2026.11.19 requests==2.34.2 safetensors==0.8.0 \
    sentencepiece==0.2.1 setuptools==84.2.1 sniffio==1.3.1 starlette==1.10.0 sympy==1.14.0 \
    tokenizers==0.23.2 torchvision==0.28.0 tqdm==4.70.1 traitlets==5.16.1 transformers==5.19.0 \
    triton==3.8.0 truststore==0.10.5 typing-inspection==0.4.5 typing_extensions==4.16.0 urllib3==2.8.0 \
    uvloop==0.23.0 xgrammar==0.2.8 yarl==1.25.1

SP="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ "$TRIM_CUDA" = 1 ]; then
    echo "== trimming CUDA libraries that nothing loads on a CPU machine"
    rm -f "$SP"/nvidia/cudnn/lib/libcudnn_{adv,cnn,engines_precompiled,engines_runtime_compiled,graph,heuristic,ops}.so.9 \
        "$SP"/nvidia/cu13/lib/{libnvrtc.alt.so.13,libnvrtc-builtins.alt.so.13.0,libnvperf_host.so,libnvperf_target.so} \
        "$SP"/nvidia/cu13/lib/{libpcsamplingutil.so,libnvblas.so.13,libcufftw.so.12,libcheckpoint.so} \
        "$SP"/nvidia/cu13/lib/*.a
fi

echo "== smoke test"
KVCORE_PY="$REPO/python" "$VENV/bin/python" - <<'EOF'
import os, sys, warnings
warnings.filterwarnings("ignore")
import torch
torch.set_num_threads(1)
import vllm
import vllm.v1.core.kv_cache_manager, vllm.v1.core.block_pool, vllm.v1.request  # noqa: E401
import sglang
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
a = PagedTokenToKVPoolAllocator(1024, 16, torch.float16, "cpu", None, need_sort=False)
c = UnifiedRadixCache(CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=a,
                                      page_size=16, tree_components=(ComponentType.FULL,), tree_core_backend="rust"))
core = type(c.tree_core).__name__
assert "Rust" in core, core
sys.path.insert(0, os.environ["KVCORE_PY"])
import kvcore
print(f"ok: torch {torch.__version__} (cuda available: {torch.cuda.is_available()}), vllm {vllm.__version__}, "
      f"sglang {sglang.__version__} ({core}), kvcore {kvcore.__version__} from {os.path.dirname(kvcore.__file__)}")
EOF
echo "venv: $VENV ($(du -sh "$VENV" | cut -f1)), $(( $(date +%s) - t0 )) s"
echo "run:  $VENV/bin/python $HERE/harness.py --reps 3"
