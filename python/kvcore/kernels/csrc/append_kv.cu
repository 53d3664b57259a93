// kvcore: append_kv (vLLM's reshape_and_cache): scatter new K/V rows into their slots, quantizing on
// the way for fp8/int8 pools. NumPy reference: python/kvcore/kernels/reference.py::append_kv.
//
// Grid: one thread block per token (num_tokens > 0; the host never launches an empty grid); 128
// threads, each moving 8 elements (16 bytes of fp16/bf16 input) per step over 2 x num_kv_heads x
// head_dim. A slot of -1 (a padding token) is skipped, and so is any slot outside [0, num_slots): the
// host ranges host slot mappings, but a device one is not read back (that would synchronize), so the
// kernel itself never writes outside the layer. Slots are distinct within a launch (the host checks
// host mappings; a device mapping is the caller's), so there is no write race.
#include "common.cuh"

namespace kv {

template <typename Act, typename Cache>
__device__ __forceinline__ void append_kv_impl(
    const Act* __restrict__ k,                  // [num_tokens, num_kv_heads, head_dim] (strided rows)
    const Act* __restrict__ v,                  // [num_tokens, num_kv_heads, head_dim] (strided rows)
    i64 k_token_stride, i64 k_head_stride,      // elements
    i64 v_token_stride, i64 v_head_stride,      // elements
    const i64* __restrict__ slot_mapping,       // [num_tokens] int64: page_id * page_size + offset, or -1
    typename Cache::storage* __restrict__ pool,  // this layer's K plane; V is at + kv_stride
    i64 kv_stride, i64 page_stride, i64 head_stride, i64 token_stride,  // elements (PoolStrides)
    const float* __restrict__ k_scale,          // [num_kv_heads] this layer's K scales (quantized pools)
    const float* __restrict__ v_scale,          // [num_kv_heads] this layer's V scales (quantized pools)
    int num_kv_heads, int head_dim, int page_size,
    i64 num_slots) {                            // num_pages * page_size: slots past it are skipped
  typedef typename Cache::storage S;
  const int token = blockIdx.x;
  const i64 slot = slot_mapping[token];
  if (slot < 0 || slot >= num_slots) {
    if (slot != -1) check_failed(2, token, slot);  // -1 is padding; anything else is a caller's bug
    return;
  }
  const i64 page = slot / page_size;
  const i64 offset = slot - page * page_size;
  const int vecs_per_head = head_dim / 8;
  const int total = 2 * num_kv_heads * vecs_per_head;
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const int kv = i / (num_kv_heads * vecs_per_head);
    const int rem = i - kv * num_kv_heads * vecs_per_head;
    const int head = rem / vecs_per_head;
    const int col = (rem - head * vecs_per_head) * 8;
    const Act* src = kv ? v + token * v_token_stride + head * v_head_stride
                        : k + token * k_token_stride + head * k_head_stride;
    S* dst = pool + kv * kv_stride + page * page_stride + head * head_stride + offset * token_stride + col;
    const uint4 raw = load16(src + col);
    if constexpr (!is_quantized<Cache>::value) {
      *reinterpret_cast<uint4*>(dst) = raw;  // same 16-bit type: the host converts first otherwise
    } else {
      const float scale = kv ? v_scale[head] : k_scale[head];
      const Act* x = reinterpret_cast<const Act*>(&raw);
      unsigned char q[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float y = to_float(x[e]) / scale;  // IEEE division, as the reference's float32 x / scale
        q[e] = quantize<Cache>(y);
      }
      uint2 packed;
      packed.x = q[0] | (q[1] << 8) | (q[2] << 16) | (static_cast<unsigned>(q[3]) << 24);
      packed.y = q[4] | (q[5] << 8) | (q[6] << 16) | (static_cast<unsigned>(q[7]) << 24);
      *reinterpret_cast<uint2*>(dst) = packed;
    }
  }
}

}  // namespace kv

// One extern "C" entry point per (activation type, cache precision) the runtime launches; the names are
// listed in python/kvcore/kernels/_nvrtc.py (KERNEL_NAMES) and checked against the cubin by CI.
#define KV_APPEND(NAME, ACT, CACHE)                                                                        \
  extern "C" __global__ void __launch_bounds__(128)                                                        \
      NAME(const ACT* __restrict__ k, const ACT* __restrict__ v, long long k_token_stride,                 \
           long long k_head_stride, long long v_token_stride, long long v_head_stride,                     \
           const long long* __restrict__ slot_mapping, CACHE::storage* __restrict__ pool, long long kv_stride, \
           long long page_stride, long long head_stride, long long token_stride,                           \
           const float* __restrict__ k_scale, const float* __restrict__ v_scale, int num_kv_heads,         \
           int head_dim, int page_size, long long num_slots) {                                             \
    kv::append_kv_impl<ACT, CACHE>(k, v, k_token_stride, k_head_stride, v_token_stride, v_head_stride,    \
                                   slot_mapping, pool, kv_stride, page_stride, head_stride, token_stride, \
                                   k_scale, v_scale, num_kv_heads, head_dim, page_size, num_slots);       \
  }

KV_APPEND(append_kv_fp16_fp16, __half, kv::CacheF16)
KV_APPEND(append_kv_bf16_bf16, __nv_bfloat16, kv::CacheBF16)
KV_APPEND(append_kv_fp16_fp8, __half, kv::CacheFP8)
KV_APPEND(append_kv_bf16_fp8, __nv_bfloat16, kv::CacheFP8)
KV_APPEND(append_kv_fp16_int8, __half, kv::CacheI8)
KV_APPEND(append_kv_bf16_int8, __nv_bfloat16, kv::CacheI8)
