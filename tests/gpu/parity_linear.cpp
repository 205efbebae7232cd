// Parity of the GPU linear op (gpu_linear.cu, gpu_linear_blas.cu) with the CPU reference: every weight
// kind x every dispatch path (generic SIMT, decode GEMV vectorized and scalar, cuBLASLt split-bf16,
// tensor-core, dequantize-to-bf16 + cuBLASLt) x
// odd shapes that straddle the tiles, contiguous and strided x/out rows, both GemmPrecision modes, and
// graph capture/replay. The exact paths are held to fp32 reassociation error; Bf16 to 2^-8.
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>

#include "backend/gpu/gpu_backend.h"
#include "backend/gpu/gpu_linear.h"
#include "gpu/parity.h"

namespace mla::test {
namespace {

using gpu::LinearPath;

// in: 1 and 7 (below every vec), 129/300/2053 (odd, scalar GEMV), 512 (16-byte rows in every format:
// vectorized GEMV), 1020 (INT4 rows of 128 words with a partial last group: vector tail masking).
const int64_t kIns[] = {1, 7, 129, 300, 512, 1020, 2053};
const int64_t kOuts[] = {1, 13, 257, 1000};
const WeightKind kKinds[] = {WeightKind::F32,  WeightKind::BF16,      WeightKind::F16,
                             WeightKind::FP8,  WeightKind::INT4_BF16, WeightKind::INT4_F32};

const char* path_name(LinearPath p) {
  switch (p) {
    case LinearPath::Auto: return "auto";
    case LinearPath::Generic: return "generic";
    case LinearPath::Gemv: return "gemv";
    case LinearPath::Blas: return "blas";
    case LinearPath::TensorCore: return "tensorcore";
    case LinearPath::DequantBlas: return "dequant-blas";
    case LinearPath::GemvTc: return "gemv-tc";
  }
  return "?";
}

// x uniform in [-1, 1), |W| <= 0.5 (amp): sum_i |x_i W_i| is about K / 8; 2x that bounds it for the
// tolerances below.
double abs_dot_bound(int64_t in) { return 0.25 * double(in) + 1.0; }

// Exact paths: fp32 products, fp32 sums in another order than the CPU's 16-lane dot: 1e-6 of
// sum|x w| (the Fp32 GemmPrecision contract) plus a relative term for large outputs.
Tolerance exact_tol(int64_t in) { return {1e-6 * abs_dot_bound(in), 1e-5, "fp32 reassociation over K: 1e-6 sum|xw|"}; }
// Bf16 GemmPrecision: x rounded to bf16 (2^-9 relative per term), fp32 accumulation.
Tolerance bf16_tol(int64_t in) { return {std::ldexp(1.0, -8) * abs_dot_bound(in), 0.0, "bf16 x: 2^-8 sum|xw|"}; }
// DequantBlas: x and W each rounded to bf16 (2^-9 relative each), so each product is off by at most
// 2^-8 (+2^-18) relative: 2^-8 sum|xw| <= 2^-9 abs_dot_bound, plus fp32 accumulation (~1e-6). The
// bound below is 2x that worst case.
Tolerance dequant_tol(int64_t in) {
  return {std::ldexp(1.0, -8) * abs_dot_bound(in), 0.0, "bf16 x and bf16 W: 2^-8 sum|xw|, 2x margin"};
}

// x [T, in] and a poisoned out [T, n_out]; strided: column slices of wider buffers at odd offsets
// (rows not 16-byte aligned).
struct LinearIo {
  Twin x, out;
};
LinearIo make_io(std::mt19937& rng, int64_t T, int64_t in, int64_t n_out, bool strided) {
  if (!strided) return {twin_random(rng, DType::F32, {T, in}), twin_output(DType::F32, {T, n_out})};
  return {twin_random(rng, DType::F32, {T, in + 5}).slice(1, 3, in),
          twin_output(DType::F32, {T, n_out + 3}).slice(1, 1, n_out)};
}

// Runs the CPU reference and `gpu_be` (through `path`) on the same inputs and checks parity.
void check_case(ops::Backend& gpu_be, WeightKind kind, const TwinWeight& w, std::mt19937& rng, int64_t T, bool strided,
                LinearPath path, const Tolerance& tol, const std::string& tag) {
  const int64_t in = w.cpu.in_features, n_out = w.cpu.out_features;
  LinearIo io = make_io(rng, T, in, n_out, strided);
  cpu_backend().linear(io.x.cpu, w.cpu, io.out.cpu);
  gpu::linear_with_path(gpu_be, io.x.gpu, w.gpu, io.out.gpu, path);
  gpu_be.synchronize();
  const std::string name = fmt::format("{} {} T={} in={} out={}{}{}", weight_kind_name(kind), path_name(path),
                                       T, in, n_out, strided ? " strided" : "", tag);
  EXPECT_TRUE(check_parity("linear", name, io.out, tol));
}

// Every kind x every shape through the generic kernel and the GEMV (T = 1, 3, 16; vectorized where
// the rows are 16-byte aligned, scalar otherwise), and through Auto at prefill sizes (on CUDA:
// cuBLASLt for BF16, dequantized split-bf16 cuBLASLt for FP8 and INT4; generic for F32/F16 and on HIP). Strided and
// contiguous layouts alternate from case to case (9 flips per shape, so each T gets both).
void sweep_kind(WeightKind kind, uint32_t seed) {
  std::mt19937 rng(seed);
  int flip = 0;
  for (int64_t in : kIns)
    for (int64_t n_out : kOuts) {
      TwinWeight w;
      make_twin_weight(w, rng, kind, n_out, in);
      const Tolerance tol = exact_tol(in);
      auto run = [&](int64_t T, LinearPath path) {
        check_case(gpu_backend(), kind, w, rng, T, (flip++ & 1) != 0, path, tol, "");
      };
      for (int64_t T : {1, 3, 16}) run(T, LinearPath::Gemv);
      for (int64_t T : {1, 70}) run(T, LinearPath::Generic);
      for (int64_t T : {17, 111, 300}) run(T, LinearPath::Auto);
      ++flip;
    }
}

}  // namespace

TEST(GpuParityLinear, F32) { sweep_kind(WeightKind::F32, 1101); }
TEST(GpuParityLinear, Bf16) { sweep_kind(WeightKind::BF16, 1102); }
TEST(GpuParityLinear, F16) { sweep_kind(WeightKind::F16, 1103); }
TEST(GpuParityLinear, Fp8) { sweep_kind(WeightKind::FP8, 1104); }
TEST(GpuParityLinear, Int4Bf16Scale) { sweep_kind(WeightKind::INT4_BF16, 1105); }
TEST(GpuParityLinear, Int4F32Scale) { sweep_kind(WeightKind::INT4_F32, 1106); }

// More row blocks than the GEMV's capped grid (2112 CTAs x 8 rows), so CTAs loop over row blocks: K
// resident in one smem chunk (x staged once per CTA, T = 1 and 3) and K past it (8200 > 8192: staged
// per chunk in every row block), BF16 and FP8, both layouts.
TEST(GpuParityLinear, GemvManyRowBlocks) {
  std::mt19937 rng(1111);
  for (const WeightKind kind : {WeightKind::BF16, WeightKind::FP8})
    for (int64_t in : {520, 8200}) {
      TwinWeight w;
      make_twin_weight(w, rng, kind, 17003, in);
      for (int64_t T : {1, 3})
        for (bool strided : {false, true})
          check_case(gpu_backend(), kind, w, rng, T, strided, LinearPath::Gemv, exact_tol(in), " many row blocks");
    }
}

// The cuBLASLt path forced (it also takes T <= 16 when asked), Fp32 split precision, both layouts,
// and a GEMV forced past 16 tokens (it runs in groups of 16).
TEST(GpuParityLinear, ForcedPaths) {
  if (!gpu::linear_has_blas()) GTEST_SKIP() << "no cuBLASLt in this build";
  std::mt19937 rng(1107);
  for (int64_t in : {7, 300, 512, 2053})
    for (int64_t n_out : {13, 1000}) {
      TwinWeight w;
      make_twin_weight(w, rng, WeightKind::BF16, n_out, in);
      for (int64_t T : {1, 5, 17, 111, 300})
        for (bool strided : {false, true})
          check_case(gpu_backend(), WeightKind::BF16, w, rng, T, strided, LinearPath::Blas, exact_tol(in), "");
      check_case(gpu_backend(), WeightKind::BF16, w, rng, 37, true, LinearPath::Gemv, exact_tol(in), "");
    }
}

// The tensor-core path forced for the quantized kinds at small T too (one partial M tile), odd K
// (partial last FP8 block / INT4 group), strided and contiguous.
TEST(GpuParityLinear, TensorCoreQuantized) {
  std::mt19937 rng(1110);
  for (WeightKind kind : {WeightKind::FP8, WeightKind::INT4_BF16, WeightKind::INT4_F32})
    for (int64_t in : {7, 129, 300, 1020, 2053})
      for (int64_t n_out : {13, 257}) {
        TwinWeight w;
        make_twin_weight(w, rng, kind, n_out, in);
        if (!gpu::linear_tc_supports(w.gpu)) GTEST_SKIP() << "no mma.sync path in this build";
        for (int64_t T : {1, 5, 64, 130})
          check_case(gpu_backend(), kind, w, rng, T, T % 2 != 0, LinearPath::TensorCore, exact_tol(in), "");
      }
}

// GemmPrecision::Bf16 on its own backend: cuBLASLt with x rounded once (2^-8 tolerance), FP8/INT4 at
// prefill through DequantBlas (W rounded to bf16 too); the GEMV and generic kernels stay exact here.
TEST(GpuParityLinear, Bf16Precision) {
  auto made = gpu::make_gpu_backend({.gemm_precision = gpu::GemmPrecision::Bf16});
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  std::unique_ptr<ops::Backend> bf16_be = std::move(made).value();
  std::mt19937 rng(1108);
  for (int64_t in : {7, 512, 2053})
    for (int64_t n_out : {13, 257, 1000}) {
      TwinWeight w;
      make_twin_weight(w, rng, WeightKind::BF16, n_out, in);
      for (int64_t T : {17, 111, 300})
        for (bool strided : {false, true})
          check_case(*bf16_be, WeightKind::BF16, w, rng, T, strided, LinearPath::Auto, bf16_tol(in), " [bf16 mode]");
      check_case(*bf16_be, WeightKind::BF16, w, rng, 3, false, LinearPath::Auto, exact_tol(in), " [bf16 mode]");
      check_case(*bf16_be, WeightKind::BF16, w, rng, 40, true, LinearPath::Generic, exact_tol(in), " [bf16 mode]");
    }
  for (WeightKind kind : {WeightKind::FP8, WeightKind::INT4_BF16, WeightKind::INT4_F32})
    for (int64_t in : {300, 2053}) {
      TwinWeight w;
      make_twin_weight(w, rng, kind, 257, in);
      for (int64_t T : {17, 200})
        check_case(*bf16_be, kind, w, rng, T, T == 17, LinearPath::Auto, dequant_tol(in), " [bf16 mode]");
    }
}

// The tensor-core decode matvec (GemvTc; Auto's pick for FP8, INT4-BF16-scale and BF16 at T <= 16
// in Bf16 mode): x rounded once (f16 for FP8, bf16 otherwise: within bf16_tol), W exact. Shapes: a
// few 64-row CTAs and 2-5 K chunks, one 64-row CTA with the most K splits (32 x 1-2 chunks),
// DeepSeek's kv_a (576 x 7168), and one 64-row CTA whose split's K range is larger than the kernel
// stages in shared memory (98304 in for FP8 and INT4, 49152 for BF16: several windows at 8
// columns); T across the 8-column passes (1, 3, 8, 9, 16), strided (scalar x loads) and contiguous
// rows. The six calls per weight reuse the split-K tickets, which each call must leave at zero: a
// stale ticket leaves the poisoned output unwritten. Weights the path must refuse (odd in / out,
// INT4 with F32 scales, F16) fall back: Auto stays exact there.
TEST(GpuParityLinear, GemvTensorCore) {
  auto made = gpu::make_gpu_backend({.gemm_precision = gpu::GemmPrecision::Bf16});
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  std::unique_ptr<ops::Backend> bf16_be = std::move(made).value();
  std::mt19937 rng(1112);
  struct Shape {
    WeightKind kind;
    int64_t in, out;
  };
  const Shape takes[] = {{WeightKind::FP8, 320, 192},       {WeightKind::FP8, 2560, 64},
                         {WeightKind::FP8, 7168, 576},      {WeightKind::INT4_BF16, 384, 128},
                         {WeightKind::INT4_BF16, 4096, 64}, {WeightKind::INT4_BF16, 1024, 320},
                         {WeightKind::FP8, 98304, 64},      {WeightKind::INT4_BF16, 98304, 64},
                         {WeightKind::BF16, 320, 192},      {WeightKind::BF16, 7168, 576},
                         {WeightKind::BF16, 49152, 64}};
  int flip = 0;
  for (const Shape& sh : takes) {
    TwinWeight w;
    make_twin_weight(w, rng, sh.kind, sh.out, sh.in);
    if (!gpu::linear_gemv_tc_supports(*bf16_be, w.gpu)) GTEST_SKIP() << "no tensor-core decode path here";
    for (int64_t T : {1, 3, 8, 9, 16})
      check_case(*bf16_be, sh.kind, w, rng, T, (flip++ & 1) != 0, LinearPath::GemvTc, bf16_tol(sh.in), " [bf16 mode]");
    check_case(*bf16_be, sh.kind, w, rng, 5, true, LinearPath::Auto, bf16_tol(sh.in), " [bf16 mode]");

  }
  const Shape refuses[] = {{WeightKind::FP8, 300, 192},
                           {WeightKind::FP8, 320, 100},
                           {WeightKind::INT4_F32, 384, 128},
                           {WeightKind::BF16, 300, 192},
                           {WeightKind::F16, 320, 192}};
  for (const Shape& sh : refuses) {
    TwinWeight w;
    make_twin_weight(w, rng, sh.kind, sh.out, sh.in);
    EXPECT_FALSE(gpu::linear_gemv_tc_supports(*bf16_be, w.gpu)) << weight_kind_name(sh.kind) << " " << sh.in;
    check_case(*bf16_be, sh.kind, w, rng, 3, false, LinearPath::Auto, exact_tol(sh.in), " [bf16 mode, falls back]");
  }
}

// DequantBlas forced (Auto picks it for FP8/INT4 at T > 16 on CUDA) in both precisions: Bf16 (W
// rounded to bf16: dequant_tol) and Fp32 (W as 3 exact bf16 terms: exact_tol). Odd K (partial FP8
// block / INT4 group, unaligned rows -> scalar dequant), chunked output rows (chunk 128: out = 1000
// is 7 chunks + a tail of 104; chunk 40: columns of out at 160-byte offsets), strided and
// contiguous, T in {17, 300}.
TEST(GpuParityLinear, DequantBlas) {
  if (!gpu::linear_has_blas()) GTEST_SKIP() << "no cuBLASLt in this build";
  auto made = gpu::make_gpu_backend({.gemm_precision = gpu::GemmPrecision::Bf16});
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  std::unique_ptr<ops::Backend> bf16_be = std::move(made).value();
  std::mt19937 rng(1111);
  int flip = 0;
  for (const bool bf16 : {true, false}) {
    ops::Backend& be = bf16 ? *bf16_be : gpu_backend();
    for (WeightKind kind : {WeightKind::FP8, WeightKind::INT4_BF16, WeightKind::INT4_F32})
      for (int64_t in : {7, 300, 512, 1020, 2053})
        for (int64_t n_out : {13, 257, 1000}) {
          TwinWeight w;
          make_twin_weight(w, rng, kind, n_out, in);
          const Tolerance tol = bf16 ? dequant_tol(in) : exact_tol(in);
          const char* mode = bf16 ? "bf16" : "fp32";
          for (int64_t rows : {0, 128, 40}) {
            if (rows != 0 && n_out <= rows) continue;  // one chunk either way
            gpu::linear_set_dequant_chunk_rows(be, rows);
            for (int64_t T : {17, 300})
              check_case(be, kind, w, rng, T, (flip++ & 1) != 0, LinearPath::DequantBlas, tol,
                         fmt::format(" [{} mode, chunk {}]", mode, rows));
          }
          gpu::linear_set_dequant_chunk_rows(be, 0);
          check_case(be, kind, w, rng, 111, true, LinearPath::Auto, tol, fmt::format(" [{} mode]", mode));
        }
  }
}

// linear_group against the CPU's separate calls. One tensor-core launch (Bf16 mode, T <= 16):
// DeepSeek's q_a + kv_a (FP8, 1536 + 576 rows of 7168: K split over 33 row blocks, so the split-K
// tickets and partial planes span both parts), a 64-row part between wider ones, three INT4 parts,
// four BF16 parts (the most a launch takes), each call reusing the tickets the last one left at zero.
// Separate calls: mixed formats, a width the path refuses, different widths, T = 17 (prefill paths)
// and the exact Fp32 precision. Outputs strided and contiguous in turn; x too.
TEST(GpuParityLinear, Group) {
  auto made = gpu::make_gpu_backend({.gemm_precision = gpu::GemmPrecision::Bf16});
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  std::unique_ptr<ops::Backend> bf16_be = std::move(made).value();
  struct Part {
    WeightKind kind;
    int64_t in, out;
  };
  struct Group {
    std::vector<Part> parts;
    bool one_launch;  // at T <= 16 in Bf16 mode
  };
  const Group groups[] = {
      {{{WeightKind::FP8, 7168, 1536}, {WeightKind::FP8, 7168, 576}}, true},
      {{{WeightKind::FP8, 2560, 192}, {WeightKind::FP8, 2560, 64}, {WeightKind::FP8, 2560, 320}}, true},
      {{{WeightKind::INT4_BF16, 1024, 320}, {WeightKind::INT4_BF16, 1024, 128}, {WeightKind::INT4_BF16, 1024, 64}},
       true},
      {{{WeightKind::BF16, 320, 192}, {WeightKind::BF16, 320, 64}, {WeightKind::BF16, 320, 128},
        {WeightKind::BF16, 320, 256}},
       true},
      {{{WeightKind::FP8, 512, 128}, {WeightKind::BF16, 512, 128}}, false},
      {{{WeightKind::FP8, 512, 128}, {WeightKind::FP8, 512, 100}}, false},
      {{{WeightKind::FP8, 512, 128}, {WeightKind::FP8, 640, 128}}, false},
  };
  std::mt19937 rng(1113);
  int flip = 0;
  for (const Group& grp : groups) {
    const size_t n = grp.parts.size();
    std::vector<TwinWeight> tw(n);
    std::vector<const ops::Weight*> wc, wg;
    for (size_t i = 0; i < n; ++i) {
      make_twin_weight(tw[i], rng, grp.parts[i].kind, grp.parts[i].out, grp.parts[i].in);
      wc.push_back(&tw[i].cpu);
      wg.push_back(&tw[i].gpu);
    }
    const int64_t in0 = grp.parts[0].in;
    for (const bool bf16 : {true, false})
      for (const int64_t T : {1, 3, 9, 16, 17}) {
        if (!bf16 && T > 3) continue;
        ops::Backend& be = bf16 ? *bf16_be : gpu_backend();
        // Parts of different widths take x of part 0's width only if they match; give each group
        // one x of its own width (the mismatched group runs with per-part x below).
        const bool same_in = std::all_of(grp.parts.begin(), grp.parts.end(), [&](const Part& p) { return p.in == in0; });
        const bool expect_one = bf16 && T <= 16 && grp.one_launch && gpu::linear_gemv_tc_supports(be, tw[0].gpu);
        EXPECT_EQ(expect_one, gpu::linear_group_one_launch(be, T, wg)) << "group " << &grp - groups << " T " << T;
        if (!same_in) continue;  // weights of different widths cannot share x: only the decision is checked
        const bool strided = (flip++ & 1) != 0;
        Twin x = strided ? twin_random(rng, DType::F32, {T, in0 + 5}).slice(1, 3, in0)
                         : twin_random(rng, DType::F32, {T, in0});
        std::vector<Twin> outs;
        std::vector<TensorView> oc, og;
        for (size_t i = 0; i < n; ++i) {
          const int64_t o = grp.parts[i].out;
          outs.push_back(strided ? twin_output(DType::F32, {T, o + 3}).slice(1, 1, o) : twin_output(DType::F32, {T, o}));
          oc.push_back(outs.back().cpu);
          og.push_back(outs.back().gpu);
        }
        cpu_backend().linear_group(x.cpu, wc, oc);
        be.linear_group(x.gpu, wg, og);
        be.synchronize();
        const Tolerance tol = bf16 ? bf16_tol(in0) : exact_tol(in0);
        for (size_t i = 0; i < n; ++i)
          EXPECT_TRUE(check_parity("linear_group",
                                   fmt::format("{} part {}/{} in={} out={} T={}{}{}", weight_kind_name(grp.parts[i].kind),
                                               i, n, in0, grp.parts[i].out, T, strided ? " strided" : "",
                                               expect_one ? " [one launch]" : bf16 ? " [bf16 mode, separate]" : ""),
                                   outs[i], tol));
        if (!expect_one || T != 3) continue;
        // Captured and replayed into freshly poisoned outputs (the eager call above grew the scratch).
        std::vector<Twin> fresh;
        std::vector<TensorView> fg;
        for (size_t i = 0; i < n; ++i) {
          fresh.push_back(twin_output(DType::F32, {T, grp.parts[i].out}));
          fg.push_back(fresh.back().gpu);
        }
        const TensorView xg = x.gpu;
        std::unique_ptr<ops::OpGraph> graph = be.capture([&] { be.linear_group(xg, wg, fg); });
        graph->replay();
        be.synchronize();
        for (size_t i = 0; i < n; ++i) {
          cpu_backend().linear(x.cpu, *wc[i], fresh[i].cpu);
          EXPECT_TRUE(check_parity("linear_group", fmt::format("graph replay part {}/{} T={}", i, n, T), fresh[i], tol));
        }
      }
  }
}

// Decode (GEMV) and prefill (cuBLASLt) calls recorded into a graph and replayed give the eager values:
// the launches depend only on shapes and the scratch was grown by the eager warm-up.
TEST(GpuParityLinear, GraphReplay) {
  std::mt19937 rng(1109);
  for (WeightKind kind : {WeightKind::BF16, WeightKind::FP8, WeightKind::INT4_BF16})
    for (int64_t T : {1, 4, 200}) {
      const int64_t in = 1024, n_out = 333;
      TwinWeight w;
      make_twin_weight(w, rng, kind, n_out, in);
      LinearIo io = make_io(rng, T, in, n_out, true);
      cpu_backend().linear(io.x.cpu, w.cpu, io.out.cpu);
      ops::Backend& be = gpu_backend();
      be.linear(io.x.gpu, w.gpu, io.out.gpu);  // eager warm-up: grows the scratch
      be.synchronize();
      // Poison the output again so that only the replay can pass.
      Twin fresh = twin_output(DType::F32, {T, n_out + 3}).slice(1, 1, n_out);
      const TensorView x = io.x.gpu, out = fresh.gpu;
      const ops::Weight& wg = w.gpu;
      std::unique_ptr<ops::OpGraph> graph = be.capture([&] { be.linear(x, wg, out); });
      graph->replay();
      be.synchronize();
      cpu_backend().linear(io.x.cpu, w.cpu, fresh.cpu);
      EXPECT_TRUE(check_parity("linear", fmt::format("{} graph replay T={} in={} out={}", weight_kind_name(kind), T, in,
                                                     n_out),
                               fresh, exact_tol(in)));
    }
}

}  // namespace mla::test
