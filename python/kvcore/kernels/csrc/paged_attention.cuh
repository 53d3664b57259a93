// kvcore: paged attention over FlashInfer CSR page tables, decode and prefill in one kernel, with
// split-K and an LSE merge. NumPy reference: python/kvcore/kernels/reference.py::attention.
//
// Work partition (python/kvcore/kernels/plan.py, made on the host once per step):
//   rows: a sequence with q_len query tokens has q_len * G rows per kv head (G = query heads per kv
//     head); row r is query token r / G and query head kv_head * G + r % G. 16 rows form a tile: the
//     M dimension of one mma.sync m16n8k16. Decode (q_len = 1) is one tile holding the G heads, so every
//     K/V byte is read from memory once for all the query heads of its kv head (GQA).
//   items [num_items, 5] int32: (seq, row_tile, kv_begin, kv_end, partial). One thread block per
//     (item, kv head). partial = -1: the block writes the final output; otherwise it writes a normalized
//     fp32 partial output and its base-2 log-sum-exp, and attention_merge combines the splits.
//   causality: query token i of a sequence with kv_len keys sits at position kv_len - q_len + i and sees
//     keys j <= kv_len - q_len + i.
//   bounded caches (the paged_attention_bounded_* entry points; the plain ones are compiled without any of
//     it): kv_first[token] is the first key a query token sees under a sliding window (the host turns the
//     window and any position map into it), keys on the null page 0 are masked and their V rows zeroed
//     (the null page may hold anything), and lse_out receives every row's final base-2 log-sum-exp for page_scores (split rows get
//     theirs from attention_merge_lse). page_scores then recomputes q . k per visible key and adds
//     2^(s - lse), summed over the rows, to the key's page-table entry.
//
// Block: 4 warps. Warp w takes the 16-key steps kv_begin + 16 * (w + 4k) with its own online softmax
// (m, l, O in registers, exp2 domain); the 4 states are merged through shared memory at the end.
//
// Per 16-key step, a warp computes S[16 rows][16 keys] = Q K^T with D/16 x 2 mma (keys as the N
// dimension, two blocks of 8), then O[16][D] += P V with D/8 mma (keys as the K dimension). The dot
// product over head_dim does not care about the order of its terms, so every lane loads 16 contiguous
// bytes of a key row and the Q fragments use the same permutation of d (see q_dim below); for P V each
// lane owns D/8 elements of the output, in runs of one load each (out_dim below). All loads are 16-byte
// vector loads (8 bytes for fp8/int8 V at head_dim 64). With pages of 16 keys or more a step's keys share
// one page, whose id is looked up once per step; smaller pages look up each key's page id.
#pragma once

#include "common.cuh"

// The parameters every attention entry point starts with (paged_attention.cu, decode_variants.cu), and
// the same names as arguments, in the order the kernel templates take them after their own leading ones.
#define KV_ATTENTION_PARAMS(ACT, CACHE)                                                                     \
  const ACT* __restrict__ q, long long q_token_stride, long long q_head_stride,                            \
      const CACHE::storage* __restrict__ pool, long long kv_stride, long long page_stride,                 \
      long long head_stride, long long token_stride, const float* __restrict__ k_scale,                    \
      const float* __restrict__ v_scale, const int* __restrict__ kv_indptr,                                \
      const int* __restrict__ kv_indices, const int* __restrict__ kv_len, const int* __restrict__ q_indptr, \
      const int* __restrict__ items, ACT* __restrict__ out, float* __restrict__ o_part,                    \
      float* __restrict__ lse_part, float sm_scale, int group_size, int num_kv_heads, int page_shift
#define KV_ATTENTION_ARGS                                                                                  \
  q, q_token_stride, q_head_stride, pool, kv_stride, page_stride, head_stride, token_stride, k_scale,      \
      v_scale, kv_indptr, kv_indices, kv_len, q_indptr, items, out, o_part, lse_part, sm_scale, group_size, \
      num_kv_heads

