// kvcore: whole-page copies over every layer, K and V, in one launch each:
//   copy_pages    pool -> pool (copy-on-write of a shared partial page, defrag)
//   gather_pages  pool -> page-major buffer (offload; the buffer may be pinned host memory, written
//                 directly through unified addressing, or a device staging buffer)
//   scatter_pages page-major buffer -> pool (reload)
// NumPy references: python/kvcore/kernels/reference.py.
//
// The kernels see the pool as bytes: plane (layer, kv) at layer*layer_stride + kv*kv_stride, page p of
// a plane at p*page_stride, each page of a plane `plane_bytes` contiguous bytes (true of both the HND
// and NHD layouts). A page-major buffer is [num_pages, num_layers, 2, plane_bytes].
//
// Grid (num_pages or num_pairs, num_layers * 2): one thread block per (page, plane), 256 threads moving
// 16 bytes each per step (plane_bytes is a multiple of 16 for every supported shape; otherwise bytes).
#include "common.cuh"

namespace kv {

__device__ __forceinline__ void copy_bytes(unsigned char* __restrict__ dst, const unsigned char* __restrict__ src,
                                           i64 num_bytes) {
  if ((num_bytes & 15) == 0 && ((reinterpret_cast<unsigned long long>(dst) | reinterpret_cast<unsigned long long>(src)) & 15) == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (i64 i = threadIdx.x; i < (num_bytes >> 4); i += blockDim.x) d[i] = s[i];
  } else {
    for (i64 i = threadIdx.x; i < num_bytes; i += blockDim.x) dst[i] = src[i];
  }
}

}  // namespace kv

extern "C" __global__ void __launch_bounds__(256)
    copy_pages(unsigned char* __restrict__ pool,      // the whole pool, as bytes
               const long long* __restrict__ pairs,   // [num_pairs, 2] int64 (src page, dst page)
               long long layer_stride, long long kv_stride, long long page_stride,  // bytes
               long long plane_bytes) {                // bytes of one page of one (layer, kv) plane
  const int layer = blockIdx.y >> 1, kvi = blockIdx.y & 1;
  unsigned char* plane = pool + layer * layer_stride + kvi * kv_stride;
  const long long src = pairs[2 * blockIdx.x], dst = pairs[2 * blockIdx.x + 1];
  kv::copy_bytes(plane + dst * page_stride, plane + src * page_stride, plane_bytes);
}

extern "C" __global__ void __launch_bounds__(256)
    gather_pages(const unsigned char* __restrict__ pool,  // the whole pool, as bytes
                 const long long* __restrict__ page_ids,  // [num_pages] int64
                 unsigned char* __restrict__ buffer,      // [num_pages, num_layers, 2, plane_bytes]
                 long long layer_stride, long long kv_stride, long long page_stride,  // bytes
                 long long plane_bytes) {
  const unsigned char* plane = pool + (blockIdx.y >> 1) * layer_stride + (blockIdx.y & 1) * kv_stride;
  unsigned char* dst = buffer + (static_cast<long long>(blockIdx.x) * gridDim.y + blockIdx.y) * plane_bytes;
  kv::copy_bytes(dst, plane + page_ids[blockIdx.x] * page_stride, plane_bytes);
}

extern "C" __global__ void __launch_bounds__(256)
    scatter_pages(unsigned char* __restrict__ pool,           // the whole pool, as bytes
                  const long long* __restrict__ page_ids,     // [num_pages] int64, distinct
                  const unsigned char* __restrict__ buffer,   // [num_pages, num_layers, 2, plane_bytes]
                  long long layer_stride, long long kv_stride, long long page_stride,  // bytes
                  long long plane_bytes) {
  unsigned char* plane = pool + (blockIdx.y >> 1) * layer_stride + (blockIdx.y & 1) * kv_stride;
  const unsigned char* src = buffer + (static_cast<long long>(blockIdx.x) * gridDim.y + blockIdx.y) * plane_bytes;
  kv::copy_bytes(plane + page_ids[blockIdx.x] * page_stride, src, plane_bytes);
}
