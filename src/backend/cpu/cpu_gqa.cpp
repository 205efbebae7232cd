// CPU reference for the Llama-style ops of draft heads (EAGLE-3): the paged K/V cache write, grouped-
// query attention over it, and the column scatter that maps a reduced draft vocabulary onto the
// target's. Attention walks the keys in chunks with an online softmax (as cpu_mla.cpp), so memory
// stays bounded at any context; a BF16 cache is widened once per chunk, shared by every head.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace mla::cpu {

namespace {

// Key positions per chunk: 64 rows of 2 * KVH * D (8 KV heads x 128: 256 KB fp32) stay in L2 while
// every (query row, head) of the sequence reads them.
constexpr int64_t kKeyChunk = 64;
constexpr int64_t kParallelMinWork = 1 << 14;  // query rows x heads x keys

void check_gqa_dims(const ops::GqaDims& d) {
  MLA_CHECK(d.num_heads > 0 && d.num_kv_heads > 0 && d.head_dim > 0 && d.num_heads % d.num_kv_heads == 0,
            "GqaDims: heads {} kv heads {} head_dim {} (heads must be a multiple of kv heads)", d.num_heads,
            d.num_kv_heads, d.head_dim);
}

void check_gqa_cache(const TensorView& cache, int64_t row_width, const char* op) {
  MLA_CHECK((cache.dtype == DType::F32 || cache.dtype == DType::BF16) && cache.ndim == 3 && cache.is_contiguous(),
            "{}: cache {} must be contiguous F32 or BF16 [blocks, block_size, 2*KVH*D]", op, cache.describe());
  MLA_CHECK(cache.dim(2) == row_width, "{}: cache {} rows are not 2*KVH*D = {}", op, cache.describe(), row_width);
}

// An F32 [T, width] view with contiguous rows' last dim.
void check_rows(const TensorView& v, int64_t rows, int64_t width, const char* what) {
  check_view(v, DType::F32, 2, what);
  MLA_CHECK(v.dim(0) == rows && v.dim(1) == width, "{}: {} (want [{}, {}])", what, v.describe(), rows, width);
}

}  // namespace

void CpuBackend::gqa_cache_write(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                                 const TensorView& cache) {
  check_view(k, DType::F32, 2, "gqa_cache_write k");
  const int64_t num_tokens = k.dim(0), width = k.dim(1);  // width = KVH * D
  check_rows(v, num_tokens, width, "gqa_cache_write v");
  check_gqa_cache(cache, 2 * width, "gqa_cache_write");
  check_vector(slot_mapping, DType::I32, num_tokens, "gqa_cache_write slot_mapping");
  const int64_t num_slots = cache.dim(0) * cache.dim(1);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int32_t slot = i32_at(slot_mapping, t);
    MLA_CHECK(slot >= 0 && slot < num_slots, "gqa_cache_write: slot {} of token {} outside [0, {})", slot, t,
              num_slots);
    const float* halves[2] = {k.at<const float>(t), v.at<const float>(t)};
    for (int64_t half = 0; half < 2; ++half) {
      const int64_t off = (int64_t(slot) * 2 + half) * width;
      if (cache.dtype == DType::F32) {
        std::memcpy(cache.as<float>() + off, halves[half], size_t(width) * sizeof(float));
      } else {  // round to nearest even, the one rounding every backend applies
        uint16_t* dst = cache.as<uint16_t>() + off;
        for (int64_t c = 0; c < width; ++c) dst[c] = f32_to_bf16(halves[half][c]);
      }
    }
  }
}