namespace kv {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
// Attention blocks resident per SM the kernels are built for: 3 x 128 threads of at most 168 registers
// (65536 per SM). CI fails if bf16 head_dim 128 needs more or spills (tests/python/test_kernels_compile.py).
constexpr int kMinBlocks = 3;
constexpr int kRows = 16;   // rows per tile
constexpr int kStep = 16;   // keys per warp step

template <typename Cache, int D>
struct AttnShape {
  typedef typename Cache::storage S;
  static constexpr int kVec = 16 / sizeof(S);        // cache elements per 16-byte load: 8 or 16
  static constexpr int kKLoads = D / (4 * kVec);     // 16-byte loads per key row per lane
  static constexpr int kKBlocks = D / 16;            // mma k-blocks over head_dim (Q K^T)
  static constexpr int kOutCols = D / 8;             // output columns per lane = P V mma count
  static constexpr int kVWords = kOutCols * sizeof(S) / 4;  // 32-bit words of V per key per lane
  // V elements per load (16 bytes, 8 for 8-bit D = 64). Lane group n's columns are kOutCols / kVElems
  // runs of kVElems, one per load, the 8 groups' runs side by side: one load instruction reads whole
  // contiguous sectors of a V row (16-bit D = 128: 128 bytes, not the halves of 8 sectors).
  static constexpr int kVElems = 16 / sizeof(S) < kOutCols ? 16 / sizeof(S) : kOutCols;
  static_assert(D % 64 == 0, "head_dim must be a multiple of 64");
};

// The head_dim index of element e (0..3) of Q K^T k-block kb for lane quad position t: the same
// permutation as the key loads (lane t of a quad loads elements [s*4*kVec + t*kVec, +kVec) of its row).
template <int kVec>
__device__ __forceinline__ int q_dim(int kb, int t, int e) {
  const int per_load = kVec / 4;  // k-blocks fed by one 16-byte load
  const int s = kb / per_load;
  const int j = kb - s * per_load;
  return s * 4 * kVec + t * kVec + 4 * j + e;
}

// The head_dim index of output column n (mma column, 0..7) of P V mma number j (see AttnShape::kVElems).
template <int kVElems>
__device__ __forceinline__ int out_dim(int n, int j) {
  return (j / kVElems) * (8 * kVElems) + n * kVElems + j % kVElems;
}

// Compute-type pair number `idx` of a 16-byte load of cache elements.
template <typename Cache, typename C>
__device__ __forceinline__ unsigned k_pair(const uint4& raw, int idx) {
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (sizeof(typename Cache::storage) == 2) {
    return w[idx];
  } else {
    return widen2<Cache, C>(w[idx >> 1] >> ((idx & 1) * 16));
  }
}

// B fragment of P V mma j: V[key a][j] and V[key b][j] (a = 2t or 2t+8, b = a+1) as one compute pair.
template <typename Cache, typename C, int NW>
__device__ __forceinline__ unsigned v_pair(const unsigned (&va)[NW], const unsigned (&vb)[NW], int j) {
  if constexpr (sizeof(typename Cache::storage) == 2) {
    return __byte_perm(va[j >> 1], vb[j >> 1], (j & 1) ? 0x7632 : 0x5410);
  } else {
    const unsigned byte = j & 3;
    return widen2<Cache, C>(__byte_perm(va[j >> 2], vb[j >> 2], byte | ((4 + byte) << 4)));
  }
}

// The 4 warps' softmax states, merged at the end (one per block, whichever path the block takes).
template <int D>
struct AttnSmem {
  float o[kWarps][kRows][D + 1];  // +1: fewer bank conflicts on the column-strided stores
  float m[kWarps][kRows];
  float l[kWarps][kRows];
  uint4 q[D / 16][32];  // the Q fragments of the tile, per k-block and lane
};
template <int D>
__device__ __forceinline__ AttnSmem<D>& attn_smem() {
  __shared__ AttnSmem<D> smem;
  return smem;
}

// ------------------------------------------------------------------------------ decode variants
// Compile-time variants of the decode loop (entry points in decode_variants.cu; the launcher picks one from
// the plan's `variant`, python/kvcore/kernels/plan.py). The default kernel is kSub = 1, kStages = 0.
//   kSub = 2 ("wide"): a warp step is 32 keys, two 16-key sub-steps with a page-id lookup each. For 8-bit
//     caches: the bytes per step (and in flight) of a 16-bit cache, and the per-step softmax work (quad
//     shuffles, the rescale test, the loop) spread over twice the keys.
//   kStages = 2 or 3 ("pipelined"): a step's K/V go global -> shared memory through a cp.async ring of
//     kStages steps per warp, so kStages - 1 steps are in flight while one is computed, and the bytes in
//     flight no longer sit in registers.
// Both run only on the one-page path (pages of >= 16 keys) of unbounded caches, and the launcher takes them
// for decode plans only (prefill, windows, page scores, smaller pages: the default kernel).
//
// The stage protocol (pipelined). Every warp owns its ring, and every lane copies, and later reads back,
// exactly the 16-byte pieces it would have loaded into registers (slot-major, lane-minor: 512 contiguous
// bytes per slot, conflict-free), so no lane reads another's bytes and the loop needs no barrier:
//   prologue: steps 0 .. kStages-2 are copied into stages 0 .. kStages-2, one commit group each;
//   iteration i: copy step i + kStages - 1 into stage (i + kStages - 1) % kStages, i.e. the stage read
//     in iteration i - 1, and commit; cp.async.wait_group(kStages - 1) then leaves at most kStages - 1 of
//     the lane's groups in flight, so the group of step i (committed kStages - 1 groups earlier) is done
//     and its shared memory visible to the lane; read stage i % kStages and compute.
//   A step past kv_end is not copied but its (empty) group is still committed, so the count stays exact.
//   WAR: stage (i - 1) % kStages is refilled only after iteration i - 1's mma consumed the values the lane
//     read from it (same thread, program order; the copy helpers' "memory" clobbers keep the compiler
//     from moving the shared reads across them).
//   epilogue: wait_group(0) (only empty groups can be pending), then __syncthreads before the warps'
//     O states are written over the rings (PipeSmem::o aliases them, across warps).
// The tail is the default kernel's: a step's rows past kv_end are inside its page (masked keys; V reads
// the last key's row instead, finite), and a second sub-step wholly past kv_end is given the first's rows
// (see step_rows), so no page id past the sequence is looked up.
template <typename Cache, int D, int kSub>
struct StepShape {
  typedef AttnShape<Cache, D> Shape;
  static constexpr int kVLoads = Shape::kVWords >= 4 ? Shape::kVWords / 4 : 1;  // per V row (8 B: 1)
  static constexpr int kSubSlots = 2 * Shape::kKLoads + 4 * kVLoads;  // 16-byte slots per lane per sub-step
  static constexpr int kSlots = kSub * kSubSlots;
  // Offsets in a lane's ring stage (uint4 units; lanes interleave, so 32 per slot): K load i of n-block
  // nb, and V row r, of sub-step s. One layout for the copy (copy_step) and the read back.
  static __device__ __forceinline__ constexpr int k_slot(int s, int nb, int i) {
    return 32 * (s * kSubSlots + nb * Shape::kKLoads + i);
  }
  static __device__ __forceinline__ constexpr int v_slot(int s, int r) {
    return 32 * (s * kSubSlots + 2 * Shape::kKLoads + r * kVLoads);
  }
};

// Dynamic shared memory of a pipelined kernel (python/kvcore/kernels/_nvrtc.py: pipeline_smem_bytes, checked
// against sizeof by tests/python/test_kernels_compile.py): over 48 KiB, so not static.
template <typename Cache, int D, int kSub, int kStages>
struct PipeSmem {
  uint4 q[D / 16][32];
  float m[kWarps][kRows];
  float l[kWarps][kRows];
  union {
    uint4 ring[kWarps][kStages][StepShape<Cache, D, kSub>::kSlots][32];  // [warp][stage][slot][lane]
    float o[kWarps][kRows][D + 1];  // after the loop (and a barrier)
  };
};

template <typename Cache, int D, int kSub, int kStages>
struct SmemOf {
  typedef PipeSmem<Cache, D, kSub, kStages> type;
  static __device__ __forceinline__ type& get() {
    extern __shared__ uint4 kv_dynamic_smem[];
    return *reinterpret_cast<type*>(kv_dynamic_smem);
  }
};
template <typename Cache, int D, int kSub>
struct SmemOf<Cache, D, kSub, 0> {
  typedef AttnSmem<D> type;
  static __device__ __forceinline__ type& get() { return attn_smem<D>(); }
};

// The rows one lane reads in the warp step at key0 of a variant (one-page path), at its first element:
// K rows key0 + 16s + 8nb + g, V rows key0 + 16s + {2t, 2t+1, 2t+8, 2t+9} (past kv_end the last key's
// row, as in the default kernel). A sub-step wholly past kv_end takes the rows of the one before (its
// keys are all masked; its V rows are that sub-step's last key's), so it needs no page id.
template <typename Cache, int D, int kSub>
struct StepRows {
  typedef typename Cache::storage S;
  const S* k[kSub][2];
  const S* v[kSub][4];
};
template <typename Cache, int D, int kSub>
__device__ __forceinline__ void step_rows(StepRows<Cache, D, kSub>& rows, const typename Cache::storage* k_base,
                                          i64 kv_stride, i64 page_stride, i64 token_stride, int page_mask,
                                          const int (&page)[kSub], int key0, int kv_end, const int (&k_off)[2],
                                          const int (&v_off)[4], int g, int t) {
  typedef typename Cache::storage S;
  const S* base = k_base;
  int origin = key0;
#pragma unroll
  for (int s = 0; s < kSub; ++s) {
    const int ks = key0 + kStep * s;
    if (s == 0 || ks < kv_end) {
      base = k_base + static_cast<i64>(page[s]) * page_stride + static_cast<i64>(ks & page_mask) * token_stride;
      origin = ks;
    }
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) rows.k[s][nb] = base + k_off[nb];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int key = ks + 2 * t + (r & 1) + 8 * (r >> 1);
      const int off = key < kv_end ? v_off[r]
                                   : (kv_end - 1 - origin) * static_cast<int>(token_stride) +
                                         g * AttnShape<Cache, D>::kVElems;
      rows.v[s][r] = base + kv_stride + off;
    }
  }
}

