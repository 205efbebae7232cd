// Tokenizer encode throughput on one core: o200k over a text file (multi-MB), against
// tools/bench_tiktoken.py on the same file and rank file. Reports MB/s of UTF-8 input, best of N.
// Napkin math: the PCRE2 pre-tokenization pass alone runs at ~35 MB/s on one core (TOOLCHAIN.md),
// which bounds the whole encode; BPE on pieces that are not one vocab entry comes on top.
// Usage: mla_bench_tokenizer --ranks o200k_base.tiktoken [--repeat 3] CORPUS.txt
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  CLI::App app{"o200k encode throughput on one core"};
  std::string corpus, ranks, pattern = "o200k";
  int repeat = 3;
  app.add_option("corpus", corpus, "UTF-8 text file")->required();
  app.add_option("--ranks", ranks, "o200k_base.tiktoken")->required();
  app.add_option("--pattern", pattern, "kimi | o200k | cl100k");
  app.add_option("--repeat", repeat, "runs (best is reported)");
  CLI11_PARSE(app, argc, argv);

  auto tok = mla::tokenizer::Tokenizer::from_tiktoken_file(ranks, pattern);
  if (!tok) {
    std::fprintf(stderr, "%s\n", tok.status().message().c_str());
    return 1;
  }
  std::ifstream f(corpus, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  if (text.empty()) {
    std::fprintf(stderr, "%s: empty or unreadable\n", corpus.c_str());
    return 1;
  }
  double best = 1e30;
  size_t n = 0;
  mla::tokenizer::EncodeOptions plain{mla::tokenizer::EncodeOptions::Special::None};  // as encode_ordinary
  for (int r = 0; r < repeat; ++r) {
    // A fresh tokenizer per run would reset the piece cache; the first run is the cold one.
    const auto t0 = std::chrono::steady_clock::now();
    n = (*tok)->encode(text, plain).size();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("run %d: %.2f MB/s%s\n", r, text.size() / 1e6 / s, r == 0 ? " (cold piece cache)" : "");
    best = std::min(best, s);
  }
  std::printf("mlaserve %s: %.2f MB, %zu tokens, %.2f MB/s (best of %d)\n", pattern.c_str(), text.size() / 1e6, n,
              text.size() / 1e6 / best, repeat);
  return 0;
}
