// Diagnostic microbenchmark (standalone, not part of the build): what does the INT4 MoE decode's
// byte pattern stream at when nothing else is in the way? DeepSeek-V3 batch 1 (8 experts of 7168 x
// 2048, INT4 group-32 with bf16 scales: 198 MB) read by a persistent grid that takes items from a
// queue in the fused grid's order (every gate/up item: expert, 64-row tile, K half; then every
// down item: expert, 64-row tile), each warp streaming its 16 rows through its own shared-memory
// ring of copy-engine boxes, as moe_tc_fused_kernel's rings do, but with no arithmetic and no wait
// for h. The knobs are the ones the real kernel fixes at compile time: bytes per row per stage
// (the data box width), whether each stage also copies the INT4 scales (a 16-byte-wide box), the
// ring bytes per warp and the CTAs per SM. Plain 16-byte loads of the same items and of one
// contiguous 198 MB range give the ceilings without the copy engine.
// Question it answers: on a card with more bandwidth per SM (H200 against H100), is the rings'
// copy pattern (many 16-row boxes, 16-byte scale rows) what caps the INT4 decode, or the rest of
// the kernel (arithmetic, the h dependency, the tail)?
// Build (here; one command line) and run the binary on the GPU host:
//   nvcc -O3 -std=c++20 -arch=sm_90a --expt-relaxed-constexpr -DFMT_USE_CONSTEXPR=1 -Isrc
//     tools/gpu_ring_stream.cu -o ring_stream
// Result (H100, 2026-12-06, docs/performance.md session 23): the kernel's pattern streams the 198 MB
// at 92-95% of copy bandwidth (one contiguous range: 99%), within that spread for every knob but 3-4
// CTAs per SM (slower); so on the H100 the INT4 decode's losses are its structure's and its math's.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/gpu/gpu_device.cuh"
#include "backend/gpu/gpu_mma.cuh"
#include "backend/gpu/gpu_tensor_map.cuh"

namespace mma = mla::gpu::mma;

#define CK(x)                                                                    \
  do {                                                                           \
    cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) {                                                     \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

constexpr int kHidden = 7168, kInter = 2048, kTopK = 8, kPool = 64;  // experts in the pool (rotated)
constexpr int kWarps = 4, kThreads = 128, kRows = 16, kCtaRows = 64, kMaxSlots = 16;

struct Maps {  // per expert: data gate, up, down; scales gate, up, down; gate + up as one 3-D map (data, scales)
  CUtensorMap m[8];
};
// A 3-D box (x, y, z) of the tensor map at `map`, as mma::tensor_copy_2d_g2s.
__device__ __forceinline__ void tensor_copy_3d_g2s(uint32_t dst, const void* map, int x, int y, int z, uint32_t bar,
                                                   uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
      "%3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(map), "r"(x), "r"(y), "r"(z), "r"(bar), "l"(policy)
      : "memory");
}
struct Cfg {
  int w = 128;          // data bytes per row per stage (box width)
  bool scales = true;   // a 16-row x w / 8 byte scale box per matrix and stage
  int ring = 18 * 1024; // bytes per warp
  int per_sm = 2;       // CTAs per SM (the shared memory asked for forces it)
  int kinds = 3;        // 1: gate/up items only, 2: down only, 3: both
  int mode = 0;         // 0: copy-engine rings, 1: 16-byte loads of the same items
  bool evict_first = true;  // the copies' L2 policy (the kernel's: evict-first)
  bool promote = true;      // maps with L2 256-byte promotion (the kernel's)
  bool fuse_gu = false;     // gate and up in one allocation: one 3-D box per stage for both (and one for their scales)
};
struct Work {
  const Maps* maps;
  const int* experts;  // this call's kTopK experts
  const uint8_t* const* data;   // [kPool * 3] matrix bases (mode 1)
  const uint8_t* const* scale;  // [kPool * 3]
  unsigned* queue;              // head, exited
  unsigned long long* sink;
};