// The page ids of the kSub sub-steps of the warp step at key0 (0 for a sub-step at or past kv_end: not
// looked up, not used).
template <int kSub>
__device__ __forceinline__ void step_pages(int (&page)[kSub], const int* pages, int key0, int kv_end,
                                           int page_shift) {
#pragma unroll
  for (int s = 0; s < kSub; ++s) {
    const int ks = key0 + kStep * s;
    page[s] = ks < kv_end ? checked_page(pages[ks >> page_shift], ks) : 0;
  }
}

// pipelined: this lane's cp.async copies of the warp step at key0 into ring stage `stage` (no commit).
template <typename Cache, int D, int kSub, int kStages>
__device__ __forceinline__ void copy_step(PipeSmem<Cache, D, kSub, kStages>& smem, int warp, int stage, int lane,
                                          const typename Cache::storage* k_base, i64 kv_stride, i64 page_stride,
                                          i64 token_stride, int page_mask, const int (&page)[kSub], int key0,
                                          int kv_end, const int (&k_off)[2], const int (&v_off)[4], int g, int t) {
  typedef AttnShape<Cache, D> Shape;
  typedef StepShape<Cache, D, kSub> Step;
  constexpr int kVec = Shape::kVec;
  StepRows<Cache, D, kSub> rows;
  step_rows<Cache, D, kSub>(rows, k_base, kv_stride, page_stride, token_stride, page_mask, page, key0, kv_end,
                            k_off, v_off, g, t);
  uint4* slot = &smem.ring[warp][stage][0][lane];
#pragma unroll
  for (int s = 0; s < kSub; ++s) {
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
      for (int i = 0; i < Shape::kKLoads; ++i) {
        cp_async16(slot + Step::k_slot(s, nb, i), rows.k[s][nb] + i * 4 * kVec);
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      uint4* vs = slot + Step::v_slot(s, r);
      if constexpr (Shape::kVWords >= 4) {
#pragma unroll
        for (int w = 0; w < Step::kVLoads; ++w) cp_async16(vs + 32 * w, rows.v[s][r] + w * 8 * Shape::kVElems);
      } else {
        cp_async8(vs, rows.v[s][r]);
      }
    }
  }
}

