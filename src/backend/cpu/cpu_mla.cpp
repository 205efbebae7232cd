// CPU reference for MLA over the paged latent cache: cache writes, the naive (decompressed per head)
// attention, the absorbed (MQA over the latent) attention and the two absorption GEMMs. Both
// attention forms walk the keys in chunks of positions with an online (running max, running
// sum) softmax, so memory is bounded by one chunk at any context length; the price is recomputing
// the decompressed keys per chunk in the naive form, which is a prefill/reference path only. The
// cache is F32 or BF16 (written rounded to nearest even, read back exactly), so both forms see the
// same fp32 values whatever the cache dtype.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>


#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace mla::cpu {

void check_attention_batch(const TensorView& cache, const ops::AttentionBatch& batch, int64_t num_tokens,
                           const char* op) {
  MLA_CHECK(cache.ndim == 3 && batch.block_size > 0 && cache.dim(1) == batch.block_size,
            "{}: cache {} vs block_size {}", op, cache.describe(), batch.block_size);
  const int64_t seqs = batch.num_seqs;
  MLA_CHECK(seqs >= 0 && batch.host_q_indptr.size() == size_t(seqs + 1) && batch.host_kv_lens.size() == size_t(seqs) &&
                batch.host_block_indptr.size() == size_t(seqs + 1),
            "{}: host mirrors sized {}/{}/{} for {} sequences", op, batch.host_q_indptr.size(),
            batch.host_kv_lens.size(), batch.host_block_indptr.size(), seqs);
  MLA_CHECK(batch.host_q_indptr[0] == 0 && batch.host_q_indptr[size_t(seqs)] == num_tokens,
            "{}: q_indptr spans [{}, {}), want [0, {})", op, batch.host_q_indptr[0],
            batch.host_q_indptr[size_t(seqs)], num_tokens);
  MLA_CHECK(batch.host_block_indptr[0] >= 0 && size_t(batch.host_block_indptr[size_t(seqs)]) <= batch.host_block_ids.size(),
            "{}: block_indptr ends at {} but there are {} block ids", op, batch.host_block_indptr[size_t(seqs)],
            batch.host_block_ids.size());
  const int64_t num_blocks = cache.dim(0);
  for (size_t s = 0; s < size_t(seqs); ++s) {
    const int64_t q_len = batch.host_q_indptr[s + 1] - batch.host_q_indptr[s];
    const int64_t kv_len = batch.host_kv_lens[s];
    const int64_t blocks = batch.host_block_indptr[s + 1] - batch.host_block_indptr[s];
    MLA_CHECK(q_len >= 0 && kv_len >= q_len, "{}: seq {} has q_len {} kv_len {}", op, s, q_len, kv_len);
    MLA_CHECK(blocks >= 0 && blocks * batch.block_size >= kv_len, "{}: seq {} has {} blocks for {} tokens", op, s,
              blocks, kv_len);
    for (int64_t b = 0; b < (kv_len + batch.block_size - 1) / batch.block_size; ++b) {
      const int32_t id = batch.host_block_ids[size_t(batch.host_block_indptr[s] + b)];
      MLA_CHECK(id >= 0 && id < num_blocks, "{}: seq {} block {} id {} outside [0, {})", op, s, b, id, num_blocks);
    }
  }
}