__device__ __forceinline__ void stream_item(const Cfg& c, const Work& wk, int kind, int e, int tile, int half,
                                            uint32_t ring_s, uint32_t bars, uint32_t& phase) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int mats = kind == 0 ? 2 : 1;
  const int row0 = tile * kCtaRows + warp * kRows;
  // Byte range of each row this item reads: gate/up K half (1792 B), down whole K (1024 B).
  const int x0 = kind == 0 ? half * (kHidden / 4) : 0, xn = kind == 0 ? kHidden / 4 : kInter / 2;
  const int wbytes = mats * kRows * c.w, sbytes = c.scales ? mats * kRows * (c.w / 8) : 0;
  const int stage = wbytes + sbytes, stages = xn / c.w;
  if (c.mode == 1) {  // 16-byte loads: 8 in flight per lane
    unsigned long long acc = 0;
    for (int m = 0; m < mats; ++m) {
      const int mi = kind == 0 ? m : 2;
      const int pitch = kind == 0 ? kHidden / 2 : kInter / 2, spitch = kind == 0 ? kHidden / 16 : kInter / 16;
      const uint8_t* base = wk.data[e * 3 + mi] + size_t(row0) * pitch + x0;
      const int per_row = xn / 16, n = kRows * per_row;
      for (int i = lane; i < n; i += 32 * 8) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int j = i + 32 * u;
          v[u] = j < n ? __ldcs(reinterpret_cast<const uint4*>(base + size_t(j / per_row) * pitch) + j % per_row)
                       : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].w;
      }
      if (c.scales) {
        const uint8_t* sb = wk.scale[e * 3 + mi] + size_t(row0) * spitch + x0 / 8;
        const int sper = xn / 8 / 4;  // 4-byte words per row
        for (int i = lane; i < kRows * sper; i += 32)
          acc ^= __ldcs(reinterpret_cast<const unsigned*>(sb + size_t(i / sper) * spitch) + i % sper);
      }
    }
    if (acc == 0x123456789ull) atomicAdd(wk.sink, acc);
    return;
  }
  const int slots = min(kMaxSlots, c.ring / stage);
  uint64_t policy = mma::l2_evict_first_policy();
  if (!c.evict_first) asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(policy));
  auto issue = [&](int q) {
    if (q >= stages) return;
    const int st = q % slots;
    const uint32_t bar = bars + 8 * uint32_t(st);
    mma::mbar_arrive_expect_tx_if(lane == 0, bar, uint32_t(stage));
    const uint32_t dst = ring_s + uint32_t(st * stage);
    if (c.fuse_gu && kind == 0) {
      if (lane == 0) tensor_copy_3d_g2s(dst, &wk.maps[e].m[6], x0 + q * c.w, row0, 0, bar, policy);
      if (c.scales && lane == 8)
        tensor_copy_3d_g2s(dst + wbytes, &wk.maps[e].m[7], (x0 + q * c.w) / 8, row0, 0, bar, policy);
    } else if (lane < mats) {
      const int mi = kind == 0 ? lane : 2;
      mma::tensor_copy_2d_g2s(dst + lane * kRows * c.w, &wk.maps[e].m[mi], x0 + q * c.w, row0, bar, policy);
    } else if (c.scales && lane >= 8 && lane < 8 + mats) {
      const int m = lane - 8, mi = kind == 0 ? m : 2;
      mma::tensor_copy_2d_g2s(dst + wbytes + m * kRows * (c.w / 8), &wk.maps[e].m[3 + mi], (x0 + q * c.w) / 8, row0, bar,
                              policy);
    }
  };
  for (int q = 0; q < slots; ++q) issue(q);
  for (int q = 0; q < stages; ++q) {
    const int st = q % slots;
    mma::mbar_wait(bars + 8 * uint32_t(st), (phase >> st) & 1u);
    phase ^= 1u << st;
    __syncwarp();
    mma::fence_proxy_async();
    issue(q + slots);
  }
}