// kOnePage (page size >= 16): a step's 16 keys lie in one page, found with one page-id lookup.
// kSub, kStages: the decode variants (see StepShape); 1 and 0 are the default kernel.
template <typename Act, typename Cache, int D, bool kBounded, bool kOnePage, int kSub = 1, int kStages = 0>
__device__ __forceinline__ void paged_attention_impl(
    const Act* __restrict__ q,                          // [num_q_tokens, num_qo_heads, D] (strided rows)
    i64 q_token_stride, i64 q_head_stride,              // elements
    const typename Cache::storage* __restrict__ pool,   // this layer's K plane; V is at + kv_stride
    i64 kv_stride, i64 page_stride, i64 head_stride, i64 token_stride,  // elements (PoolStrides)
    const float* __restrict__ k_scale,                  // [num_kv_heads] this layer's K scales
    const float* __restrict__ v_scale,                  // [num_kv_heads] this layer's V scales
    const int* __restrict__ kv_indptr,                  // [batch + 1] int32
    const int* __restrict__ kv_indices,                 // [kv_indptr[batch]] int32 page ids
    const int* __restrict__ kv_len,                     // [batch] int32 keys per sequence
    const int* __restrict__ q_indptr,                   // [batch + 1] int32
    const int* __restrict__ items,                      // [num_items, 5] int32 (see the header)
    Act* __restrict__ out,                              // [num_q_tokens, num_qo_heads, D] contiguous
    float* __restrict__ o_part,                         // [num_partials, num_kv_heads, 16, D] fp32
    float* __restrict__ lse_part,                       // [num_partials, num_kv_heads, 16] fp32, base 2
    float sm_scale, int group_size, int num_kv_heads, int page_shift,
    const int* __restrict__ kv_first = nullptr,  // kBounded: [num_q_tokens] int32 first key seen, or null (0)
    float* __restrict__ lse_out = nullptr) {     // kBounded: [num_q_tokens, num_qo_heads] fp32 base 2, or null
  typedef AttnShape<Cache, D> Shape;
  typedef typename Cache::storage S;
  typedef typename ComputeOf<Act, Cache>::type C;
  constexpr int kVec = Shape::kVec;

  static_assert(kSub == 1 || kSub == 2, "a warp step is 1 or 2 sub-steps of 16 keys");
  static_assert(kStages == 0 || kStages == 2 || kStages == 3, "a ring of 2 or 3 stages");
  constexpr bool kVariant = kSub != 1 || kStages != 0;
  static_assert(!kVariant || (kOnePage && !kBounded), "the variants run the one-page path, unbounded");
  typedef StepShape<Cache, D, kSub> Step;
  constexpr int kKeys = kStep * kSub;  // keys per warp step

  auto& smem = SmemOf<Cache, D, kSub, kStages>::get();
  float(&s_o)[kWarps][kRows][D + 1] = smem.o;
  float(&s_m)[kWarps][kRows] = smem.m;
  float(&s_l)[kWarps][kRows] = smem.l;

  const int* item = items + 5 * blockIdx.x;
  const int seq = item[0], tile = item[1], kv_begin = item[2], kv_end = item[3], partial = item[4];
  const int kv_head = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int G = group_size;
  const int q_begin = q_indptr[seq];
  const int q_len = q_indptr[seq + 1] - q_begin;
  const int rows = q_len * G;
  const int ctx = kv_len[seq] - q_len;

  // This lane's two rows (g and g + 8 of the tile) and the last key each may see (-1: padding row).
  int row_id[2], limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_id[h] = tile * kRows + g + 8 * h;
    limit[h] = row_id[h] < rows ? ctx + row_id[h] / G : -1;
  }
  [[maybe_unused]] int first[2];  // kBounded: the first key each row sees (its window's start)
  if constexpr (kBounded) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      first[h] = limit[h] >= 0 && kv_first != nullptr ? kv_first[q_begin + row_id[h] / G] : 0;
    }
  }

  // Q fragments (C is Act: see ComputeOf): qf[kb] = {row0 d..d+1, row1 d..d+1, row0 d+2..d+3, row1 d+2..d+3}
  // with d = q_dim(kb, t, 0). Lane t's elements of one 16-byte key load are kVec contiguous dims, so its Q
  // fragments are kVec / 8 16-byte loads per row (the host passes 16-byte aligned rows). Warp 0 loads
  // them once into shared memory, and every step reads them back (ld.shared, volatile so that they are
  // not hoisted into registers: 32 registers that the K and V loads in flight need more).
  static_assert(sizeof(Act) == 2, "activations are 16-bit");
  uint4(&s_q)[Shape::kKBlocks][32] = smem.q;
  if (warp == 0) {
    unsigned qf[Shape::kKBlocks][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool valid = limit[h] >= 0;
      const Act* qrow = q + (valid ? (q_begin + row_id[h] / G) * q_token_stride +
                                         (kv_head * G + row_id[h] % G) * q_head_stride
                                   : 0);
#pragma unroll
      for (int s = 0; s < Shape::kKLoads; ++s) {
        unsigned words[kVec / 2];
#pragma unroll
        for (int v = 0; v < kVec / 8; ++v) {
          const uint4 x = valid ? load16(qrow + s * 4 * kVec + t * kVec + 8 * v) : make_uint4(0, 0, 0, 0);
          words[4 * v] = x.x;
          words[4 * v + 1] = x.y;
          words[4 * v + 2] = x.z;
          words[4 * v + 3] = x.w;
        }
#pragma unroll
        for (int j = 0; j < kVec / 4; ++j) {
          qf[s * (kVec / 4) + j][h] = words[2 * j];
          qf[s * (kVec / 4) + j][h + 2] = words[2 * j + 1];
        }
      }
    }
#pragma unroll
    for (int kb = 0; kb < Shape::kKBlocks; ++kb) {
      s_q[kb][lane] = make_uint4(qf[kb][0], qf[kb][1], qf[kb][2], qf[kb][3]);
    }
  }
  __syncthreads();

  const S* k_base = pool + kv_head * head_stride;
  const S* v_base = k_base + kv_stride;
  const int* pages = kv_indices + kv_indptr[seq];
  const int page_mask = (1 << page_shift) - 1;
  // Scores in the exp2 domain; the K scale of a quantized pool folds into the softmax scale.
  const float score_scale = sm_scale * k_scale[kv_head] * 1.4426950408889634f;

  float m[2] = {-CUDART_INF_F, -CUDART_INF_F};
  float l[2] = {0.f, 0.f};  // this lane's partial row sums (reduced over the quad at the end)
  float o[Shape::kOutCols][4];