namespace {

// Key positions per chunk. Naive form: 256, to amortize decompressing the chunk (a GEMM with all of
// kv_b_proj); at 128 heads x (d_n + d_v) = 256 the decompressed chunk is 256 x 32768 fp32 = 32 MB,
// 256 KB per head, which stays in L2 while one thread runs that head's query rows. Absorbed form:
// 64 cache rows (147 KB at kv_dim 576), small enough to stay in L2 while every (row, head) reads it;
// rescaling the running sums once per chunk costs < 1%.
constexpr int64_t kNaiveKeyChunk = 256;
constexpr int64_t kAbsorbedKeyChunk = 64;
// Below this much work (query rows x heads x keys) a parallel region costs more than it saves.
constexpr int64_t kParallelMinWork = 1 << 14;

// Validates an AttentionBatch against the cache and the token count (host mirrors are authoritative).
void check_batch(const TensorView& cache, const ops::AttentionBatch& batch, const ops::MlaDims& dims,
                 int64_t num_tokens) {
  MLA_CHECK((cache.dtype == DType::F32 || cache.dtype == DType::BF16) && cache.ndim == 3 && cache.is_contiguous(),
            "attention: cache {} must be contiguous F32 or BF16 [blocks, block_size, kv_dim]", cache.describe());
  MLA_CHECK(cache.dim(2) == dims.kv_dim(), "attention: cache {} vs kv_dim {}", cache.describe(), dims.kv_dim());
  check_attention_batch(cache, batch, num_tokens, "attention");
}

// The cache row of absolute position `pos` of sequence `s` as fp32. An F32 cache is read in place; a
// BF16 row is widened (exactly) into `staging` [kv_dim], which must outlive the returned pointer.
const float* cache_row(const TensorView& cache, const ops::AttentionBatch& batch, size_t s, int64_t pos,
                       float* staging) {
  const int32_t block = batch.host_block_ids[size_t(batch.host_block_indptr[s] + pos / batch.block_size)];
  if (cache.dtype == DType::F32) return cache.at<const float>(block, pos % batch.block_size);
  const uint16_t* src = cache.at<const uint16_t>(block, pos % batch.block_size);
  for (int64_t c = 0; c < cache.dim(2); ++c) staging[c] = bf16_to_f32(src[c]);
  return staging;
}

void check_kv_b(const ops::Weight& kv_b_proj, const ops::MlaDims& dims) {
  const Status st = ops::validate_weight(kv_b_proj);
  MLA_CHECK(st.is_ok(), "kv_b_proj: {}", st.message());
  MLA_CHECK(dims.num_heads > 0 && dims.kv_lora_rank > 0 && dims.qk_nope_head_dim > 0 && dims.v_head_dim > 0 &&
                dims.qk_rope_head_dim >= 0,
            "MlaDims: heads {} d_n {} d_r {} d_v {} r {}", dims.num_heads, dims.qk_nope_head_dim,
            dims.qk_rope_head_dim, dims.v_head_dim, dims.kv_lora_rank);
  MLA_CHECK(kv_b_proj.in_features == dims.kv_lora_rank &&
                kv_b_proj.out_features == int64_t(dims.num_heads) * (dims.qk_nope_head_dim + dims.v_head_dim),
            "kv_b_proj [{}, {}] vs {} heads x ({} + {}) rows, rank {}", kv_b_proj.out_features, kv_b_proj.in_features,
            dims.num_heads, dims.qk_nope_head_dim, dims.v_head_dim, dims.kv_lora_rank);
}

// A [T, H, d] F32 activation with contiguous last dim.
void check_heads(const TensorView& v, int64_t tokens, int64_t heads, int64_t d, const char* what) {
  check_view(v, DType::F32, 3, what);
  MLA_CHECK(v.dim(0) == tokens && v.dim(1) == heads && v.dim(2) == d, "{}: {} (want [{}, {}, {}])", what,
            v.describe(), tokens, heads, d);
}

// Online softmax for one (query row, head). `m` is the running max of the scores seen so far, `l` the
// running sum of exp(score - m) and `acc` the running sum of exp(score - m) * value. Invariant after
// each fold: acc / l is the exact softmax-weighted mean of the values seen so far.
struct SoftmaxState {
  float* m;
  float* l;
  float* acc;
};

template <typename ValueAt>
void softmax_fold(const float* scores, int64_t n, ValueAt value_at, int64_t dv, SoftmaxState st) {
  float chunk_max = scores[0];
  for (int64_t j = 1; j < n; ++j) chunk_max = std::max(chunk_max, scores[j]);
  const float m_new = std::max(*st.m, chunk_max);
  // exp(-inf) = 0 on the first chunk, where l and acc are still 0.
  const float correction = std::exp(*st.m - m_new);
  *st.l *= correction;
  for (int64_t d = 0; d < dv; ++d) st.acc[d] *= correction;
  for (int64_t j = 0; j < n; ++j) {
    const float p = std::exp(scores[j] - m_new);
    *st.l += p;
    axpy(p, value_at(j), st.acc, dv);
  }
  *st.m = m_new;
}

// Sets up the softmax state of every (row, head) of rows [q0, q0 + q_len) (out rows double as acc).
void softmax_begin(float* m, float* l, const TensorView& out, int64_t q0, int64_t q_len) {
  const int64_t heads = out.dim(1), dv = out.dim(2);
  for (int64_t i = q0; i < q0 + q_len; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      m[i * heads + h] = -std::numeric_limits<float>::infinity();
      l[i * heads + h] = 0.0f;
      std::fill_n(out.at<float>(i, h), dv, 0.0f);
    }
}

// out = acc / l. l > 0: every query row sees at least cache position 0.
void softmax_end(const float* l, const TensorView& out, int64_t q0, int64_t q_len) {
  const int64_t heads = out.dim(1), dv = out.dim(2);
  for (int64_t i = q0; i < q0 + q_len; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      float* o = out.at<float>(i, h);
      const float inv = 1.0f / l[i * heads + h];
      for (int64_t d = 0; d < dv; ++d) o[d] *= inv;
    }
}

}  // namespace