void CpuBackend::gqa_attention(const TensorView& q, const TensorView& cache, const ops::AttentionBatch& batch,
                               const ops::GqaDims& dims, const TensorView& out) {
  check_gqa_dims(dims);
  const int64_t heads = dims.num_heads, head_dim = dims.head_dim, group = dims.num_heads / dims.num_kv_heads;
  const int64_t kv_width = int64_t(dims.num_kv_heads) * head_dim;  // k half of a cache row
  const int64_t num_tokens = q.ndim == 2 ? q.dim(0) : 0;
  check_rows(q, num_tokens, heads * head_dim, "gqa_attention q");
  check_rows(out, num_tokens, heads * head_dim, "gqa_attention out");
  MLA_CHECK(!views_alias(q, out), "gqa_attention: out aliases q");
  check_gqa_cache(cache, dims.cache_row_width(), "gqa_attention");
  check_attention_batch(cache, batch, num_tokens, "gqa_attention");

  float* m = grow(attn_max_, size_t(num_tokens * heads));
  float* l = grow(attn_sum_, size_t(num_tokens * heads));
  const float** rows = grow(attn_rows_, size_t(kKeyChunk));
  // BF16 rows widened to fp32 (head_weight_ is free: only absorb_q / expand_v use it; ops do not overlap).
  float* staging = grow(head_weight_, size_t(kKeyChunk * 2 * kv_width));
  const float scale = dims.softmax_scale;

  for (size_t s = 0; s < size_t(batch.num_seqs); ++s) {
    const int64_t q0 = batch.host_q_indptr[s], q_len = batch.host_q_indptr[s + 1] - q0;
    const int64_t kv_len = batch.host_kv_lens[s];
    if (q_len == 0) continue;
    const int64_t first_pos = kv_len - q_len;  // absolute position of the sequence's first query row
    for (int64_t i = q0; i < q0 + q_len; ++i) {
      std::fill_n(m + i * heads, heads, -std::numeric_limits<float>::infinity());
      std::fill_n(l + i * heads, heads, 0.0f);
      std::fill_n(out.at<float>(i), heads * head_dim, 0.0f);  // the accumulator
    }
    for (int64_t j0 = 0; j0 < kv_len; j0 += kKeyChunk) {
      const int64_t n = std::min(kKeyChunk, kv_len - j0);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t pos = j0 + j;
        const int32_t block = batch.host_block_ids[size_t(batch.host_block_indptr[s] + pos / batch.block_size)];
        if (cache.dtype == DType::F32) {
          rows[j] = cache.at<const float>(block, pos % batch.block_size);
        } else {
          const uint16_t* src = cache.at<const uint16_t>(block, pos % batch.block_size);
          float* dst = staging + j * 2 * kv_width;
          for (int64_t c = 0; c < 2 * kv_width; ++c) dst[c] = bf16_to_f32(src[c]);
          rows[j] = dst;
        }
      }
#pragma omp parallel for schedule(static) if (q_len * heads * n >= kParallelMinWork)
      for (int64_t ih = 0; ih < q_len * heads; ++ih) {
        const int64_t i = ih / heads, h = ih % heads;
        const int64_t visible = std::min(n, first_pos + i - j0 + 1);  // causal: positions <= first_pos + i
        if (visible <= 0) continue;
        const int64_t k_off = (h / group) * head_dim, v_off = kv_width + k_off;
        const float* qh = q.at<const float>(q0 + i) + h * head_dim;
        float* acc = out.at<float>(q0 + i) + h * head_dim;
        float scores[kKeyChunk];
        float chunk_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          scores[j] = scale * dot(qh, rows[j] + k_off, head_dim);
          chunk_max = std::max(chunk_max, scores[j]);
        }
        // Online softmax (invariant: acc / l is the softmax-weighted mean of the values seen so far).
        float& m_ih = m[(q0 + i) * heads + h];
        float& l_ih = l[(q0 + i) * heads + h];
        const float m_new = std::max(m_ih, chunk_max);
        const float correction = std::exp(m_ih - m_new);  // 0 on the first chunk, where l and acc are 0
        l_ih *= correction;
        for (int64_t d = 0; d < head_dim; ++d) acc[d] *= correction;
        for (int64_t j = 0; j < visible; ++j) {
          const float p = std::exp(scores[j] - m_new);
          l_ih += p;
          axpy(p, rows[j] + v_off, acc, head_dim);
        }
        m_ih = m_new;
      }
    }
    // l > 0: every query row sees at least cache position 0.
    for (int64_t i = q0; i < q0 + q_len; ++i)
      for (int64_t h = 0; h < heads; ++h) {
        float* acc = out.at<float>(i) + h * head_dim;
        const float inv = 1.0f / l[i * heads + h];
        for (int64_t d = 0; d < head_dim; ++d) acc[d] *= inv;
      }
  }
}

void CpuBackend::scatter_columns(const TensorView& src, const TensorView& index, float fill, const TensorView& out) {
  check_view(src, DType::F32, 2, "scatter_columns src");
  check_view(out, DType::F32, 2, "scatter_columns out");
  const int64_t rows = src.dim(0), width = src.dim(1), vocab = out.dim(1);
  MLA_CHECK(out.dim(0) == rows, "scatter_columns: src {} vs out {}", src.describe(), out.describe());
  check_vector(index, DType::I32, width, "scatter_columns index");
  MLA_CHECK(!views_alias(src, out), "scatter_columns: out aliases src");
  for (int64_t d = 0; d < width; ++d) {
    const int32_t col = i32_at(index, d);
    MLA_CHECK(col >= 0 && col < vocab, "scatter_columns: index[{}] = {} outside [0, {})", d, col, vocab);
  }
  for (int64_t n = 0; n < rows; ++n) {
    float* o = out.at<float>(n);
    const float* x = src.at<const float>(n);
    std::fill_n(o, vocab, fill);
    for (int64_t d = 0; d < width; ++d) o[i32_at(index, d)] = x[d];
  }
}

}  // namespace mla::cpu