#pragma unroll
  for (int j = 0; j < Shape::kOutCols; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

  // Page size >= 16: a step's 16 keys lie in one page (steps start at multiples of 16: the plan aligns
  // kv_begin), so each step looks up one page id, prefetched a step ahead, and every lane adds its fixed
  // row offsets (k_off, v_off: 32-bit, the host checks 16 * token_stride fits). Smaller pages look up
  // the page of every key.
  constexpr bool one_page = kOnePage;
  int k_off[2], v_off[4];
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) k_off[nb] = (8 * nb + g) * static_cast<int>(token_stride) + t * kVec;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    v_off[r] = (2 * t + (r & 1) + 8 * (r >> 1)) * static_cast<int>(token_stride) + g * Shape::kVElems;
  }
  const int key_start = kv_begin + kKeys * warp;
  int page_next = 0;
  if (!kVariant && one_page && key_start < kv_end) {
    page_next = checked_page(pages[key_start >> page_shift], key_start);
  }
  // Variants: the page ids of the next step to load (wide) or copy (pipelined); the next step to copy and
  // the ring stage of the step computed now (pipelined: see "The stage protocol").
  [[maybe_unused]] int var_page[kSub];
  [[maybe_unused]] int copy_key = key_start;
  [[maybe_unused]] int stage = 0;
  if constexpr (kVariant) step_pages<kSub>(var_page, pages, key_start, kv_end, page_shift);
  if constexpr (kStages > 0) {
#pragma unroll
    for (int p = 0; p < kStages - 1; ++p) {
      if (copy_key < kv_end) {
        copy_step<Cache, D, kSub, kStages>(smem, warp, p, lane, k_base, kv_stride, page_stride, token_stride,
                                           page_mask, var_page, copy_key, kv_end, k_off, v_off, g, t);
      }
      cp_async_commit();
      copy_key += kKeys * kWarps;
      step_pages<kSub>(var_page, pages, copy_key, kv_end, page_shift);
    }
  }

  for (int key0 = key_start; key0 < kv_end; key0 += kKeys * kWarps) {
    // ---- loads: K rows key0 + 8 * nb + g, V rows key0 + {2t, 2t+1, 2t+8, 2t+9}; zero past kv_end.
    uint4 k_raw[kSub][2][Shape::kKLoads];
    unsigned v_raw[kSub][4][Shape::kVWords];
    [[maybe_unused]] bool null_key[4];  // kBounded: V key r lies on the null page (masked, V zeroed)
    if constexpr (!kVariant) {
      const int step_page = page_next;
      const int key_next = key0 + kStep * kWarps;
      if (one_page && key_next < kv_end) page_next = checked_page(pages[key_next >> page_shift], key_next);
      // A whole step on the null page (bounded caches: pages that left the window) is all masked: it would
      // leave the softmax state as it is, so it is skipped.
      if constexpr (kBounded && kOnePage) {
        if (step_page == 0) continue;
      }
      // One page: its rows key0 .. key0 + 15 are all inside it, so even the rows past kv_end can be read
      // (their scores are masked; V reads the last key's row instead, see below).
      const S* step_base = one_page ? k_base + static_cast<i64>(step_page) * page_stride +
                                          static_cast<i64>(key0 & page_mask) * token_stride
                                    : nullptr;
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        const int key = key0 + 8 * nb + g;
        const S* row = nullptr;
        if (one_page) {
          row = step_base + k_off[nb];
        } else if (key < kv_end) {
          row = k_base + static_cast<i64>(checked_page(pages[key >> page_shift], key)) * page_stride +
                static_cast<i64>(key & page_mask) * token_stride + t * kVec;
        }
        if (one_page || row != nullptr) {
#pragma unroll
          for (int s = 0; s < Shape::kKLoads; ++s) k_raw[0][nb][s] = load16(row + s * 4 * kVec);
        } else {
#pragma unroll
          for (int s = 0; s < Shape::kKLoads; ++s) k_raw[0][nb][s] = make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int key = key0 + 2 * t + (r & 1) + 8 * (r >> 1);
        const S* row = nullptr;
        int page = step_page;
        if (one_page) {
          // Past kv_end (a sequence's last step), read the row of the last key instead: a finite row (it was
          // computed) times P = 0 adds exactly 0, where a stale row could hold NaN (0 * NaN is NaN).
          const int off = key < kv_end ? v_off[r]
                                       : (kv_end - 1 - key0) * static_cast<int>(token_stride) + g * Shape::kVElems;
          row = step_base + kv_stride + off;
        } else if (key < kv_end) {
          page = checked_page(pages[key >> page_shift], key);
          row = v_base + static_cast<i64>(page) * page_stride + static_cast<i64>(key & page_mask) * token_stride +
                g * Shape::kVElems;
        }
        if constexpr (kBounded) null_key[r] = false;
        if (one_page || row != nullptr) {
          if constexpr (Shape::kVWords >= 4) {
#pragma unroll
            for (int w = 0; w < Shape::kVWords; w += 4) {
              const uint4 x = load16(row + (w / 4) * 8 * Shape::kVElems);
              v_raw[0][r][w] = x.x;
              v_raw[0][r][w + 1] = x.y;
              v_raw[0][r][w + 2] = x.z;
              v_raw[0][r][w + 3] = x.w;
            }
          } else {
            const uint2 x = load8(row);
            v_raw[0][r][0] = x.x;
            v_raw[0][r][1] = x.y;
          }
          // The null page is a real page of the pool (the load is safe), but whatever it holds must not reach
          // O: a masked key's P is 0, and 0 * NaN would still be NaN in the P V product.
          if constexpr (kBounded) null_key[r] = page == 0;
        } else {
#pragma unroll
          for (int w = 0; w < Shape::kVWords; ++w) v_raw[0][r][w] = 0u;
        }
      }
      // Rows on the null page: zero (with one page, a null step was skipped above).
      if constexpr (kBounded && !kOnePage) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          if (null_key[r]) {
#pragma unroll
            for (int w = 0; w < Shape::kVWords; ++w) v_raw[0][r][w] = 0u;
          }
        }
      }
    } else if constexpr (kStages == 0) {
      // wide: the step's rows straight into registers, as the default kernel (one-page path) loads them.
      StepRows<Cache, D, kSub> rows;
      step_rows<Cache, D, kSub>(rows, k_base, kv_stride, page_stride, token_stride, page_mask, var_page, key0,
                                kv_end, k_off, v_off, g, t);
      step_pages<kSub>(var_page, pages, key0 + kKeys * kWarps, kv_end, page_shift);  // the next step's
#pragma unroll
      for (int s = 0; s < kSub; ++s) {
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
          for (int i = 0; i < Shape::kKLoads; ++i) k_raw[s][nb][i] = load16(rows.k[s][nb] + i * 4 * kVec);
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          if constexpr (Shape::kVWords >= 4) {
#pragma unroll
            for (int w = 0; w < Shape::kVWords; w += 4) {
              const uint4 x = load16(rows.v[s][r] + (w / 4) * 8 * Shape::kVElems);
              v_raw[s][r][w] = x.x;
              v_raw[s][r][w + 1] = x.y;
              v_raw[s][r][w + 2] = x.z;
              v_raw[s][r][w + 3] = x.w;
            }
          } else {
            const uint2 x = load8(rows.v[s][r]);
            v_raw[s][r][0] = x.x;
            v_raw[s][r][1] = x.y;
          }
        }
      }
    } else {
      // pipelined: copy the step kStages - 1 ahead into the stage read last iteration, then wait for this
      // step's group and read this lane's pieces back (see "The stage protocol").
      const int copy_stage = stage == 0 ? kStages - 1 : stage - 1;
      if (copy_key < kv_end) {
        copy_step<Cache, D, kSub, kStages>(smem, warp, copy_stage, lane, k_base, kv_stride, page_stride,
                                           token_stride, page_mask, var_page, copy_key, kv_end, k_off, v_off, g,
                                           t);
      }
      cp_async_commit();
      copy_key += kKeys * kWarps;
      step_pages<kSub>(var_page, pages, copy_key, kv_end, page_shift);
      cp_async_wait<kStages - 1>();
      const uint4* slot = &smem.ring[warp][stage][0][lane];
#pragma unroll
      for (int s = 0; s < kSub; ++s) {
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
          for (int i = 0; i < Shape::kKLoads; ++i) {
            k_raw[s][nb][i] = slot[Step::k_slot(s, nb, i)];
          }
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const uint4* vs = slot + Step::v_slot(s, r);
          if constexpr (Shape::kVWords >= 4) {
#pragma unroll
            for (int w = 0; w < Shape::kVWords; w += 4) {
              const uint4 x = vs[32 * (w / 4)];
              v_raw[s][r][w] = x.x;
              v_raw[s][r][w + 1] = x.y;
              v_raw[s][r][w + 2] = x.z;
              v_raw[s][r][w + 3] = x.w;
            }
          } else {
            const uint2 x = *reinterpret_cast<const uint2*>(vs);
            v_raw[s][r][0] = x.x;
            v_raw[s][r][1] = x.y;
          }
        }
      }
      stage = stage + 1 == kStages ? 0 : stage + 1;
    }


    // ---- S = Q K^T for keys key0 .. key0 + kKeys - 1 (n-blocks of 8 keys; nb / 2 is the sub-step).
    constexpr int kNBlocks = 2 * kSub;
    float s_acc[kNBlocks][4];