void CpuBackend::kv_cache_write(const TensorView& latent, const TensorView& slot_mapping, const TensorView& cache) {
  check_view(latent, DType::F32, 2, "kv_cache_write latent");
  MLA_CHECK((cache.dtype == DType::F32 || cache.dtype == DType::BF16) && cache.ndim == 3 && cache.is_contiguous(),
            "kv_cache_write: cache {} must be contiguous F32 or BF16 [blocks, block_size, kv_dim]", cache.describe());
  const int64_t num_tokens = latent.dim(0), kv_dim = latent.dim(1);
  MLA_CHECK(cache.dim(2) == kv_dim, "kv_cache_write: latent {} vs cache {}", latent.describe(), cache.describe());
  check_vector(slot_mapping, DType::I32, num_tokens, "kv_cache_write slot_mapping");
  const int64_t num_slots = cache.dim(0) * cache.dim(1);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int32_t slot = i32_at(slot_mapping, t);
    MLA_CHECK(slot >= 0 && slot < num_slots, "kv_cache_write: slot {} of token {} outside [0, {})", slot, t,
              num_slots);
    const float* src = latent.at<const float>(t);
    if (cache.dtype == DType::F32) {
      std::memcpy(cache.as<float>() + int64_t(slot) * kv_dim, src, size_t(kv_dim) * sizeof(float));
    } else {  // BF16: round to nearest even, the one rounding every backend applies
      uint16_t* dst = cache.as<uint16_t>() + int64_t(slot) * kv_dim;
      for (int64_t c = 0; c < kv_dim; ++c) dst[c] = f32_to_bf16(src[c]);
    }
  }
}

void CpuBackend::mla_attention_naive(const TensorView& q, const TensorView& cache, const ops::Weight& kv_b_proj,
                                     const ops::AttentionBatch& batch, const ops::MlaDims& dims,
                                     const TensorView& out) {
  check_kv_b(kv_b_proj, dims);
  const int64_t heads = dims.num_heads, d_n = dims.qk_nope_head_dim, d_r = dims.qk_rope_head_dim;
  const int64_t d_v = dims.v_head_dim, rank = dims.kv_lora_rank;
  const int64_t num_tokens = q.ndim == 3 ? q.dim(0) : 0;
  check_heads(q, num_tokens, heads, d_n + d_r, "mla_attention_naive q");
  check_heads(out, num_tokens, heads, d_v, "mla_attention_naive out");
  MLA_CHECK(!views_alias(q, out), "mla_attention_naive: out aliases q");
  check_batch(cache, batch, dims, num_tokens);

  const int64_t row_width = heads * (d_n + d_v);  // decompressed row: per head [k_nope | v]
  float* m = grow(attn_max_, size_t(num_tokens * heads));
  float* l = grow(attn_sum_, size_t(num_tokens * heads));
  float* latent = grow(attn_latent_, size_t(kNaiveKeyChunk * rank));
  float* keys = grow(attn_keys_, size_t(kNaiveKeyChunk * row_width));
  const float** rows = grow(attn_rows_, size_t(kNaiveKeyChunk));
  // BF16 cache: the chunk's rows widened to fp32 (rows[j] points here; unused for an F32 cache).
  // head_weight_ is free during attention (only absorb_q / expand_v use it, and ops do not overlap).
  float* staging = grow(head_weight_, size_t(kNaiveKeyChunk * dims.kv_dim()));
  const float scale = dims.softmax_scale;

  for (size_t s = 0; s < size_t(batch.num_seqs); ++s) {
    const int64_t q0 = batch.host_q_indptr[s], q_len = batch.host_q_indptr[s + 1] - q0;
    const int64_t kv_len = batch.host_kv_lens[s];
    if (q_len == 0) continue;
    const int64_t first_pos = kv_len - q_len;  // absolute position of the sequence's first query row
    softmax_begin(m, l, out, q0, q_len);
    for (int64_t j0 = 0; j0 < kv_len; j0 += kNaiveKeyChunk) {
      const int64_t n = std::min(kNaiveKeyChunk, kv_len - j0);
      for (int64_t j = 0; j < n; ++j) {
        rows[j] = cache_row(cache, batch, s, j0 + j, staging + j * dims.kv_dim());
        std::memcpy(latent + j * rank, rows[j], size_t(rank) * sizeof(float));
      }
      // keys[j] = kv_b_proj c_j: per head h, [k_nope (d_n) | v (d_v)] at offset h * (d_n + d_v).
      linear(TensorView::contiguous(latent, DType::F32, {n, rank}), kv_b_proj,
             TensorView::contiguous(keys, DType::F32, {n, row_width}));
#pragma omp parallel for schedule(static) if (q_len * heads * n >= kParallelMinWork)
      for (int64_t hi = 0; hi < heads * q_len; ++hi) {
        // Head-major, so a thread walks the query rows of one head over that head's keys (in L2).
        const int64_t h = hi / q_len, i = hi % q_len;
        const int64_t visible = std::min(n, first_pos + i - j0 + 1);  // causal: positions <= first_pos + i
        if (visible <= 0) continue;
        const float* qh = q.at<const float>(q0 + i, h);
        const int64_t head_off = h * (d_n + d_v);
        float scores[kNaiveKeyChunk];
        for (int64_t j = 0; j < visible; ++j)
          scores[j] = scale * (dot(qh, keys + j * row_width + head_off, d_n) + dot(qh + d_n, rows[j] + rank, d_r));
        const int64_t state = (q0 + i) * heads + h;
        softmax_fold(
            scores, visible, [&](int64_t j) { return keys + j * row_width + head_off + d_n; }, d_v,
            SoftmaxState{m + state, l + state, out.at<float>(q0 + i, h)});
      }
    }
    softmax_end(l, out, q0, q_len);
  }
}

