// Diagnostic microbenchmark (standalone, not part of the build): is the MLA decode row's spread of
// CTA finish times a property of the hardware (per-SM or per-GPC bandwidth) or of the kernel?
// Streams the row's 302 MB (batch 64 x 4096 keys x 1152 B) with 256 / 264 CTAs at two per SM in
// equal static slices, with 132 CTAs, with a global dynamic queue of 37 KB segments, and with
// per-GPC queues, and prints each CTA group's finish times (%globaltimer) per GPC. The GPC map comes
// from thread-block clusters of 8 (co-scheduled on one GPC), joined by union-find over 300 launches;
// SMs that never shared a cluster show as GPCs of one SM.
// Build and run on the GPU host:
//   nvcc -O3 -arch=sm_90 -std=c++17 tools/gpu_stream_balance.cu -o stream_balance && ./stream_balance
// Result (H200, 2026-12-03, docs/performance.md session 15): equal static slices finish within
// ~6 us of each other (61-67 us, 4.0-4.1 TB/s); the dynamic queues are slower, not faster.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <numeric>
#include <map>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)

__device__ __forceinline__ unsigned smid() { unsigned r; asm volatile("mov.u32 %0, %%smid;" : "=r"(r)); return r; }
__device__ __forceinline__ unsigned long long gt() { unsigned long long r; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(r)); return r; }

__global__ void probe(int* out) { out[blockIdx.x] = int(smid()); }

constexpr int kThreads = 256, kInflight = 8;
constexpr size_t kSeg = 32 * 1152;  // one 32-key unit of 576 bf16