#pragma unroll
    for (int nb = 0; nb < kNBlocks; ++nb) s_acc[nb][0] = s_acc[nb][1] = s_acc[nb][2] = s_acc[nb][3] = 0.f;
#pragma unroll
    for (int kb = 0; kb < Shape::kKBlocks; ++kb) {
      const uint4 qv = lds16_volatile(&s_q[kb][lane]);
      const unsigned qa[4] = {qv.x, qv.y, qv.z, qv.w};
      const int s = kb / (kVec / 4), j = kb - s * (kVec / 4);
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb) {
        const uint4& kr = k_raw[nb >> 1][nb & 1][s];
        mma16816(s_acc[nb], qa, k_pair<Cache, C>(kr, 2 * j), k_pair<Cache, C>(kr, 2 * j + 1), C());
      }
    }

    // ---- mask, online softmax (per row: lanes of a quad share a row, so reduce over the quad).
    float p[kNBlocks][4];
    float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
    for (int nb = 0; nb < kNBlocks; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + 8 * nb + 2 * t + (e & 1);
        const int h = e >> 1;
        bool visible = key < kv_end && key <= limit[h];
        if constexpr (kBounded) visible = visible && key >= first[h] && !null_key[(e & 1) + 2 * nb];
        p[nb][e] = visible ? s_acc[nb][e] * score_scale : -CUDART_INF_F;
        row_max[h] = fmaxf(row_max[h], p[nb][e]);
      }
    }
    float corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(0xffffffffu, row_max[h], 1));
      row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(0xffffffffu, row_max[h], 2));
      const float m_new = fmaxf(m[h], row_max[h]);
      const float m_use = m_new == -CUDART_INF_F ? 0.f : m_new;  // a row with nothing visible yet
      // Exactly 1 when the maximum did not move (padding rows included: their O and l stay 0).
      corr[h] = m_new == m[h] ? 1.f : fast_exp2(m[h] - m_use);
      m[h] = m_new;
      row_max[h] = m_use;
    }
#pragma unroll
    for (int nb = 0; nb < kNBlocks; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        p[nb][e] = fast_exp2(p[nb][e] - row_max[h]);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[h] * corr[h];  // then the keys in order: the default kernel's rounding
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb) sum = sum + p[nb][2 * h] + p[nb][2 * h + 1];
      l[h] = sum;
    }
    // Rescale O only when a row's maximum moved somewhere in the warp (corr = 1 otherwise): after the
    // first steps of a long context it rarely does, and this is 64 multiplies per step at D = 128.
    if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
      for (int j = 0; j < Shape::kOutCols; ++j) {
        o[j][0] *= corr[0];
        o[j][1] *= corr[0];
        o[j][2] *= corr[1];
        o[j][3] *= corr[1];
      }
    }

    // ---- O += P V: P (16 rows x 16 keys of a sub-step) is already laid out as the A fragment.
#pragma unroll
    for (int s = 0; s < kSub; ++s) {
      const unsigned pa[4] = {pack2<C>(p[2 * s][0], p[2 * s][1]), pack2<C>(p[2 * s][2], p[2 * s][3]),
                              pack2<C>(p[2 * s + 1][0], p[2 * s + 1][1]), pack2<C>(p[2 * s + 1][2], p[2 * s + 1][3])};
#pragma unroll
      for (int j = 0; j < Shape::kOutCols; ++j) {
        mma16816(o[j], pa, v_pair<Cache, C>(v_raw[s][0], v_raw[s][1], j),
                 v_pair<Cache, C>(v_raw[s][2], v_raw[s][3], j), C());
      }
    }
  }
  if constexpr (kStages > 0) {
    cp_async_wait<0>();  // only empty groups can be left (every copied step was computed)
    __syncthreads();     // s_o aliases the rings: every warp is done reading its own
  }

  // ---- merge the 4 warps' states through shared memory.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  if (t == 0) {
    s_m[warp][g] = m[0];
    s_m[warp][g + 8] = m[1];
    s_l[warp][g] = l[0];
    s_l[warp][g + 8] = l[1];
  }