void CpuBackend::mla_attention_absorbed(const TensorView& q, const TensorView& cache, const ops::AttentionBatch& batch,
                                        const ops::MlaDims& dims, const TensorView& out) {
  const int64_t heads = dims.num_heads, rank = dims.kv_lora_rank, kv_dim = dims.kv_dim();
  MLA_CHECK(heads > 0 && rank > 0 && dims.qk_rope_head_dim >= 0, "MlaDims: heads {} r {} d_r {}", heads, rank,
            dims.qk_rope_head_dim);
  const int64_t num_tokens = q.ndim == 3 ? q.dim(0) : 0;
  check_heads(q, num_tokens, heads, kv_dim, "mla_attention_absorbed q");
  check_heads(out, num_tokens, heads, rank, "mla_attention_absorbed out");
  MLA_CHECK(!views_alias(q, out), "mla_attention_absorbed: out aliases q");
  check_batch(cache, batch, dims, num_tokens);

  float* m = grow(attn_max_, size_t(num_tokens * heads));
  float* l = grow(attn_sum_, size_t(num_tokens * heads));
  const float** rows = grow(attn_rows_, size_t(kAbsorbedKeyChunk));
  float* staging = grow(head_weight_, size_t(kAbsorbedKeyChunk * kv_dim));  // BF16 rows widened (see naive)
  const float scale = dims.softmax_scale;

  for (size_t s = 0; s < size_t(batch.num_seqs); ++s) {
    const int64_t q0 = batch.host_q_indptr[s], q_len = batch.host_q_indptr[s + 1] - q0;
    const int64_t kv_len = batch.host_kv_lens[s];
    if (q_len == 0) continue;
    const int64_t first_pos = kv_len - q_len;
    softmax_begin(m, l, out, q0, q_len);
    for (int64_t j0 = 0; j0 < kv_len; j0 += kAbsorbedKeyChunk) {
      const int64_t n = std::min(kAbsorbedKeyChunk, kv_len - j0);
      for (int64_t j = 0; j < n; ++j) rows[j] = cache_row(cache, batch, s, j0 + j, staging + j * kv_dim);
#pragma omp parallel for schedule(static) if (q_len * heads * n >= kParallelMinWork)
      for (int64_t ih = 0; ih < q_len * heads; ++ih) {
        const int64_t i = ih / heads, h = ih % heads;
        const int64_t visible = std::min(n, first_pos + i - j0 + 1);
        if (visible <= 0) continue;
        // One shared KV head: key = the whole cache row [c | k_rope], value = its first r values (c).
        const float* qh = q.at<const float>(q0 + i, h);
        float scores[kAbsorbedKeyChunk];
        for (int64_t j = 0; j < visible; ++j) scores[j] = scale * dot(qh, rows[j], kv_dim);
        const int64_t state = (q0 + i) * heads + h;
        softmax_fold(
            scores, visible, [&](int64_t j) { return rows[j]; }, rank,
            SoftmaxState{m + state, l + state, out.at<float>(q0 + i, h)});
      }
    }
    softmax_end(l, out, q0, q_len);
  }
}

