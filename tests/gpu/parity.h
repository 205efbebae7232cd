// The one parity harness (STYLE 1-2, ARCHITECTURE rule 2): every GPU op is run against the CPU
// reference on the same fresh random inputs. Outputs are poisoned before each run (0xFF bytes, NaN, for
// floats; kPoisonI32 for ints), every element of the output view must be written and within tolerance,
// and every byte of the output buffer outside the view must still hold the poison. Each comparison is a
// row of the summary table printed at exit.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/backend.h"
#include "unit/cpu_test_util.h"

namespace mla::test {

ops::Backend& cpu_backend();
ops::Backend& gpu_backend();

// The I32 poison: a value no op writes (ids are in [0, V) or [0, E), counts in [0, K+1], and
// speculative_verify pads with -1, so -1 would hide a missed write). Every byte is 0x7F, so the
// outside-the-view check stays a byte compare.
inline constexpr int32_t kPoisonI32 = 0x7F7F7F7F;

// A tensor with the same bytes on both backends. `cpu` and `gpu` are views of equal layout into the
// two buffers (a slice of a Twin is a Twin of the same buffers).
struct Twin {
  std::shared_ptr<Buffer> host_buf, dev_buf;
  TensorView cpu, gpu;

  Twin slice(int d, int64_t start, int64_t len) const;
  Twin reshape(std::initializer_list<int64_t> dims) const;
  // Element offset of the view's first element within its buffer.
  int64_t offset() const;
};

// Uniform random values in [lo, hi) (F32/BF16/F16), or integers in [lo, hi) for I32.
Twin twin_random(std::mt19937& rng, DType dtype, std::initializer_list<int64_t> shape, float lo = -1.0f,
                 float hi = 1.0f);
Twin twin_from_floats(const std::vector<float>& values, std::initializer_list<int64_t> shape);
Twin twin_from_ints(const std::vector<int32_t>& values, std::initializer_list<int64_t> shape);
// An output: both buffers poisoned (0xFF bytes: NaN for floats; kPoisonI32 for I32). `shape` may be a
// larger buffer that the test slices; the untouched remainder is checked to stay poisoned.
Twin twin_output(DType dtype, std::initializer_list<int64_t> shape);
// Copies the host buffer to the device again (after a CPU op wrote an input both must see).
void sync_to_device(const Twin& t);

// The GPU buffer's bytes, and the CPU view's values as floats (F32/BF16/I32 widened).
std::vector<float> gpu_values(const Twin& t);
std::vector<float> cpu_values(const Twin& t);

// A weight in the same packed format on both backends (built by cpu_test_util's quantizers).
struct TwinWeight {
  TestWeight host;
  std::vector<std::shared_ptr<Buffer>> dev;
  ops::Weight cpu, gpu;
};
enum class WeightKind { F32, BF16, F16, FP8, INT4_BF16, INT4_F32 };
const char* weight_kind_name(WeightKind k);
void make_twin_weight(TwinWeight& tw, std::mt19937& rng, WeightKind kind, int64_t out, int64_t in, float amp = 0.5f);

// |gpu - cpu| <= atol + rtol * |cpu| per element; `basis` says why (e.g. "fp32 reassociation, K=7168").
struct Tolerance {
  double atol = 0, rtol = 0;
  std::string basis;
};

// Compares the output view element by element (floats within `tol`, and written: not NaN; I32 exactly,
// and not kPoisonI32), checks poison outside the view, records one summary row, and returns the
// verdict for EXPECT_TRUE.
::testing::AssertionResult check_parity(const std::string& op, const std::string& case_name, const Twin& out,
                                        const Tolerance& tol);

// Runs `fn` on the CPU backend with the CPU views and on the GPU backend with the GPU views.
template <typename Fn> void run_both(Fn&& fn) {
  fn(cpu_backend(), false);
  fn(gpu_backend(), true);
  gpu_backend().synchronize();
}

// Picks the view of a twin for the backend being run (`on_gpu` from run_both).
inline const TensorView& pick(const Twin& t, bool on_gpu) { return on_gpu ? t.gpu : t.cpu; }
inline const ops::Weight& pick(const TwinWeight& w, bool on_gpu) { return on_gpu ? w.gpu : w.cpu; }

// An attention step's batch on both backends: the block tables of make_paged_layout (three blocks
// nobody owns) and twins of its arrays. Heap-held: the host mirrors point into the layout's vectors.
struct TwinBatch : PagedLayout {
  Twin q_indptr_t, kv_lens_t, block_indptr_t, block_ids_t, slot_mapping_t;
  ops::AttentionBatch cpu, gpu;
};
std::unique_ptr<TwinBatch> make_twin_batch(std::mt19937& rng, const std::vector<SeqSpec>& seqs, int block_size);
inline const ops::AttentionBatch& pick(const TwinBatch& b, bool on_gpu) { return on_gpu ? b.gpu : b.cpu; }
// MLA head geometry for attention cases, with the model's softmax scale 1 / sqrt(d_nope + d_rope);
// deepseek_mla_dims is DeepSeek-V3 / Kimi's (128 + 64 query dims, 128 value dims, rank 512).
inline ops::MlaDims mla_dims(int heads, int d_n, int d_r, int d_v, int rank) {
  return ops::MlaDims{heads, d_n, d_r, d_v, rank, 1.0f / std::sqrt(float(d_n + d_r))};
}
inline ops::MlaDims deepseek_mla_dims(int heads) { return mla_dims(heads, 128, 64, 128, 512); }
// "q_len/kv_len,..." for case names.
std::string seqs_name(const std::vector<SeqSpec>& seqs);

}  // namespace mla::test
