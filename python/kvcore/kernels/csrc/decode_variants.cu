// kvcore: compile-time variants of the paged attention kernel for decode, for measuring on a device which
// one should be the default. The kernel and its variants are in paged_attention.cuh ("decode
// variants": the stage protocol of the pipelined ones is written out there). A family of its own, so that
// the default module (paged_attention.cu) compiles as fast as before and is only joined by this one when a
// plan asks for a variant (python/kvcore/kernels/plan.py: plan_attention(variant=...)).
//
// Entry points paged_attention_<variant>_<act>_<cache>_d<D>, with the arguments of paged_attention_*:
//   wide            8-bit caches: 32 keys per warp step (two 16-key sub-steps), loads into registers
//   pipelined       a 2-stage cp.async ring of K/V steps per warp in dynamic shared memory
//   pipelined3      the same with 3 stages (16-bit caches at head_dim 128: 2 blocks per SM, not 3)
//   pipelined_wide  8-bit caches: 32-key steps through a 2-stage ring
// The pipelined kernels take dynamic shared memory (PipeSmem; the host computes its size,
// kvcore.kernels._nvrtc.pipeline_smem_bytes). The launcher takes them for decode plans on pages of >= 16
// keys only; prefill, bounded caches (windows, page scores) and smaller pages take the default kernel.
#include "paged_attention.cuh"

#define KV_ATTENTION_VARIANT(NAME, ACT, CACHE, D, SUB, STAGES)                                                \
  extern "C" __global__ void __launch_bounds__(kv::kThreads, kv::kMinBlocks)                                  \
      NAME(KV_ATTENTION_PARAMS(ACT, CACHE)) {                                                                 \
    kv::paged_attention_variant<ACT, CACHE, D, SUB, STAGES>(page_shift, KV_ATTENTION_ARGS);                   \
  }

#define KV_VARIANT_DIMS(VARIANT, ACTN, ACT, CACHEN, CACHE, SUB, STAGES)                                       \
  KV_ATTENTION_VARIANT(paged_attention_##VARIANT##_##ACTN##_##CACHEN##_d64, ACT, CACHE, 64, SUB, STAGES)      \
  KV_ATTENTION_VARIANT(paged_attention_##VARIANT##_##ACTN##_##CACHEN##_d128, ACT, CACHE, 128, SUB, STAGES)

// Every (activation, cache) of paged_attention.cu, for a variant that applies to every cache.
#define KV_VARIANT_ALL(VARIANT, SUB, STAGES)                                                                  \
  KV_VARIANT_DIMS(VARIANT, fp16, __half, fp16, kv::CacheF16, SUB, STAGES)                                     \
  KV_VARIANT_DIMS(VARIANT, bf16, __nv_bfloat16, bf16, kv::CacheBF16, SUB, STAGES)                             \
  KV_VARIANT_8BIT(VARIANT, SUB, STAGES)

// The (activation, 8-bit cache) pairs, for a variant of 8-bit caches only.
#define KV_VARIANT_8BIT(VARIANT, SUB, STAGES)                                                                 \
  KV_VARIANT_DIMS(VARIANT, fp16, __half, fp8, kv::CacheFP8, SUB, STAGES)                                      \
  KV_VARIANT_DIMS(VARIANT, bf16, __nv_bfloat16, fp8, kv::CacheFP8, SUB, STAGES)                               \
  KV_VARIANT_DIMS(VARIANT, fp16, __half, int8, kv::CacheI8, SUB, STAGES)                                      \
  KV_VARIANT_DIMS(VARIANT, bf16, __nv_bfloat16, int8, kv::CacheI8, SUB, STAGES)

KV_VARIANT_8BIT(wide, 2, 0)
KV_VARIANT_ALL(pipelined, 1, 2)
KV_VARIANT_ALL(pipelined3, 1, 3)
KV_VARIANT_8BIT(pipelined_wide, 2, 2)