void CpuBackend::mla_absorb_q(const TensorView& q_nope, const ops::Weight& kv_b_proj, const ops::MlaDims& dims,
                              const TensorView& out) {
  check_kv_b(kv_b_proj, dims);
  const int64_t heads = dims.num_heads, d_n = dims.qk_nope_head_dim, d_v = dims.v_head_dim;
  const int64_t rank = dims.kv_lora_rank;
  const int64_t num_tokens = q_nope.ndim == 3 ? q_nope.dim(0) : 0;
  check_heads(q_nope, num_tokens, heads, d_n, "mla_absorb_q q_nope");
  check_heads(out, num_tokens, heads, rank, "mla_absorb_q out");
  MLA_CHECK(!views_alias(q_nope, out), "mla_absorb_q: out aliases q_nope");
  if (num_tokens == 0) return;
  // Heads are independent: one OpenMP thread per head, each with its own dequantized W_UK[h]. Each
  // output row is accumulated in a fixed order (axpy over d_n), independent of how many tokens the
  // call holds, so decode results do not depend on the batch (ARCHITECTURE rule 8; sgemm would).
  const int threads = int(std::min<int64_t>(omp_get_max_threads(), heads));
  float* scratch = grow(head_weight_, size_t(threads) * size_t(d_n * rank));
#pragma omp parallel for schedule(static) num_threads(threads) if (num_tokens * heads * d_n * rank >= kParallelMinWork)
  for (int64_t h = 0; h < heads; ++h) {
    float* w_uk = scratch + size_t(omp_get_thread_num()) * size_t(d_n * rank);
    ops::dequantize_rows(kv_b_proj, h * (d_n + d_v), d_n, w_uk);  // W_UK[h]: [d_n, r]
    for (int64_t t = 0; t < num_tokens; ++t) {
      // out[t, h, :] [r] = sum_d q_nope[t, h, d] * W_UK[h][d, :]
      const float* q = q_nope.at<const float>(t, h);
      float* o = out.at<float>(t, h);
      std::fill(o, o + rank, 0.0f);
      for (int64_t d = 0; d < d_n; ++d) axpy(q[d], w_uk + d * rank, o, rank);
    }
  }
}

void CpuBackend::mla_expand_v(const TensorView& o_latent, const ops::Weight& kv_b_proj, const ops::MlaDims& dims,
                              const TensorView& out) {
  check_kv_b(kv_b_proj, dims);
  const int64_t heads = dims.num_heads, d_n = dims.qk_nope_head_dim, d_v = dims.v_head_dim;
  const int64_t rank = dims.kv_lora_rank;
  const int64_t num_tokens = o_latent.ndim == 3 ? o_latent.dim(0) : 0;
  check_heads(o_latent, num_tokens, heads, rank, "mla_expand_v o_latent");
  check_heads(out, num_tokens, heads, d_v, "mla_expand_v out");
  MLA_CHECK(!views_alias(o_latent, out), "mla_expand_v: out aliases o_latent");
  if (num_tokens == 0) return;
  const int threads = int(std::min<int64_t>(omp_get_max_threads(), heads));
  float* scratch = grow(head_weight_, size_t(threads) * size_t(d_v * rank));
#pragma omp parallel for schedule(static) num_threads(threads) if (num_tokens * heads * d_v * rank >= kParallelMinWork)
  for (int64_t h = 0; h < heads; ++h) {
    float* w_uv = scratch + size_t(omp_get_thread_num()) * size_t(d_v * rank);
    ops::dequantize_rows(kv_b_proj, h * (d_n + d_v) + d_n, d_v, w_uv);  // W_UV[h]: [d_v, r]
    // out[t, h, v] = W_UV[h][v, :] . o_latent[t, h, :] (fixed-order dot: batch-invariant)
    for (int64_t t = 0; t < num_tokens; ++t)
      for (int64_t v = 0; v < d_v; ++v) out.at<float>(t, h)[v] = dot(w_uv + v * rank, o_latent.at<const float>(t, h), rank);
  }
}

}  // namespace mla::cpu