#pragma unroll
  for (int j = 0; j < Shape::kOutCols; ++j) {
    const int d0 = out_dim<Shape::kVElems>(2 * t, j), d1 = out_dim<Shape::kVElems>(2 * t + 1, j);
    s_o[warp][g][d0] = o[j][0];
    s_o[warp][g][d1] = o[j][1];
    s_o[warp][g + 8][d0] = o[j][2];
    s_o[warp][g + 8][d1] = o[j][3];
  }
  __syncthreads();

  const float vs = v_scale[kv_head];
  const int num_qo_heads = G * num_kv_heads;
  for (int e = threadIdx.x; e < kRows * D; e += kThreads) {
    const int r = e / D, d = e - (e / D) * D;
    const int row = tile * kRows + r;
    if (row >= rows) continue;
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w][r]);
    float acc = 0.f, sum = 0.f;
    if (mx != -CUDART_INF_F) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float wgt = fast_exp2(s_m[w][r] - mx);
        acc += wgt * s_o[w][r][d];
        sum += wgt * s_l[w][r];
      }
    }
    const float val = sum > 0.f ? acc / sum * vs : 0.f;
    if (partial < 0) {
      const int token = q_begin + row / G, head = kv_head * G + row % G;
      out[(static_cast<i64>(token) * num_qo_heads + head) * D + d] = from_float<Act>(val);
      if constexpr (kBounded) {
        if (lse_out != nullptr && d == 0) {
          lse_out[static_cast<i64>(token) * num_qo_heads + head] = sum > 0.f ? mx + __log2f(sum) : -CUDART_INF_F;
        }
      }
    } else {
      const i64 base = (static_cast<i64>(partial) * num_kv_heads + kv_head) * kRows + r;
      o_part[base * D + d] = val;
      if (d == 0) lse_part[base] = sum > 0.f ? mx + __log2f(sum) : -CUDART_INF_F;
    }
  }
}

// One entry point for every page size: the block takes the one-page path when page_size >= 16.
// Arguments: those of paged_attention_impl, with page_shift, kv_first and lse_out moved to the front.
template <typename Act, typename Cache, int D, bool kBounded, typename... Args>
__device__ __forceinline__ void paged_attention_dispatch(int page_shift, const int* kv_first, float* lse_out,
                                                         Args... args) {
  if (page_shift >= 4) {
    paged_attention_impl<Act, Cache, D, kBounded, true>(args..., page_shift, kv_first, lse_out);
  } else {
    paged_attention_impl<Act, Cache, D, kBounded, false>(args..., page_shift, kv_first, lse_out);
  }
}

// A decode variant (decode_variants.cu): the one-page path only; the launcher never takes a variant for
// pages under 16 keys (where a step's keys would span pages), and a launch that does traps.
template <typename Act, typename Cache, int D, int kSub, int kStages, typename... Args>
__device__ __forceinline__ void paged_attention_variant(int page_shift, Args... args) {
  if (page_shift < 4) __trap();
  paged_attention_impl<Act, Cache, D, false, true, kSub, kStages>(args..., page_shift);
}

// Combine the splits of every tile that has more than one: o = sum_i w_i o_i / sum_i w_i with
// w_i = 2^(lse_i - max lse). Grid (num_merges, num_kv_heads), 128 threads. kLse (page_scores) also
// writes each row's final log-sum-exp, max lse + log2(sum_i w_i).
template <typename Act, bool kLse>
__device__ __forceinline__ void attention_merge_impl(
    const float* __restrict__ o_part,    // [num_partials, num_kv_heads, 16, head_dim] fp32
    const float* __restrict__ lse_part,  // [num_partials, num_kv_heads, 16] fp32, base 2
    const int* __restrict__ merges,      // [num_merges, 4] int32: (seq, row_tile, first_partial, count)
    const int* __restrict__ q_indptr,    // [batch + 1] int32
    Act* __restrict__ out,               // [num_q_tokens, num_qo_heads, head_dim] contiguous
    int group_size, int num_kv_heads, int head_dim,
    float* __restrict__ lse_out = nullptr) {  // kLse: [num_q_tokens, num_qo_heads] fp32, base 2
  const int* mg = merges + 4 * blockIdx.x;
  const int seq = mg[0], tile = mg[1], first = mg[2], count = mg[3];
  const int kv_head = blockIdx.y;
  const int G = group_size;
  const int q_begin = q_indptr[seq];
  const int rows = (q_indptr[seq + 1] - q_begin) * G;
  for (int e = threadIdx.x; e < kRows * head_dim; e += blockDim.x) {
    const int r = e / head_dim, d = e - r * head_dim;
    const int row = tile * kRows + r;
    if (row >= rows) continue;
    float mx = -CUDART_INF_F;
    for (int i = 0; i < count; ++i) {
      mx = fmaxf(mx, lse_part[(static_cast<i64>(first + i) * num_kv_heads + kv_head) * kRows + r]);
    }
    float acc = 0.f, sum = 0.f;
    if (mx != -CUDART_INF_F) {
      for (int i = 0; i < count; ++i) {
        const i64 base = (static_cast<i64>(first + i) * num_kv_heads + kv_head) * kRows + r;
        const float wgt = fast_exp2(lse_part[base] - mx);
        acc += wgt * o_part[base * head_dim + d];
        sum += wgt;
      }
    }
    const int token = q_begin + row / G, head = kv_head * G + row % G;
    out[(static_cast<i64>(token) * G * num_kv_heads + head) * head_dim + d] = from_float<Act>(sum > 0.f ? acc / sum : 0.f);
    if constexpr (kLse) {
      if (d == 0) {
        lse_out[static_cast<i64>(token) * G * num_kv_heads + head] = sum > 0.f ? mx + __log2f(sum) : -CUDART_INF_F;
      }
    }
  }
}

