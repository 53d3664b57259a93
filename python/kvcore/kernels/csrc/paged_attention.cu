// kvcore: the entry points of paged attention (decode and prefill), page_scores and the LSE merge; the
// kernels themselves, and the design notes, are in paged_attention.cuh (shared with decode_variants.cu).
#include "paged_attention.cuh"

// One extern "C" entry point per (activation type, cache precision, head_dim) the runtime launches; the
// names are listed in python/kvcore/kernels/_nvrtc.py (KERNEL_NAMES) and checked against the cubin by CI.
#define KV_ATTENTION(NAME, ACT, CACHE, D)                                                                     \
  extern "C" __global__ void __launch_bounds__(kv::kThreads, kv::kMinBlocks)                                  \
      NAME(KV_ATTENTION_PARAMS(ACT, CACHE)) {                                                                 \
    kv::paged_attention_dispatch<ACT, CACHE, D, false>(page_shift, nullptr, nullptr, KV_ATTENTION_ARGS);      \
  }

// The bounded-cache variant: the same arguments, then kv_first and lse_out (either may be null).
#define KV_ATTENTION_BOUNDED(NAME, ACT, CACHE, D)                                                             \
  extern "C" __global__ void __launch_bounds__(kv::kThreads, kv::kMinBlocks)                                  \
      NAME(KV_ATTENTION_PARAMS(ACT, CACHE), const int* __restrict__ kv_first, float* __restrict__ lse_out) {  \
    kv::paged_attention_dispatch<ACT, CACHE, D, true>(page_shift, kv_first, lse_out, KV_ATTENTION_ARGS);      \
  }

// page_scores takes the attention kernel's leading arguments (the pool's layer view as the launcher
// passes it to every kernel), so kv_stride and v_scale are accepted and not read.
#define KV_PAGE_SCORES(NAME, ACT, CACHE, D)                                                                   \
  extern "C" __global__ void __launch_bounds__(kv::kThreads)                                                  \
      NAME(const ACT* __restrict__ q, long long q_token_stride, long long q_head_stride,                      \
           const CACHE::storage* __restrict__ pool, long long /*kv_stride*/, long long page_stride,           \
           long long head_stride, long long token_stride, const float* __restrict__ k_scale,                  \
           const float* __restrict__ /*v_scale*/, const int* __restrict__ kv_indptr,                          \
           const int* __restrict__ kv_indices, const int* __restrict__ kv_len,                                \
           const int* __restrict__ q_indptr, const int* __restrict__ items,                                   \
           const int* __restrict__ kv_first, const float* __restrict__ lse, float* __restrict__ page_scores,  \
           float sm_scale, int group_size, int num_kv_heads, int page_shift) {                                \
    kv::page_scores_impl<ACT, CACHE, D>(q, q_token_stride, q_head_stride, pool, page_stride, head_stride,     \
                                        token_stride, k_scale, kv_indptr, kv_indices, kv_len, q_indptr,       \
                                        items, kv_first, lse, page_scores, sm_scale, group_size,              \
                                        num_kv_heads, page_shift);                                            \
  }

#define KV_ATTENTION_ALL_DIMS(ACTN, ACT, CACHEN, CACHE)                                                       \
  KV_ATTENTION(paged_attention_##ACTN##_##CACHEN##_d64, ACT, CACHE, 64)                                       \
  KV_ATTENTION(paged_attention_##ACTN##_##CACHEN##_d128, ACT, CACHE, 128)                                     \
  KV_ATTENTION_BOUNDED(paged_attention_bounded_##ACTN##_##CACHEN##_d64, ACT, CACHE, 64)                       \
  KV_ATTENTION_BOUNDED(paged_attention_bounded_##ACTN##_##CACHEN##_d128, ACT, CACHE, 128)                     \
  KV_PAGE_SCORES(page_scores_##ACTN##_##CACHEN##_d64, ACT, CACHE, 64)                                         \
  KV_PAGE_SCORES(page_scores_##ACTN##_##CACHEN##_d128, ACT, CACHE, 128)

KV_ATTENTION_ALL_DIMS(fp16, __half, fp16, kv::CacheF16)
KV_ATTENTION_ALL_DIMS(bf16, __nv_bfloat16, bf16, kv::CacheBF16)
KV_ATTENTION_ALL_DIMS(fp16, __half, fp8, kv::CacheFP8)
KV_ATTENTION_ALL_DIMS(bf16, __nv_bfloat16, fp8, kv::CacheFP8)
KV_ATTENTION_ALL_DIMS(fp16, __half, int8, kv::CacheI8)
KV_ATTENTION_ALL_DIMS(bf16, __nv_bfloat16, int8, kv::CacheI8)

#define KV_MERGE(NAME, ACT)                                                                                   \
  extern "C" __global__ void __launch_bounds__(128)                                                           \
      NAME(const float* __restrict__ o_part, const float* __restrict__ lse_part,                              \
           const int* __restrict__ merges, const int* __restrict__ q_indptr, ACT* __restrict__ out,           \
           int group_size, int num_kv_heads, int head_dim) {                                                  \
    kv::attention_merge_impl<ACT, false>(o_part, lse_part, merges, q_indptr, out, group_size, num_kv_heads,   \
                                         head_dim);                                                           \
  }

// The merge of page_scores calls: the same arguments, then lse_out.
#define KV_MERGE_LSE(NAME, ACT)                                                                               \
  extern "C" __global__ void __launch_bounds__(128)                                                           \
      NAME(const float* __restrict__ o_part, const float* __restrict__ lse_part,                              \
           const int* __restrict__ merges, const int* __restrict__ q_indptr, ACT* __restrict__ out,           \
           int group_size, int num_kv_heads, int head_dim, float* __restrict__ lse_out) {                     \
    kv::attention_merge_impl<ACT, true>(o_part, lse_part, merges, q_indptr, out, group_size, num_kv_heads,    \
                                        head_dim, lse_out);                                                   \
  }

KV_MERGE(attention_merge_fp16, __half)
KV_MERGE(attention_merge_bf16, __nv_bfloat16)
KV_MERGE_LSE(attention_merge_lse_fp16, __half)
KV_MERGE_LSE(attention_merge_lse_bf16, __nv_bfloat16)
