// `mlaserve perplexity`: held-out perplexity of a text file under a model, by the definition in
// runtime/perplexity.h (the one the PyTorch reference in tools/train/ uses), so the figure can be
// held against models/*/reference.json. The file is read as bytes and encoded as ordinary text.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/progress_bar.h"
#include "cli/serving_setup.h"
#include "model/deepseek_v3.h"
#include "runtime/perplexity.h"
#include "tokenizer/tokenizer.h"

namespace mla::cli {

namespace {

struct PerplexityArgs {
  std::string model;
  std::string file;
  int window = 512;
  bool json = false;
  std::string device = "cpu";
};

int fail(const std::string& msg) {
  std::fprintf(stderr, "mlaserve perplexity: %s\n", msg.c_str());
  return 1;
}

int run_perplexity(const PerplexityArgs& a) {
  using Clock = std::chrono::steady_clock;
  std::ifstream in(a.file, std::ios::binary);
  if (!in) return fail("cannot open " + a.file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Result<std::unique_ptr<tokenizer::Tokenizer>> tok = tokenizer::Tokenizer::from_model_dir(a.model);
  if (!tok) return fail(tok.status().message());
  if (!(*tok)->bos_id()) return fail("the tokenizer of " + a.model + " has no BOS token");
  const Clock::time_point t0 = Clock::now();
  // Special-token text in the file is ordinary text here, as in the reference's encode_ordinary.
  Result<std::vector<int32_t>> ids = (*tok)->try_encode(text, {tokenizer::EncodeOptions::Special::None});
  if (!ids) return fail(a.file + ": " + ids.status().message());
  const double tokenize_s = std::chrono::duration<double>(Clock::now() - t0).count();

  Result<std::unique_ptr<ops::Backend>> made = make_backend(a.device, std::nullopt);
  if (!made) return fail(made.status().message());
  std::unique_ptr<ops::Backend> backend = std::move(made).value();
  if (a.window < 1) return fail("--window must be >= 1");
  dist::SingleProcessCommunicator comm;
  model::ModelLimits limits;
  limits.max_tokens = a.window;
  limits.max_seqs = 1;
  Result<std::unique_ptr<model::DeepseekV3>> m = model::DeepseekV3::load(a.model, *backend, limits, comm);
  if (!m) return fail(m.status().message());

  ProgressBar bar("perplexity");
  const Clock::time_point t1 = Clock::now();
  runtime::PerplexityOptions opt;
  opt.window = a.window;
  Result<runtime::PerplexityResult> r = runtime::perplexity(
      **m, *backend, *ids, *(*tok)->bos_id(), opt,
      [&bar](int64_t done, int64_t total) { bar.update(uint64_t(done), uint64_t(total)); });
  if (!r) return fail(r.status().message());
  const double forward_s = std::chrono::duration<double>(Clock::now() - t1).count();
  const double tps = forward_s > 0 ? double(r->tokens) / forward_s : 0;

  if (a.json) {
    nlohmann::json j;
    j["model"] = a.model;
    j["file"] = a.file;
    j["bytes"] = text.size();
    j["tokens"] = r->tokens;
    j["window"] = a.window;
    j["windows"] = r->windows;
    j["total_nll"] = r->total_nll;
    j["mean_nll"] = r->mean_nll;
    j["perplexity"] = r->perplexity;
    j["backend"] = std::string((*backend).name());
    j["timing"] = {{"tokenize_seconds", tokenize_s}, {"forward_seconds", forward_s}, {"tokens_per_second", tps}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model: %s\nfile: %s (%zu bytes, %lld tokens, %lld windows of <= %d)\n", a.model.c_str(),
              a.file.c_str(), text.size(), static_cast<long long>(r->tokens), static_cast<long long>(r->windows),
              a.window);
  std::printf("mean NLL: %.6f nats/token\nperplexity: %.4f\n", r->mean_nll, r->perplexity);
  std::printf("time: tokenize %.2f s, forward + log-softmax %.1f s (%.0f tok/s, backend %s)\n", tokenize_s, forward_s,
              tps, std::string((*backend).name()).c_str());
  return 0;
}

}  // namespace

Command add_perplexity_command(CLI::App& app) {
  auto a = std::make_shared<PerplexityArgs>();
  CLI::App* sub = app.add_subcommand(
      "perplexity", "Perplexity of a text file: [BOS] + its ids in windows of --window + 1 tokens overlapping by one");
  sub->add_option("--model", a->model, "Model directory (config.json, safetensors, tokenizer)")->required();
  sub->add_option("--file", a->file, "UTF-8 text file, encoded as ordinary text (special-token text is not parsed)")
      ->required();
  sub->add_option("--window", a->window, "Tokens of context per forward (each token is predicted once)")
      ->capture_default_str();
  sub->add_flag("--json", a->json, "Print one JSON object (tokens, mean_nll, perplexity, timing)");
  sub->add_option("--device", a->device, "Where the model runs: cpu, or cuda (a build with the GPU backend)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  return {sub, [a] { return run_perplexity(*a); }};
}

}  // namespace mla::cli
