// kvcore: definitions shared by every kernel family (kvcore/kernels/csrc/*.cu).
//
// Compiled at run time by NVRTC (see python/kvcore/kernels/_nvrtc.py): there are no libc headers, so
// no <cstdint> and no INFINITY; 64-bit integers are `long long` and infinity is CUDART_INF_F.
//
// Pool addressing (python/kvcore/pool/kv_pool.py, PoolStrides): the element (layer, kv, page, kv_head,
// offset, d) is at layer*layer_stride + kv*kv_stride + page*page_stride + kv_head*head_stride
// + offset*token_stride + d. Every offset is computed in 64 bits: a 100 GiB pool overflows int32.
//
// Cache precisions (python/kvcore/pool/dtypes.py): fp16, bf16, fp8 e4m3 and int8; the quantized ones
// store x / scale with one float scale per (layer, kv head), rounded exactly as the NumPy reference does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math_constants.h>

// ------------------------------------------------------------------------------ device checks
// Compiled in with -DKV_DEVICE_CHECKS (KVCORE_DEVICE_CHECKS=1 at run time, kvcore.kernels.loader): every
// page id read from a device page table and every device slot is checked against the pool's size, set
// by the host in kv_check_limit before each launch. A bad one is not used (the access is skipped or reads
// the null page 0), and the first is recorded in kv_check_error for the host to raise after the launch.
// Global-namespace variables: their names are not mangled, so the host finds them by name.
#ifdef KV_DEVICE_CHECKS
__device__ long long kv_check_limit[2];  // pages of the pool, slots of the pool (pages * page_size)
__device__ long long kv_check_error[4];  // the first failure: (1, code, where, value); code 1 page, 2 slot
#endif

namespace kv {

typedef long long i64;

// Record a failed device check (the first one wins); a no-op without KV_DEVICE_CHECKS.
__device__ __forceinline__ void check_failed(int code, long long where, long long value) {
#ifdef KV_DEVICE_CHECKS
  if (atomicCAS(reinterpret_cast<unsigned long long*>(&kv_check_error[0]), 0ull, 1ull) == 0ull) {
    kv_check_error[1] = code;
    kv_check_error[2] = where;
    kv_check_error[3] = value;
  }
#else
  (void)code;
  (void)where;
  (void)value;
#endif
}

// A page id read from a device page table (`where`: its key index). With checks, one outside the pool is
// recorded and read as the null page 0 (always a valid page), so the access stays inside the pool.
__device__ __forceinline__ int checked_page(int page, long long where) {
#ifdef KV_DEVICE_CHECKS
  if (page < 0 || page >= kv_check_limit[0]) {
    check_failed(1, where, page);
    return 0;
  }
#else
  (void)where;
#endif
  return page;
}

// ------------------------------------------------------------------------------ cache precisions

// Each tag names the stored element type; a 16-bit one also the tensor-core input type it computes with.
struct CacheF16 {
  typedef __half storage;
  typedef __half compute;
};
struct CacheBF16 {
  typedef __nv_bfloat16 storage;
  typedef __nv_bfloat16 compute;
};
struct CacheFP8 {
  typedef unsigned char storage;
};
struct CacheI8 {
  typedef signed char storage;
};

// The tensor-core input type of (activation, cache): a 16-bit cache computes in its own type (its
// activations are of that type), an 8-bit one in the activation type. Every e4m3 and int8 value is exactly
// an fp16 and a bf16 value, so nothing is rounded on the cache side, and bf16 queries keep their range
// (|q| > 65504 would overflow fp16).
template <typename Act, typename Cache>
struct ComputeOf {
  typedef typename Cache::compute type;
};
template <typename Act>
struct ComputeOf<Act, CacheFP8> {
  typedef Act type;
};
template <typename Act>
struct ComputeOf<Act, CacheI8> {
  typedef Act type;
};

template <typename Cache>
struct is_quantized {
  static constexpr bool value = sizeof(typename Cache::storage) == 1;
};

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Two floats as one 32-bit register of the compute type (low half = a), round to nearest even.
template <typename T>
__device__ __forceinline__ unsigned pack2(float a, float b);
template <>
__device__ __forceinline__ unsigned pack2<__half>(float a, float b) {
  __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<unsigned*>(&h);
}
template <>
__device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<unsigned*>(&h);
}

