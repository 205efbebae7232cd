// Parity of the GPU elementwise ops (gpu_elementwise.cu) with the CPU reference: embedding / row
// gather, rms_norm, add_rms_norm, copy, add, silu_mul and rope, at odd sizes that straddle the
// 256-thread blocks, on strided views and with the aliasing each op allows. Inputs of in-place and
// aliased cases are written into poisoned buffers, so stray writes outside the view still show.
#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu/parity.h"

namespace mla::test {
namespace {

// Writes `values` (row-major over the view's shape) into the host side of `t` and copies the whole
// buffer to the device; bytes outside the view keep whatever they held (poison for twin_output).
template <typename T> void fill_view(const Twin& t, const std::vector<T>& values) {
  const TensorView& v = t.cpu;
  MLA_CHECK(int64_t(values.size()) == v.numel(), "fill_view: {} values for {}", values.size(), v.describe());
  std::array<int64_t, kMaxDims> idx{};
  for (size_t k = 0; k < values.size(); ++k) {
    *v.at<T>(idx[0], idx[1], idx[2], idx[3]) = values[k];
    for (int d = v.ndim - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < v.shape[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
  sync_to_device(t);
}

// A poisoned buffer of `buffer_shape` whose view is `view` of it, filled with uniform [lo, hi).
Twin random_in_poison(std::mt19937& rng, const Twin& view, float lo = -1.0f, float hi = 1.0f) {
  fill_view(view, random_floats(rng, size_t(view.cpu.numel()), lo, hi));
  return view;
}

// A 1-D view of every other element of a [2n] buffer (a strided vector).
Twin every_other(const Twin& t) {
  Twin s = t;
  for (TensorView* v : {&s.cpu, &s.gpu}) {
    v->shape[0] /= 2;
    v->stride[0] = 2;
  }
  return s;
}

// Element-wise fp32 ops whose only difference from the CPU is expf/sqrt ulps or the order of a
// double sum: a few fp32 ulps.
const Tolerance kUlps{1e-7, 1e-6, "fp32: a few ulps (double row stats, libm vs CUDA expf <= 2 ulp)"};
const Tolerance kExact{0, 0, "pure data movement / one fp32 add: bit-exact"};

const int64_t kDims[] = {1, 7, 129, 7171};

TEST(GpuParityElementwise, Embedding) {
  std::mt19937 rng(101);
  for (DType table_dtype : {DType::F32, DType::BF16}) {
    for (int64_t d : kDims) {
      for (int64_t tokens : {int64_t(1), int64_t(19)}) {
        const int64_t vocab = 37;
        Twin table = twin_random(rng, table_dtype, {vocab, d});
        std::vector<int32_t> id_values(static_cast<size_t>(tokens));
        std::uniform_int_distribution<int32_t> pick_id(0, int32_t(vocab) - 1);
        for (auto& id : id_values) id = pick_id(rng);
        id_values[0] = int32_t(vocab) - 1;  // the last row is reachable
        Twin ids = twin_from_ints(id_values, {tokens});
        Twin out = twin_output(DType::F32, {tokens, d + 3}).slice(1, 2, d);  // strided rows
        run_both([&](ops::Backend& be, bool g) { be.embedding(pick(ids, g), pick(table, g), pick(out, g)); });
        EXPECT_TRUE(check_parity("embedding", fmt::format("{} table T={} D={}", dtype_name(table_dtype), tokens, d),
                                 out, kExact));
      }
    }
  }
}

TEST(GpuParityElementwise, EmbeddingStridedIdsAndTable) {
  std::mt19937 rng(102);
  const int64_t vocab = 111, d = 129, tokens = 19;
  // Row gather of activations: an F32 table whose rows are strided, ids with stride 2.
  Twin table = twin_random(rng, DType::F32, {vocab, d + 5}).slice(1, 1, d);
  Twin ids_buf = twin_random(rng, DType::I32, {2 * tokens}, 0.0f, float(vocab));
  Twin ids = every_other(ids_buf);
  Twin out = twin_output(DType::F32, {tokens, d});
  run_both([&](ops::Backend& be, bool g) { be.embedding(pick(ids, g), pick(table, g), pick(out, g)); });
  EXPECT_TRUE(check_parity("embedding", "F32 gather, strided table rows and ids", out, kExact));
}

// GPU-only: an out-of-range id cannot be CHECKed without a sync, so its row is NaN (documented).
TEST(GpuParityElementwise, EmbeddingBadIdGivesNanRow) {
  std::mt19937 rng(103);
  const int64_t vocab = 5, d = 7;
  Twin table = twin_random(rng, DType::BF16, {vocab, d});
  Twin ids = twin_from_ints({1, 5, -1}, {3});
  Twin out = twin_output(DType::F32, {3, d});
  gpu_backend().embedding(ids.gpu, table.gpu, out.gpu);
  const std::vector<float> got = gpu_values(out);
  for (int64_t i = 0; i < d; ++i) EXPECT_TRUE(std::isfinite(got[size_t(i)]));
  for (size_t i = size_t(d); i < got.size(); ++i) EXPECT_TRUE(std::isnan(got[i])) << i;
}

TEST(GpuParityElementwise, RmsNorm) {
  std::mt19937 rng(104);
  for (DType wdt : {DType::F32, DType::BF16}) {
    for (int64_t d : kDims) {
      for (int64_t rows : {int64_t(1), int64_t(19)}) {
        Twin w = twin_random(rng, wdt, {d}, 0.5f, 1.5f);
        // strided x and out: column slices of wider buffers
        Twin x = twin_random(rng, DType::F32, {rows, d + 4}, -2.0f, 2.0f).slice(1, 3, d);
        Twin out = twin_output(DType::F32, {rows, d + 1}).slice(1, 0, d);
        run_both([&](ops::Backend& be, bool g) { be.rms_norm(pick(x, g), pick(w, g), 1e-6f, pick(out, g)); });
        EXPECT_TRUE(check_parity("rms_norm", fmt::format("{} weight rows={} D={} strided", dtype_name(wdt), rows, d),
                                 out, kUlps));
        // out aliases x
        Twin inplace = random_in_poison(rng, twin_output(DType::F32, {rows, d + 2}).slice(1, 1, d), -2.0f, 2.0f);
        run_both([&](ops::Backend& be, bool g) {
          be.rms_norm(pick(inplace, g), pick(w, g), 1e-6f, pick(inplace, g));
        });
        EXPECT_TRUE(check_parity("rms_norm", fmt::format("{} weight rows={} D={} out==x", dtype_name(wdt), rows, d),
                                 inplace, kUlps));
      }
    }
  }
}

TEST(GpuParityElementwise, AddRmsNorm) {
  std::mt19937 rng(105);
  for (DType wdt : {DType::F32, DType::BF16}) {
    for (int64_t d : kDims) {
      for (int64_t rows : {int64_t(1), int64_t(111)}) {
        if (rows == 111 && d == 7171) continue;  // the large-D case runs at rows = 1
        Twin w = twin_random(rng, wdt, {d}, 0.5f, 1.5f);
        for (bool alias : {false, true}) {
          Twin residual = random_in_poison(rng, twin_output(DType::F32, {rows, d + 3}).slice(1, 3, d), -2.0f, 2.0f);
          Twin x = random_in_poison(rng, twin_output(DType::F32, {rows, d + 1}).slice(1, 1, d));
          Twin out = alias ? x : twin_output(DType::F32, {rows, d});
          run_both([&](ops::Backend& be, bool g) {
            be.add_rms_norm(pick(residual, g), pick(x, g), pick(w, g), 1e-5f, pick(out, g));
          });
          const std::string c = fmt::format("{} weight rows={} D={}{}", dtype_name(wdt), rows, d, alias ? " out==x" : "");
          EXPECT_TRUE(check_parity("add_rms_norm.residual", c, residual, kExact));
          EXPECT_TRUE(check_parity("add_rms_norm", c, out, kUlps));
        }
      }
    }
  }
}

TEST(GpuParityElementwise, Copy) {
  std::mt19937 rng(106);
  {  // 1-D
    Twin src = twin_random(rng, DType::F32, {989});
    Twin dst = twin_output(DType::F32, {989});
    run_both([&](ops::Backend& be, bool g) { be.copy(pick(src, g), pick(dst, g)); });
    EXPECT_TRUE(check_parity("copy", "1-D 989", dst, kExact));
  }
  {  // 3-D: the absorbed-query assembly, [T, H, 64] into a column slice of [T, H, 576]
    Twin src = twin_random(rng, DType::F32, {19, 7, 64 + 9}).slice(2, 9, 64);
    Twin dst = twin_output(DType::F32, {19, 7, 576}).slice(2, 512, 64);
    run_both([&](ops::Backend& be, bool g) { be.copy(pick(src, g), pick(dst, g)); });
    EXPECT_TRUE(check_parity("copy", "3-D [19,7,64] strided rows and heads", dst, kExact));
  }
  {  // inner dim strided: a transposed source view
    Twin base = twin_random(rng, DType::F32, {129, 19});
    Twin src = base;
    for (TensorView* v : {&src.cpu, &src.gpu}) {
      v->shape = {19, 129, 0, 0};
      v->stride = {1, 19, 0, 0};
    }
    Twin dst = twin_output(DType::F32, {19, 129});
    run_both([&](ops::Backend& be, bool g) { be.copy(pick(src, g), pick(dst, g)); });
    EXPECT_TRUE(check_parity("copy", "2-D transposed source (inner stride 19)", dst, kExact));
  }
  {  // 4-D odd extents, destination with strided inner dim
    Twin src = twin_random(rng, DType::F32, {3, 5, 7, 11});
    Twin dst_buf = twin_output(DType::F32, {3, 5, 7, 22});
    Twin dst = dst_buf;
    for (TensorView* v : {&dst.cpu, &dst.gpu}) {
      v->shape = {3, 5, 7, 11};
      v->stride = {5 * 7 * 22, 7 * 22, 22, 2};
    }
    run_both([&](ops::Backend& be, bool g) { be.copy(pick(src, g), pick(dst, g)); });
    EXPECT_TRUE(check_parity("copy", "4-D [3,5,7,11] inner-strided destination", dst, kExact));
  }
  {  // I32 (a draft's drawn ids into its next step's token ids): a row of a [K, P] id matrix
    Twin src = twin_random(rng, DType::I32, {5, 37}, -1000.0f, 129280.0f).slice(0, 3, 1).reshape({37});
    Twin dst = twin_output(DType::I32, {37});
    run_both([&](ops::Backend& be, bool g) { be.copy(pick(src, g), pick(dst, g)); });
    EXPECT_TRUE(check_parity("copy", "I32 [37] row of [5, 37]", dst, kExact));
  }
}

TEST(GpuParityElementwise, Add) {
  std::mt19937 rng(107);
  for (int64_t d : kDims) {
    Twin a = twin_random(rng, DType::F32, {19, d + 2}).slice(1, 2, d);
    Twin b = twin_random(rng, DType::F32, {19, d});
    Twin out = twin_output(DType::F32, {19, d + 1}).slice(1, 1, d);
    run_both([&](ops::Backend& be, bool g) { be.add(pick(a, g), pick(b, g), pick(out, g)); });
    EXPECT_TRUE(check_parity("add", fmt::format("2-D [19,{}] strided", d), out, kExact));
  }
  for (int which = 0; which < 2; ++which) {  // out aliases a, then b
    Twin a = random_in_poison(rng, twin_output(DType::F32, {111, 7, 130}).slice(2, 1, 129));
    Twin b = random_in_poison(rng, twin_output(DType::F32, {111, 7, 129}));
    const Twin& out = which == 0 ? a : b;
    run_both([&](ops::Backend& be, bool g) { be.add(pick(a, g), pick(b, g), pick(out, g)); });
    EXPECT_TRUE(check_parity("add", which == 0 ? "3-D out==a" : "3-D out==b", out, kExact));
  }
  {  // 1-D
    Twin a = twin_random(rng, DType::F32, {1});
    Twin b = twin_random(rng, DType::F32, {1});
    Twin out = twin_output(DType::F32, {1});
    run_both([&](ops::Backend& be, bool g) { be.add(pick(a, g), pick(b, g), pick(out, g)); });
    EXPECT_TRUE(check_parity("add", "1-D [1]", out, kExact));
  }
}

TEST(GpuParityElementwise, SiluMul) {
  std::mt19937 rng(108);
  for (int64_t d : kDims) {
    for (int64_t rows : {int64_t(1), int64_t(19)}) {
      // gate in [-12, 12] covers both saturated ends of the sigmoid.
      Twin gate = twin_random(rng, DType::F32, {rows, d + 3}, -12.0f, 12.0f).slice(1, 0, d);
      Twin up = twin_random(rng, DType::F32, {rows, d + 2}).slice(1, 2, d);
      Twin out = twin_output(DType::F32, {rows, d});
      run_both([&](ops::Backend& be, bool g) { be.silu_mul(pick(gate, g), pick(up, g), pick(out, g)); });
      EXPECT_TRUE(check_parity("silu_mul", fmt::format("rows={} D={} strided", rows, d), out, kUlps));
      Twin g2 = random_in_poison(rng, twin_output(DType::F32, {rows, d + 1}).slice(1, 1, d), -12.0f, 12.0f);
      run_both([&](ops::Backend& be, bool g) { be.silu_mul(pick(g2, g), pick(up, g), pick(g2, g)); });
      EXPECT_TRUE(check_parity("silu_mul", fmt::format("rows={} D={} out==gate", rows, d), g2, kUlps));
    }
  }
}

TEST(GpuParityElementwise, Rope) {
  std::mt19937 rng(109);
  // Rotation of values in [-1, 1] by cos/sin that differ from glibc's by <= 2 fp32 ulps: absolute
  // error <= ~4 ulp(1) even where x0 c - x1 s cancels, hence an absolute term as well.
  const Tolerance tol{2e-6, 2e-6, "precise cosf/sinf (<= 2 ulp) of the identical fp32 angle"};
  struct Case {
    int64_t tokens, heads, rope_dim, head_stride;  // head_stride > rope_dim: rope part of a wider head
  };
  for (const Case c : {Case{1, 1, 2, 2}, Case{19, 5, 64, 192}, Case{7, 128, 64, 64}, Case{111, 3, 66, 70}}) {
    const int64_t pairs = c.rope_dim / 2;
    std::vector<float> inv(static_cast<size_t>(pairs));
    for (int64_t i = 0; i < pairs; ++i) inv[size_t(i)] = float(std::pow(10000.0, -2.0 * double(i) / double(c.rope_dim)));
    Twin inv_freq = twin_from_floats(inv, {pairs});
    Twin pos_buf = twin_random(rng, DType::I32, {2 * c.tokens}, 0.0f, 131072.0f);
    Twin positions = every_other(pos_buf);
    Twin x = random_in_poison(
        rng, twin_output(DType::F32, {c.tokens, c.heads, c.head_stride}).slice(2, c.head_stride - c.rope_dim, c.rope_dim));
    ops::RopeTable cpu_table{inv_freq.cpu, 1.2f}, gpu_table{inv_freq.gpu, 1.2f};
    run_both([&](ops::Backend& be, bool g) { be.rope(pick(x, g), pick(positions, g), g ? gpu_table : cpu_table); });
    EXPECT_TRUE(check_parity("rope", fmt::format("T={} H={} rope_dim={} head stride {}", c.tokens, c.heads,
                                                 c.rope_dim, c.head_stride),
                             x, tol));
  }
}

// ---- decode-shape cases of the latency-bound kernels (register-resident rms_norm, split embedding
// and rope grids). Rows of D % 4 == 0 whose buffers keep 16-byte alignment take rms_norm's vector
// kernel; D > 16384, a strided weight or a misaligned row take the general kernel.
const int64_t kVecDims[] = {4, 512, 1536, 7168, 16384, 16388};

TEST(GpuParityElementwise, RmsNormVectorPath) {
  std::mt19937 rng(110);
  for (DType wdt : {DType::F32, DType::BF16}) {
    for (int64_t d : kVecDims) {
      for (int64_t rows : {int64_t(1), int64_t(3), int64_t(19)}) {
        Twin w = twin_random(rng, wdt, {d}, 0.5f, 1.5f);
        // aligned column slices (offset 4 of a row 8 wider): the vector kernel with row strides
        Twin x = twin_random(rng, DType::F32, {rows, d + 8}, -2.0f, 2.0f).slice(1, 4, d);
        Twin out = twin_output(DType::F32, {rows, d + 4}).slice(1, 0, d);
        run_both([&](ops::Backend& be, bool g) { be.rms_norm(pick(x, g), pick(w, g), 1e-6f, pick(out, g)); });
        EXPECT_TRUE(check_parity("rms_norm", fmt::format("vec {} weight rows={} D={}", dtype_name(wdt), rows, d), out,
                                 kUlps));
        Twin inplace = random_in_poison(rng, twin_output(DType::F32, {rows, d}), -2.0f, 2.0f);
        run_both([&](ops::Backend& be, bool g) {
          be.rms_norm(pick(inplace, g), pick(w, g), 1e-6f, pick(inplace, g));
        });
        EXPECT_TRUE(check_parity("rms_norm", fmt::format("vec {} weight rows={} D={} out==x", dtype_name(wdt), rows, d),
                                 inplace, kUlps));
      }
    }
  }
  // Aligned rows with a strided weight: the general kernel.
  std::mt19937 rng2(111);
  Twin w_buf = twin_random(rng2, DType::F32, {2 * 512}, 0.5f, 1.5f);
  Twin w = every_other(w_buf);
  Twin x = twin_random(rng2, DType::F32, {3, 512}, -2.0f, 2.0f);
  Twin out = twin_output(DType::F32, {3, 512});
  run_both([&](ops::Backend& be, bool g) { be.rms_norm(pick(x, g), pick(w, g), 1e-6f, pick(out, g)); });
  EXPECT_TRUE(check_parity("rms_norm", "F32 strided weight rows=3 D=512", out, kUlps));
}

TEST(GpuParityElementwise, AddRmsNormVectorPath) {
  std::mt19937 rng(112);
  for (DType wdt : {DType::F32, DType::BF16}) {
    for (int64_t d : kVecDims) {
      for (int64_t rows : {int64_t(1), int64_t(7)}) {
        Twin w = twin_random(rng, wdt, {d}, 0.5f, 1.5f);
        // out: separate, == x, == residual
        for (int alias = 0; alias < 3; ++alias) {
          Twin residual = random_in_poison(rng, twin_output(DType::F32, {rows, d + 8}).slice(1, 4, d), -2.0f, 2.0f);
          Twin x = random_in_poison(rng, twin_output(DType::F32, {rows, d}));
          Twin out = alias == 1 ? x : alias == 2 ? residual : twin_output(DType::F32, {rows, d});
          run_both([&](ops::Backend& be, bool g) {
            be.add_rms_norm(pick(residual, g), pick(x, g), pick(w, g), 1e-5f, pick(out, g));
          });
          const std::string c = fmt::format("vec {} weight rows={} D={}{}", dtype_name(wdt), rows, d,
                                            alias == 1 ? " out==x" : alias == 2 ? " out==residual" : "");
          if (alias != 2) {
            EXPECT_TRUE(check_parity("add_rms_norm.residual", c, residual, kExact));
          }
          EXPECT_TRUE(check_parity("add_rms_norm", c, out, kUlps));
        }
      }
    }
  }
}

TEST(GpuParityElementwise, EmbeddingDecodeRows) {
  std::mt19937 rng(113);
  for (DType table_dtype : {DType::F32, DType::BF16}) {
    for (int64_t d : {int64_t(1024), int64_t(1025), int64_t(7168)}) {
      for (int64_t tokens : {int64_t(1), int64_t(3)}) {
        const int64_t vocab = 19;
        Twin table = twin_random(rng, table_dtype, {vocab, d});
        Twin ids = twin_random(rng, DType::I32, {tokens}, 0.0f, float(vocab));
        Twin out = twin_output(DType::F32, {tokens, d});
        run_both([&](ops::Backend& be, bool g) { be.embedding(pick(ids, g), pick(table, g), pick(out, g)); });
        EXPECT_TRUE(check_parity("embedding", fmt::format("{} table T={} D={} (column blocks)",
                                                          dtype_name(table_dtype), tokens, d),
                                 out, kExact));
      }
    }
  }
}

// The MLA decode shapes (q_pe of 128 heads inside 192-wide heads, the single k_rope row) and head
// counts whose (head, pair) count straddles the 1024-element blocks, in both pair layouts.
TEST(GpuParityElementwise, RopeDecodeShapes) {
  std::mt19937 rng(114);
  const Tolerance tol{2e-6, 2e-6, "precise cosf/sinf (<= 2 ulp) of the identical fp32 angle"};
  struct Case {
    int64_t tokens, heads, rope_dim, head_stride;
  };
  for (bool interleaved : {true, false}) {
    for (const Case c : {Case{1, 128, 64, 192}, Case{1, 1, 64, 64}, Case{3, 128, 64, 192}, Case{7, 129, 64, 66},
                         Case{1, 33, 62, 62}}) {
      const int64_t pairs = c.rope_dim / 2;
      std::vector<float> inv(static_cast<size_t>(pairs));
      for (int64_t i = 0; i < pairs; ++i)
        inv[size_t(i)] = float(std::pow(10000.0, -2.0 * double(i) / double(c.rope_dim)));
      Twin inv_freq = twin_from_floats(inv, {pairs});
      Twin positions = twin_random(rng, DType::I32, {c.tokens}, 0.0f, 163840.0f);
      Twin x = random_in_poison(rng, twin_output(DType::F32, {c.tokens, c.heads, c.head_stride})
                                         .slice(2, c.head_stride - c.rope_dim, c.rope_dim));
      ops::RopeTable cpu_table{inv_freq.cpu, 0.9f, interleaved}, gpu_table{inv_freq.gpu, 0.9f, interleaved};
      run_both([&](ops::Backend& be, bool g) { be.rope(pick(x, g), pick(positions, g), g ? gpu_table : cpu_table); });
      EXPECT_TRUE(check_parity("rope", fmt::format("{} T={} H={} rope_dim={} head stride {}",
                                                   interleaved ? "interleaved" : "rotate_half", c.tokens, c.heads,
                                                   c.rope_dim, c.head_stride),
                               x, tol));
    }
  }
}

}  // namespace
}  // namespace mla::test