// mode 0: static slices [b * per, (b+1) * per); mode 1: dynamic queue of kSeg segments;
// mode 2: per-SM weighted: CTA's work = table[smid slot], claimed by per-GPC queue
__device__ __forceinline__ void stream_range(const uint4* p, size_t n16, uint4& acc) {
  const size_t step = size_t(kThreads) * kInflight;
  for (size_t i = threadIdx.x; i < n16; i += step) {
    uint4 v[kInflight];
#pragma unroll
    for (int u = 0; u < kInflight; ++u) {
      const size_t j = i + size_t(u) * kThreads;
      v[u] = j < n16 ? __ldcs(p + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kInflight; ++u) { acc.x ^= v[u].x; acc.y ^= v[u].y; acc.z ^= v[u].z; acc.w ^= v[u].w; }
  }
}

__global__ void __launch_bounds__(kThreads, 2) stream(const uint4* buf, size_t total16, int mode, int* counter,
                                                      const int* gpc_of_sm, int* gpc_counter, const int* gpc_seg_begin,
                                                      int ngpc, unsigned long long* rec, uint4* sink) {
  extern __shared__ unsigned char smem[];  // forces <= 2 CTAs per SM
  unsigned long long t0 = gt();
  uint4 acc = make_uint4(0, 0, 0, 0);
  size_t bytes = 0;
  const size_t seg16 = kSeg / 16;
  const int nseg = int(total16 / seg16);
  __shared__ int s_claim;
  if (mode == 0) {
    const size_t per = total16 / gridDim.x;
    stream_range(buf + per * blockIdx.x, per, acc);
    bytes = per * 16;
  } else if (mode == 1) {
    for (;;) {
      if (threadIdx.x == 0) s_claim = atomicAdd(counter, 1);
      __syncthreads();
      const int s = s_claim;
      __syncthreads();
      if (s >= nseg) break;
      stream_range(buf + size_t(s) * seg16, seg16, acc);
      bytes += kSeg;
    }
  } else {
    // GPC queues: GPC g owns segments [gpc_seg_begin[g], gpc_seg_begin[g+1]); drain home, then others.
    const int home = gpc_of_sm[smid()];
    for (int k = 0; k < ngpc; ++k) {
      const int g = (home + k) % ngpc;
      for (;;) {
        if (threadIdx.x == 0) s_claim = gpc_seg_begin[g] + atomicAdd(gpc_counter + g, 1);
        __syncthreads();
        const int s = s_claim;
        __syncthreads();
        if (s >= gpc_seg_begin[g + 1]) break;
        stream_range(buf + size_t(s) * seg16, seg16, acc);
        bytes += kSeg;
      }
    }
  }
  if (acc.x == 0x12345678u) sink[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    rec[blockIdx.x * 4 + 0] = smid();
    rec[blockIdx.x * 4 + 1] = t0;
    rec[blockIdx.x * 4 + 2] = gt();
    rec[blockIdx.x * 4 + 3] = bytes;
  }
  (void)smem;
}

int find(std::vector<int>& p, int x) { while (p[x] != x) x = p[x] = p[p[x]]; return x; }

int main(int argc, char** argv) {
  int nsm = 0;
  CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
  // ---- GPC map ----
  std::vector<int> par(nsm);
  std::iota(par.begin(), par.end(), 0);
  int* d_out;
  const int csize = 8, nclusters = 4 * nsm / csize;
  CK(cudaMalloc(&d_out, sizeof(int) * nclusters * csize));
  std::vector<int> h(nclusters * csize);
  for (int it = 0; it < 300; ++it) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(nclusters * csize);
    cfg.blockDim = dim3(32);
    cfg.dynamicSmemBytes = (it % 3) * 60000;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = csize; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
    cfg.attrs = at; cfg.numAttrs = 1;
    if (cfg.dynamicSmemBytes) CK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, 200000));
    CK(cudaLaunchKernelEx(&cfg, probe, d_out));
    CK(cudaMemcpy(h.data(), d_out, sizeof(int) * h.size(), cudaMemcpyDeviceToHost));
    for (int c = 0; c < nclusters; ++c)
      for (int j = 1; j < csize; ++j) {
        int a = find(par, h[c * csize]), b = find(par, h[c * csize + j]);
        if (a != b) par[a] = b;
      }
  }
  std::map<int, std::vector<int>> comp;
  for (int s = 0; s < nsm; ++s) comp[find(par, s)].push_back(s);
  std::vector<int> gpc_of(nsm), gpc_size;
  int gi = 0;
  printf("GPCs: %zu\n", comp.size());
  for (auto& [r, v] : comp) {
    printf("  gpc %d: %zu SMs:", gi, v.size());
    for (int s : v) { printf(" %d", s); gpc_of[s] = gi; }
    printf("\n");
    gpc_size.push_back(int(v.size()));
    ++gi;
  }
  const int ngpc = gi;

  // ---- streaming ----
  const size_t total = size_t(64) * 4096 * 1152;  // 302 MB
  const size_t total16 = total / 16;
  uint4* buf; CK(cudaMalloc(&buf, total)); CK(cudaMemset(buf, 1, total));
  uint4* sink; CK(cudaMalloc(&sink, 4096));
  int *counter, *d_gpc_of, *gpc_counter, *d_seg_begin;
  CK(cudaMalloc(&counter, 4)); CK(cudaMalloc(&d_gpc_of, 4 * nsm)); CK(cudaMalloc(&gpc_counter, 4 * 64));
  CK(cudaMalloc(&d_seg_begin, 4 * 65));
  CK(cudaMemcpy(d_gpc_of, gpc_of.data(), 4 * nsm, cudaMemcpyHostToDevice));
  const int nseg = int(total / kSeg);
  unsigned long long* rec; CK(cudaMalloc(&rec, 8 * 4 * 4096));
  const int smem = 80 * 1024;
  CK(cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  // copy ceiling
  {
    void* dst; CK(cudaMalloc(&dst, total));
    float best = 1e9;
    for (int i = 0; i < 10; ++i) {
      cudaEventRecord(e0); cudaMemcpyAsync(dst, buf, total, cudaMemcpyDeviceToDevice); cudaEventRecord(e1);
      cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); best = std::min(best, ms);
    }
    printf("copy ceiling: %.1f GB/s (2 x bytes / time)\n", 2.0 * total / (best * 1e-3) / 1e9);
    cudaFree(dst);
  }
  // weights for mode 2: segments per GPC proportional to a given weight (arg: 0 = equal per GPC, 1 = per SM)
  auto run = [&](const char* name, int mode, int grid, std::vector<double> gpc_w) {
    std::vector<int> seg_begin(ngpc + 1, 0);
    if (mode == 2) {
      double sw = 0; for (double w : gpc_w) sw += w;
      double acc = 0;
      for (int g = 0; g < ngpc; ++g) { acc += gpc_w[g]; seg_begin[g + 1] = int(nseg * acc / sw + 0.5); }
      seg_begin[ngpc] = nseg;
      CK(cudaMemcpy(d_seg_begin, seg_begin.data(), 4 * (ngpc + 1), cudaMemcpyHostToDevice));
    }
    std::vector<float> times;
    std::vector<unsigned long long> r(size_t(grid) * 4);
    for (int it = 0; it < 12; ++it) {
      CK(cudaMemset(counter, 0, 4)); CK(cudaMemset(gpc_counter, 0, 4 * 64));
      cudaEventRecord(e0);
      stream<<<grid, kThreads, smem>>>(buf, total16, mode, counter, d_gpc_of, gpc_counter, d_seg_begin, ngpc, rec, sink);
      cudaEventRecord(e1);
      CK(cudaEventSynchronize(e1));
      float ms; cudaEventElapsedTime(&ms, e0, e1); times.push_back(ms);
    }
    CK(cudaMemcpy(r.data(), rec, 8 * r.size(), cudaMemcpyDeviceToHost));
    std::sort(times.begin(), times.end());
    const double med = times[times.size() / 2];
    unsigned long long base = ~0ull, endmax = 0;
    for (int b = 0; b < grid; ++b) { base = std::min(base, r[b * 4 + 1]); endmax = std::max(endmax, r[b * 4 + 2]); }
    std::vector<int> per_sm(nsm, 0);
    for (int b = 0; b < grid; ++b) per_sm[r[b * 4]]++;
    printf("\n== %s (grid %d): median %.4f ms = %.1f GB/s; last-run span %.2f us\n", name, grid, med,
           total / (med * 1e-3) / 1e9, (endmax - base) * 1e-3);
    // per GPC: mean/min/max end, bytes
    for (int g = 0; g < ngpc; ++g) {
      double mn = 1e18, mx = 0, sum = 0, by = 0; int n = 0, one = 0;
      for (int b = 0; b < grid; ++b) {
        int s = int(r[b * 4]);
        if (gpc_of[s] != g) continue;
        double e = (r[b * 4 + 2] - base) * 1e-3;
        mn = std::min(mn, e); mx = std::max(mx, e); sum += e; ++n; by += double(r[b * 4 + 3]);
        if (per_sm[s] == 1) ++one;
      }
      printf("  gpc %d (%2d SMs): %3d CTAs (%d alone on an SM), end min %.1f mean %.1f max %.1f us, %.1f MB, %.1f GB/s per GPC\n",
             g, gpc_size[g], n, one, mn, n ? sum / n : 0, mx, by / 1e6, n ? by / (mx * 1e-6) / 1e9 : 0);
    }
  };
  std::vector<double> eq(ngpc, 1.0), bysm(ngpc);
  for (int g = 0; g < ngpc; ++g) bysm[g] = gpc_size[g];
  run("static equal slices, 256 CTAs (the MLA row)", 0, 256, {});
  run("static equal slices, 264 CTAs", 0, 264, {});
  run("static equal slices, 132 CTAs", 0, 132, {});
  run("dynamic global queue of 37 KB, 264 CTAs", 1, 264, {});
  run("dynamic global queue of 37 KB, 256 CTAs", 1, 256, {});
  run("GPC queues, equal bytes per GPC, 264 CTAs", 2, 264, eq);
  run("GPC queues, bytes per GPC ~ its SMs, 264 CTAs", 2, 264, bysm);
  run("static equal slices, 256 CTAs (again)", 0, 256, {});
  return 0;
}