// Quantize one float already divided by its scale (x / scale, IEEE division done by the caller).
__device__ __forceinline__ unsigned char quantize_fp8(float x) {
  // Round to nearest even, saturate to +-448, NaN -> 0x7F: the rule of the NumPy reference.
  return static_cast<unsigned char>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ unsigned char quantize_int8(float x) {
  int r = __float2int_rn(x);  // saturates outside the int range; then the symmetric clamp
  r = r > 127 ? 127 : (r < -127 ? -127 : r);
  return static_cast<unsigned char>(static_cast<signed char>(r));
}

template <typename Cache>
__device__ __forceinline__ unsigned char quantize(float x);
template <>
__device__ __forceinline__ unsigned char quantize<CacheFP8>(float x) {
  return quantize_fp8(x);
}
template <>
__device__ __forceinline__ unsigned char quantize<CacheI8>(float x) {
  return quantize_int8(x);
}

// Two 8-bit cache elements (low byte first, in the low 16 bits of `pair`) widened exactly to a register of
// two compute-type values C (fp16 or bf16).
template <typename Cache, typename C>
__device__ __forceinline__ unsigned widen2(unsigned pair);
template <>
__device__ __forceinline__ unsigned widen2<CacheFP8, __half>(unsigned pair) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xFFFFu), __NV_E4M3);
  return static_cast<unsigned>(h.x) | (static_cast<unsigned>(h.y) << 16);
}
template <>
__device__ __forceinline__ unsigned widen2<CacheFP8, __nv_bfloat16>(unsigned pair) {
  // e4m3 -> fp16 (one cvt) -> fp32 -> bf16: every step exact.
  const unsigned h = widen2<CacheFP8, __half>(pair);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return pack2<__nv_bfloat16>(f.x, f.y);
}
template <>
__device__ __forceinline__ unsigned widen2<CacheI8, __half>(unsigned pair) {
  // No I2F: the fp16 number with bits 0x64XX is 1024 + XX. Byte b + 128 (b ^ 0x80) goes into the low byte
  // of each half (one PRMT), and 1024 + 128 (0x6480) comes off both halves (one HSUB2): exact.
  const unsigned u = __byte_perm(pair ^ 0x8080u, 0x64646464u, 0x4140);
  const __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&u), __halves2half2(__ushort_as_half(0x6480),
                                                                                   __ushort_as_half(0x6480)));
  return *reinterpret_cast<const unsigned*>(&r);
}
template <>
__device__ __forceinline__ unsigned widen2<CacheI8, __nv_bfloat16>(unsigned pair) {
  // The fp32 number with bits 0x4B0000XX is 2^23 + XX (a PRMT and an FADD per value, no I2F).
  const unsigned x = pair ^ 0x8080u;
  const float lo = __uint_as_float(__byte_perm(x, 0x4B000000u, 0x7540)) - 8388736.0f;
  const float hi = __uint_as_float(__byte_perm(x, 0x4B000000u, 0x7541)) - 8388736.0f;
  return pack2<__nv_bfloat16>(lo, hi);
}

// ------------------------------------------------------------------------------ math and memory

__device__ __forceinline__ float fast_exp2(float x) {
  float y;  // ex2.approx: 2 ulp, exp2(-inf) = +0, which the online softmax relies on
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint4 load16(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

__device__ __forceinline__ uint2 load8(const void* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }

// A 16-byte shared-memory load the compiler may neither hoist nor merge (asm volatile): a value re-read
// every loop step instead of held in registers.
__device__ __forceinline__ uint4 lds16_volatile(const void* p) {
  uint4 v;
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

// Asynchronous global -> shared copies (cp.async, sm_80+), in commit groups: the copies a thread issued
// before a commit form one group; wait_group<N> returns once at most N of the thread's groups are still in
// flight, and the shared memory those completed groups wrote is then visible to that thread (to other
// threads only after a barrier). Every helper has a "memory" clobber, so the compiler moves no shared
// memory access across it. .cg (16 bytes) skips L1: the K/V stream is read once. Below sm_80 (no kvcore
// kernel runs there: mma.sync needs sm_80 too) they are a plain load and store, complete at once.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
#else
  *reinterpret_cast<uint4*>(smem) = load16(gmem);
#endif
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
#if __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(gmem) : "memory");
#else
  *reinterpret_cast<uint2*>(smem) = load8(gmem);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// D = A * B + D on tensor cores: m16n8k16, A row-major 16x16, B column-major 16x8, fp32 accumulators.
// Fragments (PTX ISA, "mma.m16n8k16"): with g = lane / 4 and t = lane % 4,
//   a[0] = A[g][2t..2t+1]   a[1] = A[g+8][2t..2t+1]   a[2] = A[g][2t+8..2t+9]   a[3] = A[g+8][2t+8..2t+9]
//   b0 = B[2t..2t+1][g]     b1 = B[2t+8..2t+9][g]
//   d[0..1] = D[g][2t..2t+1]  d[2..3] = D[g+8][2t..2t+1]
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1,
                                         __half /*tag*/) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1,
                                         __nv_bfloat16 /*tag*/) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace kv