// Two floats of one compute-type register (the inverse of pack2).
template <typename T>
__device__ __forceinline__ float2 unpack2(unsigned x);
template <>
__device__ __forceinline__ float2 unpack2<__half>(unsigned x) {
  return __half22float2(*reinterpret_cast<__half2*>(&x));
}
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(unsigned x) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&x));
}

// page_scores: add to each page-table entry the softmax probability its keys received in this call,
// summed over the rows (query heads x query tokens). Grid (num_items, num_kv_heads) over the plan's
// items, so every visible key of every row is visited exactly once; 128 threads = 8 keys x 16 rows per
// step. The score is q . k again (Q rounded to the compute type, as the attention kernel's fragments, and
// accumulated in fp32), and p = 2^(s - lse) with the row's final base-2 log-sum-exp from the attention
// kernel (or attention_merge_lse): the same softmax, normalized, whatever the split.
template <typename Act, typename Cache, int D>
__device__ __forceinline__ void page_scores_impl(
    const Act* __restrict__ q,                          // [num_q_tokens, num_qo_heads, D] (strided rows)
    i64 q_token_stride, i64 q_head_stride,              // elements
    const typename Cache::storage* __restrict__ pool,   // this layer's K plane
    i64 page_stride, i64 head_stride, i64 token_stride,  // elements (PoolStrides)
    const float* __restrict__ k_scale,                  // [num_kv_heads] this layer's K scales
    const int* __restrict__ kv_indptr,                  // [batch + 1] int32
    const int* __restrict__ kv_indices,                 // [kv_indptr[batch]] int32 page ids
    const int* __restrict__ kv_len,                     // [batch] int32 keys per sequence
    const int* __restrict__ q_indptr,                   // [batch + 1] int32
    const int* __restrict__ items,                      // [num_items, 5] int32 (see the header)
    const int* __restrict__ kv_first,                   // [num_q_tokens] int32 first key seen, or null (0)
    const float* __restrict__ lse,                      // [num_q_tokens, num_qo_heads] fp32, base 2
    float* __restrict__ page_scores,                    // [kv_indptr[batch]] fp32, added to
    float sm_scale, int group_size, int num_kv_heads, int page_shift) {
  typedef typename Cache::storage S;
  typedef typename ComputeOf<Act, Cache>::type C;
  constexpr int kVec = 16 / sizeof(S);         // cache elements per 16-byte load
  constexpr int kKeys = kThreads / kRows;      // keys per step: 8
  __shared__ float s_q[kRows][D + 1];          // +1: the 16 rows of one column fall in 16 banks
  __shared__ float s_lse[kRows];
  __shared__ int s_first[kRows], s_limit[kRows];

  const int* item = items + 5 * blockIdx.x;
  const int seq = item[0], tile = item[1], kv_begin = item[2], kv_end = item[3];
  const int kv_head = blockIdx.y;
  const int G = group_size;
  const int num_qo_heads = G * num_kv_heads;
  const int q_begin = q_indptr[seq];
  const int q_len = q_indptr[seq + 1] - q_begin;
  const int rows = q_len * G;
  const int ctx = kv_len[seq] - q_len;

  for (int e = threadIdx.x; e < kRows * (D / 2); e += kThreads) {
    const int r = e / (D / 2), d = 2 * (e - r * (D / 2));
    const int row = tile * kRows + r;
    float2 x = make_float2(0.f, 0.f);
    if (row < rows) {
      const Act* qrow = q + (q_begin + row / G) * q_token_stride + (kv_head * G + row % G) * q_head_stride;
      x = unpack2<C>(pack2<C>(to_float(qrow[d]), to_float(qrow[d + 1])));
    }
    s_q[r][d] = x.x;
    s_q[r][d + 1] = x.y;
  }
  if (threadIdx.x < kRows) {
    const int r = threadIdx.x, row = tile * kRows + r;
    const bool valid = row < rows;
    const int token = q_begin + row / G;
    s_limit[r] = valid ? ctx + row / G : -1;
    s_first[r] = valid && kv_first != nullptr ? kv_first[token] : 0;
    s_lse[r] = valid ? lse[static_cast<i64>(token) * num_qo_heads + kv_head * G + row % G] : -CUDART_INF_F;
  }
  __syncthreads();

  const int r = threadIdx.x % kRows, slot = threadIdx.x / kRows;  // a half-warp holds one key's 16 rows
  const int limit = s_limit[r], first = s_first[r];
  const float row_lse = s_lse[r];
  const bool live = limit >= 0 && row_lse != -CUDART_INF_F;  // a row that sees no key adds nothing
  const S* k_base = pool + kv_head * head_stride;
  const int* pages = kv_indices + kv_indptr[seq];
  float* scores = page_scores + kv_indptr[seq];
  const int page_mask = (1 << page_shift) - 1;
  const float score_scale = sm_scale * k_scale[kv_head] * 1.4426950408889634f;
  // The trip count is the block's, so every lane reaches the shuffles.
  for (int key0 = kv_begin; key0 < kv_end; key0 += kKeys) {
    const int key = key0 + slot;
    float p = 0.f;
    if (live && key < kv_end && key >= first && key <= limit) {
      const i64 page = checked_page(pages[key >> page_shift], key);
      if (page != 0) {  // null-page keys are masked
        const S* row = k_base + page * page_stride + (key & page_mask) * token_stride;
        float acc = 0.f;
#pragma unroll
        for (int s = 0; s < D / kVec; ++s) {
          const uint4 raw = load16(row + s * kVec);
#pragma unroll
          for (int j = 0; j < kVec / 2; ++j) {
            const float2 k2 = unpack2<C>(k_pair<Cache, C>(raw, j));
            acc = fmaf(s_q[r][s * kVec + 2 * j], k2.x, acc);
            acc = fmaf(s_q[r][s * kVec + 2 * j + 1], k2.y, acc);
          }
        }
        p = fast_exp2(acc * score_scale - row_lse);
      }
    }
#pragma unroll
    for (int o = kRows / 2; o > 0; o >>= 1) p += __shfl_xor_sync(0xffffffffu, p, o);
    if (r == 0 && p > 0.f) atomicAdd(scores + (key >> page_shift), p);
  }
}

}  // namespace kv
