// Naive (decompressed) MLA attention on the GPU, the prefill path: per sequence, the keys are walked
// in chunks of 1024 positions; each chunk's latent rows are gathered, decompressed by this backend's
// linear op into per-head [k_nope | v], and folded into a running (max, sum, acc) per (row, head) by
// an fp32 flash-attention kernel (GemmPrecision::Fp32: exact, golden) or, under GemmPrecision::Bf16,
// the tensor-core kernel of gpu_mla_naive_tc.cu over a bf16 copy of the chunk. That copy comes
// straight from per-head bf16 GEMMs (linear_heads_bf16: the latent gathered as bf16, the shared
// k_rope replicated into every head's rows by the gather) where the weight's format allows, else from
// linear's F32 output and naive_tc_pack. Memory is bounded by the chunk at any context (128K
// included); the price is one host loop iteration per (sequence, chunk), fine for prefill, which is
// never captured.
#include <algorithm>

#include "backend/gpu/gpu_linear.h"
#include "backend/gpu/gpu_mla_common.cuh"
#include "backend/gpu/gpu_mla_naive_tc.h"
#include "backend/gpu/gpu_mla_state.h"

namespace mla::gpu {

namespace {

// Keys per chunk. At H=128, d_n + d_v = 256 the decompressed chunk is 1024 x 32768 fp32 = 128 MB of
// scratch; a chunk this long gives the decompression GEMM an M of 1024 (efficient) and makes the
// per-chunk launches negligible.
constexpr int64_t kNaiveKeyChunk = 1024;
// The tensor-core path's chunk: as many keys as fit a 512 MB decompressed F32 chunk (+ 256 MB of its
// bf16 copy), between 1024 and kNaiveTcMaxKeyChunk = 16384 (4096 at H = 128, 16384 at H <= 32,
// DeepSeek dims). Its kernel is ~10x faster, so the per-chunk round trip of the running acc through
// `out` (T x H x d_v x 8 B: 0.5 GB at T = 4096, H = 128, ~0.13 ms) would cost ~30% at 1024 keys; at
// 4096 it is ~4% of the chunk's ~3.4 ms. At 16 heads a 4096-key chunk computes for only ~0.34 ms, so
// its fixed costs (gather, decompression GEMMs, Q staging, the acc round trip, launches: ~55 us
// measured, 2026-12-03) took ~16%; 16384-key chunks cut their count by 4 (and a 16K context runs as
// one chunk, so its causal diagonal is no longer a chunk of its own with 1-32 key tiles per CTA).
constexpr size_t kTcChunkBytes = size_t(512) << 20;
int64_t g_tc_max_key_chunk = kNaiveTcMaxKeyChunk;
constexpr int kChunkThreads = 128;
constexpr int kRowTile = 16;  // query rows of one head per block
constexpr int kKeyTile = 16;  // keys staged in shared memory per step
constexpr float kNegInf = -__builtin_huge_valf();

// Gathers the cache rows of positions [j0, j0 + n) of one sequence as fp32, split into latent [n, r]
// and rope [n, d_r], both contiguous (so the decompression GEMM gets a dense, aligned operand).
__global__ void gather_rows_kernel(CacheView cache, const int32_t* __restrict__ block_ids, int64_t block_base,
                                   int64_t j0, int rank, float* __restrict__ latent, float* __restrict__ rope) {
  const int64_t j = blockIdx.x, pos = j0 + j;
  const int64_t row = int64_t(block_ids[block_base + pos / cache.block_size]) * cache.block_size +
                      pos % cache.block_size;
  const int64_t d_r = cache.kv_dim - rank;
  for (int64_t c = threadIdx.x; c < cache.kv_dim; c += blockDim.x) {
    const float v = cache_load(cache, row, c);
    if (c < rank) latent[j * rank + c] = v; else rope[j * d_r + (c - rank)] = v;
  }
}

// The tensor-core path's gather: the cache rows of positions [j0, j0 + n) as bf16, the latent into
// x16 [n, rank] (the decompression GEMM's operand) and k_rope into columns [d_n, d_qk) of every head's
// row j of k16 [H][n][d_qk] (RNE from an F32 cache; a BF16 cache's bits unchanged). One block per
// key; the rope row passes through shared memory (d_r bf16, 16-byte aligned) so the per-head copies
// are 16-byte stores when d_n, d_qk and d_r are multiples of 8 (DeepSeek: 128 heads x 128 bytes).
__global__ void gather_rows_bf16_kernel(CacheView cache, const int32_t* __restrict__ block_ids, int64_t block_base,
                                        int64_t j0, int rank, int heads, int d_n, int64_t n, uint16_t* __restrict__ x16,
                                        uint16_t* __restrict__ k16) {
  extern __shared__ uint4 gather_smem[];
  auto* rope_s = reinterpret_cast<uint16_t*>(gather_smem);
  const int64_t j = blockIdx.x, pos = j0 + j;
  const int64_t row = int64_t(block_ids[block_base + pos / cache.block_size]) * cache.block_size +
                      pos % cache.block_size;
  const int d_r = int(cache.kv_dim) - rank, dqk = d_n + d_r;
  for (int c = int(threadIdx.x); c < cache.kv_dim; c += int(blockDim.x)) {
    const uint16_t v = f32_to_bf16_bits(cache_load(cache, row, c));
    if (c < rank) x16[j * rank + c] = v; else rope_s[c - rank] = v;
  }
  __syncthreads();
  if (d_r % 8 == 0 && d_n % 8 == 0) {  // dqk % 8 == 0 too: every destination is 16-byte aligned
    const int per_head = d_r / 8;
    for (int idx = int(threadIdx.x); idx < heads * per_head; idx += int(blockDim.x)) {
      const int h = idx / per_head, c = (idx - h * per_head) * 8;
      *reinterpret_cast<uint4*>(k16 + (int64_t(h) * n + j) * dqk + d_n + c) = *reinterpret_cast<const uint4*>(rope_s + c);
    }
  } else {
    for (int idx = int(threadIdx.x); idx < heads * d_r; idx += int(blockDim.x)) {
      const int h = idx / d_r, c = idx - h * d_r;
      k16[(int64_t(h) * n + j) * dqk + d_n + c] = rope_s[c];
    }
  }
}

struct ChunkArgs {
  const float* q;       // [T, H, d_n + d_r] strided
  int64_t q_s0, q_s1;
  const float* kv;      // [n, H (d_n + d_v)] decompressed chunk, contiguous
  const float* rope;    // [n, d_r] k_rope of the chunk's cache rows, contiguous
  float* out;           // [T, H, d_v] strided: the running acc between chunks, the result after the last
  int64_t o_s0, o_s1;
  float* run_max;       // [T, H] running max between chunks
  float* run_sum;       // [T, H] running sum between chunks
  int heads, d_n, d_r, d_v;
  float scale;
  int64_t q0, q_len, first_pos, j0, n;  // the sequence's rows, its first position, this chunk's keys
  bool first, last;
};

// Block (row tile, head): rows i0..i0+15 of the sequence for head h against the chunk's keys, 16 keys
// per step staged in shared memory. Causal: row i sees key positions <= first_pos + i.
// Napkin (H=128, 4096-token prefill, d_n+d_r = 192, d_v = 128): 2 x 4096^2/2 x 128 x 320 = 690 GFLOP
// of fp32 FMA (~15 ms at 50 TFLOP/s), against ~0.1 GB of decompressed keys per chunk: compute-bound,
// the reason a tensor-core version may replace this kernel.
__global__ void __launch_bounds__(kChunkThreads) naive_chunk_kernel(ChunkArgs a) {
  extern __shared__ float smem[];
  const int dqk = a.d_n + a.d_r, kst = dqk + 1;  // +1: key rows on different banks
  float* q_s = smem;                             // [kRowTile][dqk]
  float* k_s = q_s + kRowTile * dqk;             // [kKeyTile][kst]
  float* v_s = k_s + kKeyTile * kst;             // [kKeyTile][d_v]
  float* s_s = v_s + kKeyTile * a.d_v;           // [kRowTile][kKeyTile] scores, then p
  float* acc_s = s_s + kRowTile * kKeyTile;      // [kRowTile][d_v]
  float* corr_s = acc_s + kRowTile * a.d_v;      // [kRowTile]
  const int tid = threadIdx.x, h = blockIdx.y;
  const int64_t i0 = int64_t(blockIdx.x) * kRowTile;
  const int qn = int(min(int64_t(kRowTile), a.q_len - i0));
  const int64_t row_width = int64_t(a.heads) * (a.d_n + a.d_v), head_off = int64_t(h) * (a.d_n + a.d_v);

  for (int idx = tid; idx < kRowTile * dqk; idx += blockDim.x) {
    const int rr = idx / dqk, d = idx % dqk;
    q_s[idx] = rr < qn ? a.q[(a.q0 + i0 + rr) * a.q_s0 + int64_t(h) * a.q_s1 + d] : 0.0f;
  }
  for (int idx = tid; idx < kRowTile * a.d_v; idx += blockDim.x) {
    const int rr = idx / a.d_v, e = idx % a.d_v;
    acc_s[idx] = (rr < qn && !a.first) ? a.out[(a.q0 + i0 + rr) * a.o_s0 + int64_t(h) * a.o_s1 + e] : 0.0f;
  }
  // Running state of row tid (threads tid < kRowTile only).
  float m = kNegInf, l = 0.0f;
  if (tid < qn && !a.first) {
    m = a.run_max[(a.q0 + i0 + tid) * a.heads + h];
    l = a.run_sum[(a.q0 + i0 + tid) * a.heads + h];
  }
  // Keys any row of the tile sees: positions <= first_pos + i0 + qn - 1.
  const int64_t n_eff = min(a.n, a.first_pos + i0 + qn - a.j0);
  for (int64_t jt = 0; jt < n_eff; jt += kKeyTile) {
    const int jn = int(min(int64_t(kKeyTile), n_eff - jt));
    __syncthreads();  // previous step's readers are done (and q_s / acc_s are written)
    for (int idx = tid; idx < kKeyTile * dqk; idx += blockDim.x) {
      const int j = idx / dqk, d = idx % dqk;
      float v = 0.0f;
      if (j < jn)
        v = d < a.d_n ? a.kv[(jt + j) * row_width + head_off + d] : a.rope[(jt + j) * a.d_r + (d - a.d_n)];
      k_s[j * kst + d] = v;
    }
    for (int idx = tid; idx < kKeyTile * a.d_v; idx += blockDim.x) {
      const int j = idx / a.d_v, e = idx % a.d_v;
      v_s[idx] = j < jn ? a.kv[(jt + j) * row_width + head_off + a.d_n + e] : 0.0f;
    }
    __syncthreads();
    for (int idx = tid; idx < kRowTile * kKeyTile; idx += blockDim.x) {
      const int rr = idx / kKeyTile, j = idx % kKeyTile;
      float sc = kNegInf;
      if (rr < qn && j < jn && a.j0 + jt + j <= a.first_pos + i0 + rr) {
        const float* qr = q_s + rr * dqk;
        const float* kr = k_s + j * kst;
        float nope = 0.0f, rope = 0.0f;
        for (int d = 0; d < a.d_n; ++d) nope += qr[d] * kr[d];
        for (int d = a.d_n; d < dqk; ++d) rope += qr[d] * kr[d];
        sc = a.scale * (nope + rope);
      }
      s_s[idx] = sc;
    }
    __syncthreads();
    if (tid < kRowTile) {
      float* sr = s_s + tid * kKeyTile;
      float mx = kNegInf;
      for (int j = 0; j < jn; ++j) mx = fmaxf(mx, sr[j]);
      const float m_new = fmaxf(m, mx);
      float corr = 1.0f, sum = 0.0f;
      if (m_new != kNegInf) {  // else this row has seen no key yet: nothing to fold
        corr = expf(m - m_new);
        for (int j = 0; j < jn; ++j) {
          const float p = expf(sr[j] - m_new);  // masked keys: exp(-inf) = 0
          sr[j] = p;
          sum += p;
        }
      } else {
        for (int j = 0; j < jn; ++j) sr[j] = 0.0f;
      }
      l = l * corr + sum;
      m = m_new;
      corr_s[tid] = corr;
    }
    __syncthreads();
    for (int idx = tid; idx < kRowTile * a.d_v; idx += blockDim.x) {
      const int rr = idx / a.d_v, e = idx % a.d_v;
      float acc = acc_s[idx] * corr_s[rr];
      for (int j = 0; j < jn; ++j) acc += s_s[rr * kKeyTile + j] * v_s[j * a.d_v + e];
      acc_s[idx] = acc;
    }
  }
  __syncthreads();
  if (tid < kRowTile) corr_s[tid] = l > 0.0f ? 1.0f / l : 0.0f;  // l > 0 for every real row (it sees key 0)
  if (tid < qn && !a.last) {
    a.run_max[(a.q0 + i0 + tid) * a.heads + h] = m;
    a.run_sum[(a.q0 + i0 + tid) * a.heads + h] = l;
  }
  __syncthreads();
  for (int idx = tid; idx < qn * a.d_v; idx += blockDim.x) {
    const int rr = idx / a.d_v, e = idx % a.d_v;
    a.out[(a.q0 + i0 + rr) * a.o_s0 + int64_t(h) * a.o_s1 + e] = a.last ? acc_s[idx] * corr_s[rr] : acc_s[idx];
  }
}

// The CPU reference's batch check on the host mirrors (this path may read them: never captured).
void check_host_batch(const ops::AttentionBatch& batch, int64_t num_tokens, int64_t num_blocks) {
  const int64_t seqs = batch.num_seqs;
  MLA_CHECK(batch.host_q_indptr.size() == size_t(seqs + 1) && batch.host_kv_lens.size() == size_t(seqs) &&
                batch.host_block_indptr.size() == size_t(seqs + 1),
            "mla_attention_naive: host mirrors sized {}/{}/{} for {} sequences", batch.host_q_indptr.size(),
            batch.host_kv_lens.size(), batch.host_block_indptr.size(), seqs);
  MLA_CHECK(batch.host_q_indptr[0] == 0 && batch.host_q_indptr[size_t(seqs)] == num_tokens,
            "mla_attention_naive: q_indptr spans [{}, {}), want [0, {})", batch.host_q_indptr[0],
            batch.host_q_indptr[size_t(seqs)], num_tokens);
  MLA_CHECK(batch.host_block_indptr[0] >= 0 &&
                size_t(batch.host_block_indptr[size_t(seqs)]) <= batch.host_block_ids.size(),
            "mla_attention_naive: block_indptr ends at {} but there are {} block ids",
            batch.host_block_indptr[size_t(seqs)], batch.host_block_ids.size());
  for (size_t s = 0; s < size_t(seqs); ++s) {
    const int64_t q_len = batch.host_q_indptr[s + 1] - batch.host_q_indptr[s];
    const int64_t kv_len = batch.host_kv_lens[s];
    const int64_t blocks = batch.host_block_indptr[s + 1] - batch.host_block_indptr[s];
    MLA_CHECK(q_len >= 0 && kv_len >= q_len, "mla_attention_naive: seq {} has q_len {} kv_len {}", s, q_len, kv_len);
    MLA_CHECK(blocks >= 0 && blocks * batch.block_size >= kv_len,
              "mla_attention_naive: seq {} has {} blocks for {} tokens", s, blocks, kv_len);
    for (int64_t b = 0; b < (kv_len + batch.block_size - 1) / batch.block_size; ++b) {
      const int32_t id = batch.host_block_ids[size_t(batch.host_block_indptr[s] + b)];
      MLA_CHECK(id >= 0 && id < num_blocks, "mla_attention_naive: seq {} block {} id {} outside [0, {})", s, b, id,
                num_blocks);
    }
  }
}

}  // namespace

void set_naive_tc_max_key_chunk(int64_t keys) {
  MLA_CHECK(keys == 0 || (keys >= 64 && keys % 64 == 0), "set_naive_tc_max_key_chunk: {} keys (want 0 or a multiple of 64)",
            keys);
  g_tc_max_key_chunk = keys == 0 ? kNaiveTcMaxKeyChunk : keys;
}

void GpuBackend::mla_attention_naive(const TensorView& q, const TensorView& cache, const ops::Weight& kv_b_proj,
                                     const ops::AttentionBatch& batch, const ops::MlaDims& dims,
                                     const TensorView& out) {
  MLA_CHECK(!capturing(), "mla_attention_naive is a prefill path and cannot be recorded into a graph");
  mla_check_kv_b(kv_b_proj, dims, "mla_attention_naive");
  const int64_t heads = dims.num_heads, d_n = dims.qk_nope_head_dim, d_r = dims.qk_rope_head_dim;
  const int64_t d_v = dims.v_head_dim, rank = dims.kv_lora_rank;
  const int64_t num_tokens = q.ndim == 3 ? q.dim(0) : 0;
  mla_check_heads(q, num_tokens, heads, d_n + d_r, "mla_attention_naive q");
  mla_check_heads(out, num_tokens, heads, d_v, "mla_attention_naive out");
  MLA_CHECK(q.data != out.data, "mla_attention_naive: out aliases q");
  const CacheView cv = mla_cache_view(cache, batch, dims, "mla_attention_naive");
  mla_batch_view(batch, num_tokens, "mla_attention_naive");
  check_host_batch(batch, num_tokens, cache.dim(0));
  if (num_tokens == 0) return;

  const int64_t dqk = d_n + d_r;
  // Tensor cores when serving (Bf16) and the head dims fit the tc kernel's constraints.
  const bool use_tc = options().gemm_precision == GemmPrecision::Bf16 && naive_tc_supported(int(dqk), int(d_v));
  const size_t smem = size_t(kRowTile * dqk + kKeyTile * (dqk + 1) + kKeyTile * d_v + kRowTile * kKeyTile +
                             kRowTile * d_v + kRowTile) * sizeof(float);
  MLA_CHECK(use_tc || smem <= 48 * 1024,
            "mla_attention_naive: head dims d_n {} d_r {} d_v {} too large for the chunk kernel", d_n, d_r, d_v);
  // Scratch: [latent (C x r) | rope (C x d_r) | kv (C x H (d_n + d_v)) | run_max (T x H) | run_sum (T x H)
  //           | tc only: k bf16 (H x C x d_qk) | v bf16 (H x C x d_v) | latent bf16 (C x r)].
  // (latent, rope and kv are only written on the tc path when linear_heads_bf16 declines a chunk.)
  const int64_t longest = *std::max_element(batch.host_kv_lens.begin(), batch.host_kv_lens.end());
  const int64_t row_width = heads * (d_n + d_v);
  int64_t chunk_cap = kNaiveKeyChunk;
  if (use_tc)
    chunk_cap = std::clamp<int64_t>(int64_t(kTcChunkBytes / (size_t(row_width) * sizeof(float))) / 64 * 64,
                                    std::min(kNaiveKeyChunk, g_tc_max_key_chunk), g_tc_max_key_chunk);
  const int64_t chunk = std::min(chunk_cap, std::max<int64_t>(longest, 1));
  auto align = [](size_t n) { return (n + 255) / 256 * 256; };
  const size_t latent_bytes = align(size_t(chunk * rank) * sizeof(float));
  const size_t rope_bytes = align(size_t(chunk * d_r) * sizeof(float));
  const size_t rows_bytes = latent_bytes + rope_bytes;
  const size_t kv_bytes = align(size_t(chunk * row_width) * sizeof(float));
  const size_t state_bytes = align(size_t(num_tokens * heads) * sizeof(float));
  const size_t k16_bytes = use_tc ? align(size_t(heads * chunk * dqk) * 2) : 0;
  const size_t v16_bytes = use_tc ? align(size_t(heads * chunk * d_v) * 2) : 0;
  const size_t x16_bytes = use_tc ? align(size_t(chunk * rank) * 2) : 0;
  char* base = static_cast<char*>(
      mla_state().scratch.get(*this, rows_bytes + kv_bytes + 2 * state_bytes + k16_bytes + v16_bytes + x16_bytes));
  float* latent = reinterpret_cast<float*>(base);
  float* rope = reinterpret_cast<float*>(base + latent_bytes);
  float* kv = reinterpret_cast<float*>(base + rows_bytes);
  float* run_max = reinterpret_cast<float*>(base + rows_bytes + kv_bytes);
  float* run_sum = reinterpret_cast<float*>(base + rows_bytes + kv_bytes + state_bytes);
  uint16_t* k16 = reinterpret_cast<uint16_t*>(base + rows_bytes + kv_bytes + 2 * state_bytes);
  uint16_t* v16 = reinterpret_cast<uint16_t*>(base + rows_bytes + kv_bytes + 2 * state_bytes + k16_bytes);
  uint16_t* x16 = reinterpret_cast<uint16_t*>(base + rows_bytes + kv_bytes + 2 * state_bytes + k16_bytes + v16_bytes);
  const bool heads_bf16 = use_tc && linear_heads_bf16_supports(*this, kv_b_proj);

  NaiveTcArgs t{};
  t.q = q.as<const float>();
  t.q_s0 = q.stride[0];
  t.q_s1 = q.stride[1];
  t.k = k16;
  t.v = v16;
  t.out = out.as<float>();
  t.o_s0 = out.stride[0];
  t.o_s1 = out.stride[1];
  t.run_max = run_max;
  t.run_sum = run_sum;
  t.heads = int(heads);
  t.dqk = int(dqk);
  t.dv = int(d_v);
  t.scale = dims.softmax_scale;
  ChunkArgs a{};
  a.q = q.as<const float>();
  a.q_s0 = q.stride[0];
  a.q_s1 = q.stride[1];
  a.kv = kv;
  a.rope = rope;
  a.out = out.as<float>();
  a.o_s0 = out.stride[0];
  a.o_s1 = out.stride[1];
  a.run_max = run_max;
  a.run_sum = run_sum;
  a.heads = int(heads);
  a.d_n = int(d_n);
  a.d_r = int(d_r);
  a.d_v = int(d_v);
  a.scale = dims.softmax_scale;
  for (size_t s = 0; s < size_t(batch.num_seqs); ++s) {
    const int64_t q0 = batch.host_q_indptr[s], q_len = batch.host_q_indptr[s + 1] - q0;
    const int64_t kv_len = batch.host_kv_lens[s];
    if (q_len == 0) continue;
    a.q0 = q0;
    a.q_len = q_len;
    a.first_pos = kv_len - q_len;
    for (int64_t j0 = 0; j0 < kv_len; j0 += chunk) {
      const int64_t n = std::min(chunk, kv_len - j0);
      const int32_t* block_ids = batch.block_ids.as<const int32_t>();
      bool packed = false;  // k16 / v16 hold the chunk (tc path only)
      if (heads_bf16) {
        gather_rows_bf16_kernel<<<unsigned(n), kChunkThreads, align(size_t(d_r) * 2), stream()>>>(
            cv, block_ids, batch.host_block_indptr[s], j0, int(rank), int(heads), int(d_n), n, x16, k16);
        MLA_GPU_LAUNCH_CHECK();
        // k16[h][j][:d_n] = bf16(W_h,k_nope c_j), v16[h][j] = bf16(W_h,v c_j); k_rope is in place.
        packed = linear_heads_bf16(*this, x16, n, kv_b_proj, int(heads), int(d_n), int(d_v), k16, dqk, v16, d_v);
      }
      if (!packed) {
        gather_rows_kernel<<<unsigned(n), kChunkThreads, 0, stream()>>>(cv, block_ids, batch.host_block_indptr[s], j0,
                                                                         int(rank), latent, rope);
        MLA_GPU_LAUNCH_CHECK();
        // kv[j] = kv_b_proj c_j: per head h, [k_nope (d_n) | v (d_v)] at offset h (d_n + d_v).
        linear(TensorView::contiguous(latent, DType::F32, {n, rank}), kv_b_proj,
               TensorView::contiguous(kv, DType::F32, {n, row_width}));
      }
      if (use_tc) {
        if (!packed) naive_tc_pack(kv, rope, n, int(heads), int(d_n), int(d_r), int(d_v), k16, v16, stream());
        t.q0 = q0;
        t.q_len = q_len;
        t.first_pos = kv_len - q_len;
        t.j0 = j0;
        t.n = n;
        t.first = j0 == 0;
        t.last = j0 + n >= kv_len;
        naive_tc_chunk(t, stream());
        continue;
      }
      a.j0 = j0;
      a.n = n;
      a.first = j0 == 0;
      a.last = j0 + n >= kv_len;
      const dim3 grid(unsigned((q_len + kRowTile - 1) / kRowTile), unsigned(heads));
      naive_chunk_kernel<<<grid, kChunkThreads, smem, stream()>>>(a);
      MLA_GPU_LAUNCH_CHECK();
    }
  }
}

}  // namespace mla::gpu