__global__ void __launch_bounds__(kThreads) ring_stream(Cfg c, Work wk) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint64_t bars[kWarps * kMaxSlots];
  __shared__ unsigned s_item;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const uint32_t ring_s = mma::smem_addr(smem + warp * c.ring), bar0 = mma::smem_addr(bars + warp * kMaxSlots);
  if (lane < kMaxSlots) mma::mbar_init(bar0 + 8 * uint32_t(lane), 1);
  mma::mbar_init_fence();
  __syncthreads();
  uint32_t phase = 0;
  const unsigned n_gu = (c.kinds & 1) ? kTopK * (kInter / kCtaRows) * 2 : 0;
  const unsigned total = n_gu + ((c.kinds & 2) ? kTopK * (kHidden / kCtaRows) : 0);
  for (;;) {
    if (threadIdx.x == 0) s_item = atomicAdd(wk.queue, 1u);
    __syncthreads();
    const unsigned item = s_item;
    __syncthreads();
    if (item >= total) break;
    if (item < n_gu) {
      const int slot = int(item / 64), r = int(item % 64);
      stream_item(c, wk, 0, wk.experts[slot], r / 2, r % 2, ring_s, bar0, phase);
    } else {
      const unsigned d = item - n_gu;
      stream_item(c, wk, 1, wk.experts[d / (kHidden / kCtaRows)], int(d % (kHidden / kCtaRows)), 0, ring_s, bar0, phase);
    }
  }
  if (threadIdx.x == 0 && atomicAdd(wk.queue + 1, 1u) == gridDim.x - 1) {
    wk.queue[0] = 0;
    wk.queue[1] = 0;
  }
}

__global__ void contiguous_read(const uint4* p, size_t n, unsigned long long* sink) {
  unsigned long long acc = 0;
  const size_t step = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += 8 * step) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = i + u * step < n ? __ldcs(p + i + u * step) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].w;
  }
  if (acc == 0x123456789ull) atomicAdd(sink, acc);
}

__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, sms);
  const size_t gu_bytes = size_t(kInter) * kHidden / 2, gu_s = size_t(kInter) * kHidden / 16;
  const size_t dn_bytes = gu_bytes, dn_s = gu_s;
  const size_t per_expert = 2 * (gu_bytes + gu_s) + dn_bytes + dn_s;
  std::vector<uint8_t*> data(kPool * 3), scale(kPool * 3);
  for (int e = 0; e < kPool; ++e)
    for (int m = 0; m < 3; ++m) {
      CK(cudaMalloc(&data[e * 3 + m], gu_bytes));
      CK(cudaMalloc(&scale[e * 3 + m], gu_s));
      CK(cudaMemset(data[e * 3 + m], 0x5a, gu_bytes));
      CK(cudaMemset(scale[e * 3 + m], 0x3c, gu_s));
    }
  std::vector<uint8_t*> gu_pair(kPool), gu_pair_s(kPool);  // gate and up adjacent (the 3-D maps)
  for (int e = 0; e < kPool; ++e) {
    CK(cudaMalloc(&gu_pair[e], 2 * gu_bytes));
    CK(cudaMalloc(&gu_pair_s[e], 2 * gu_s));
    CK(cudaMemset(gu_pair[e], 0x5a, 2 * gu_bytes));
    CK(cudaMemset(gu_pair_s[e], 0x3c, 2 * gu_s));
  }
  const auto encode = mla::gpu::tensor_map_encoder();
  if (!encode) {
    std::printf("no tensor-map encoder\n");
    return 1;
  }
  // A tensor map over bytes: one [rows][row_bytes] matrix (rank 2) or two of them mat_bytes apart
  // (rank 3: gate + up), read in boxes of `box` bytes x kRows rows (x both matrices).
  auto encode_map = [&](CUtensorMap* out, void* base, int rank, int64_t row_bytes, int64_t rows, size_t mat_bytes,
                        int box, bool promote) {
    const cuuint64_t dim[3] = {cuuint64_t(row_bytes), cuuint64_t(rows), 2};
    const cuuint64_t stride[2] = {cuuint64_t(row_bytes), cuuint64_t(mat_bytes)};
    const cuuint32_t boxd[3] = {cuuint32_t(box), cuuint32_t(kRows), 2}, es[3] = {1, 1, 1};
    if (encode(out, CU_TENSOR_MAP_DATA_TYPE_UINT8, cuuint32_t(rank), base, dim, stride, boxd, es,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
               promote ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_NONE,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
      std::printf("tensor map encode failed (rank %d, %lld B rows, box %d)\n", rank, (long long)row_bytes, box);
      std::exit(1);
    }
  };
  // Maps per data box width (the scale box is w / 8 wide).
  auto build_maps = [&](int w, bool promote) {
    std::vector<Maps> maps(kPool);
    for (int e = 0; e < kPool; ++e) {
      for (int m = 0; m < 3; ++m) {
        const int64_t rows = m < 2 ? kInter : kHidden, k = m < 2 ? kHidden : kInter;
        encode_map(&maps[e].m[m], data[e * 3 + m], 2, k / 2, rows, 0, w, promote);
        encode_map(&maps[e].m[3 + m], scale[e * 3 + m], 2, k / 16, rows, 0, w / 8, promote);
      }
      // gate + up: [2][inter][hidden / 2] and [2][inter][hidden / 16]
      encode_map(&maps[e].m[6], gu_pair[e], 3, kHidden / 2, kInter, gu_bytes, w, promote);
      encode_map(&maps[e].m[7], gu_pair_s[e], 3, kHidden / 16, kInter, gu_s, w / 8, promote);
    }
    Maps* d = nullptr;
    CK(cudaMalloc(&d, sizeof(Maps) * kPool));
    CK(cudaMemcpy(d, maps.data(), sizeof(Maps) * kPool, cudaMemcpyHostToDevice));
    return d;
  };
  Maps* maps128 = build_maps(128, true);
  Maps* maps256 = build_maps(256, true);
  Maps* maps128np = build_maps(128, false);
  const uint8_t **d_data = nullptr, **d_scale = nullptr;
  CK(cudaMalloc(&d_data, sizeof(void*) * kPool * 3));
  CK(cudaMalloc(&d_scale, sizeof(void*) * kPool * 3));
  CK(cudaMemcpy(d_data, data.data(), sizeof(void*) * kPool * 3, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_scale, scale.data(), sizeof(void*) * kPool * 3, cudaMemcpyHostToDevice));
  // 8 expert sets of 8 distinct experts: consecutive calls read different experts (as the bench).
  constexpr int kSets = 8;
  std::vector<int> sets(kSets * kTopK);
  for (int i = 0; i < kSets * kTopK; ++i) sets[i] = (i * 37 + 11) % kPool;
  int* d_sets = nullptr;
  unsigned* d_queue = nullptr;
  unsigned long long* d_sink = nullptr;
  CK(cudaMalloc(&d_sets, sizeof(int) * sets.size()));
  CK(cudaMemcpy(d_sets, sets.data(), sizeof(int) * sets.size(), cudaMemcpyHostToDevice));
  CK(cudaMalloc(&d_queue, 8));
  CK(cudaMemset(d_queue, 0, 8));
  CK(cudaMalloc(&d_sink, 8));

  cudaEvent_t ev[2 * 64];
  for (auto& e : ev) CK(cudaEventCreate(&e));
  auto median = [](std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // Copy ceiling: 1 GiB device to device, read + write bytes.
  const size_t gib = size_t(1) << 30;
  void *ca = nullptr, *cb = nullptr;
  CK(cudaMalloc(&ca, gib));
  CK(cudaMalloc(&cb, gib));
  std::vector<float> ts;
  for (int i = 0; i < 12; ++i) {
    CK(cudaEventRecord(ev[0]));
    CK(cudaMemcpyAsync(cb, ca, gib, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(ev[1]));
    CK(cudaEventSynchronize(ev[1]));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
    if (i >= 2) ts.push_back(ms);
  }
  const double copy_gbs = 2.0 * double(gib) / (median(ts) * 1e-3) / 1e9;
  std::printf("copy ceiling: %.0f GB/s (1 GiB d2d, read + write)\n", copy_gbs);

  // Times `launch(set)` one call per event pair, 32 calls queued behind a spin kernel.
  auto time_calls = [&](auto&& launch) {
    std::vector<float> t;
    for (int rep = 0; rep < 3; ++rep) {
      spin<<<1, 1>>>(2000000);
      for (int i = 0; i < 32; ++i) {
        CK(cudaEventRecord(ev[2 * i]));
        launch(i % kSets);
        CK(cudaEventRecord(ev[2 * i + 1]));
      }
      CK(cudaDeviceSynchronize());
      CK(cudaGetLastError());
      for (int i = 0; i < 32; ++i) {
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
        if (rep > 0) t.push_back(ms);
      }
    }
    return median(t);
  };
  const double total_bytes = double(kTopK) * double(per_expert);
  auto report = [&](const char* what, double bytes, float ms) {
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    std::printf("%-96s %8.1f us %6.0f GB/s %5.1f%% of copy\n", what, ms * 1e3, gbs, 100.0 * gbs / copy_gbs);
  };
  {
    const size_t n = size_t(total_bytes) / 16;
    uint4* big = nullptr;
    CK(cudaMalloc(&big, 2 * n * 16));
    const float ms = time_calls([&](int s) {
      contiguous_read<<<sms * 4, 256>>>(big + (s % 2) * n, n, d_sink);
    });
    report("contiguous 198 MB, 16-byte loads, 4 x 256 thr per SM", total_bytes, ms);
    CK(cudaFree(big));
  }
  auto run = [&](const char* name, Cfg c) {
    const size_t smem = size_t(kWarps) * c.ring;
    CK(cudaFuncSetAttribute(ring_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, ring_stream, kThreads, smem));
    const int per_sm = std::min(occ, c.per_sm);
    Work wk{c.w == 256 ? maps256 : c.promote ? maps128 : maps128np, nullptr, d_data, d_scale, d_queue, d_sink};
    const float ms = time_calls([&](int s) {
      wk.experts = d_sets + s * kTopK;
      ring_stream<<<sms * per_sm, kThreads, smem>>>(c, wk);
    });
    double bytes = 0;
    const double gu = 2.0 * (double(gu_bytes) + (c.scales ? double(gu_s) : 0.0)), dn = double(dn_bytes) + (c.scales ? double(dn_s) : 0.0);
    if (c.kinds & 1) bytes += kTopK * gu;
    if (c.kinds & 2) bytes += kTopK * dn;
    char label[200];
    std::snprintf(label, sizeof label, "%s (%s w%d %s ring %.1f KB, %d/SM%s%s%s%s)", name, c.mode ? "ld16" : "tma", c.w,
                  c.scales ? "+scales" : "no scales", c.ring / 1024.0, per_sm,
                  c.kinds == 1 ? ", gate/up only" : c.kinds == 2 ? ", down only" : "",
                  c.evict_first ? "" : ", evict-normal", c.promote ? "" : ", no L2 promotion",
                  c.fuse_gu ? ", gate+up one 3-D box" : "");
    report(label, bytes, ms);
  };
  Cfg base;
  run("as the kernel", base);
  for (int kinds : {1, 2}) {
    Cfg c = base;
    c.kinds = kinds;
    run("as the kernel, one kind", c);
  }
  { Cfg c = base; c.scales = false; run("no scale boxes", c); }
  { Cfg c = base; c.evict_first = false; run("L2 policy", c); }
  { Cfg c = base; c.fuse_gu = true; run("fewer copies", c); }
  { Cfg c = base; c.fuse_gu = true; c.kinds = 1; run("fewer copies", c); }
  { Cfg c = base; c.promote = false; run("L2 promotion", c); }
  { Cfg c = base; c.w = 256; c.ring = 27 * 1024; run("wider boxes", c); }
  { Cfg c = base; c.w = 256; c.ring = 27 * 1024; c.scales = false; run("wider boxes", c); }
  { Cfg c = base; c.ring = 27 * 1024; run("deeper ring", c); }
  { Cfg c = base; c.ring = 13 * 1024 + 512; c.per_sm = 3; run("3 CTAs per SM", c); }
  { Cfg c = base; c.ring = 9 * 1024; c.per_sm = 4; run("4 CTAs per SM", c); }
  { Cfg c = base; c.ring = 36 * 1024; c.per_sm = 1; run("1 CTA per SM", c); }
  { Cfg c = base; c.mode = 1; c.per_sm = 4; c.ring = 1024; run("plain loads", c); }
  { Cfg c = base; c.mode = 1; c.per_sm = 8; c.ring = 1024; run("plain loads", c); }
  run("as the kernel (again)", base);
  return 0;
}
