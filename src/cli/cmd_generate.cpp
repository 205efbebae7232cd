// `mlaserve generate`: load a model, prefill a prompt of token ids, decode, print ids and speed, on
// the CPU reference backend or (in a build with the GPU backend) on a GPU. The GPU defaults trade
// exactness for speed where it is cheap to do so: BF16 latent cache and decode graphs.
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/progress_bar.h"
#include "cli/serving_setup.h"
#include "model/deepseek_v3.h"
#include "runtime/offline_engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace mla::cli {

namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt_ids;
  std::optional<std::string> prompt;  // text, encoded with the model's tokenizer
  bool chat = false;                  // wrap `prompt` as one user message through the chat template
  int max_tokens = 16;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  std::optional<uint64_t> seed;
  bool json = false;
  bool logits = false;
  bool ignore_eos = false;
  int max_tokens_per_step = 256;
  std::string mla_path = "auto";
  std::string device = "cpu";                 // cpu or cuda
  std::optional<std::string> gemm_precision;  // cuda only: fp32 (default) or bf16
  std::string kv_cache_dtype = "auto";        // auto = bf16 on a GPU, f32 on the CPU
  std::string decode_graphs = "auto";         // auto = on for a GPU, off on the CPU
  EngineArgs spec;                            // --speculative, --draft-model, --num-draft-tokens
};

Result<std::vector<int32_t>> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const long v = std::stol(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      return error("--prompt-ids: '{}' is not a non-negative integer", item);
    }
  }
  if (ids.empty()) return error("--prompt-ids: no token ids given");
  return ids;
}

// Generated text through the streaming detokenizer (valid UTF-8 whatever the ids), special tokens
// such as [EOS] skipped (the ids line and --json keep them).
std::string detokenize(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& ids) {
  tokenizer::IncrementalDetokenizer d(tok, /*skip_special=*/true);
  std::string text;
  for (int32_t id : ids) text += d.push(id);
  return text + d.finish();
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "mlaserve generate: %s\n", msg.c_str());
  return 1;
}

// True when the checkpoint says its weights were written by make-model (random values).
bool has_random_weights(const io::Checkpoint& ckpt) {
  for (const io::SafetensorsFile& f : ckpt.files()) {
    auto it = f.metadata().find("generator");
    if (it != f.metadata().end() && it->second.find("random") != std::string::npos) return true;
  }
  return false;
}

// Prompt ids from --prompt-ids, or --prompt text through the model directory's tokenizer (and chat
// template with --chat). A raw text prompt starts with the tokenizer's BOS, as HF's encode does.
Result<std::vector<int32_t>> prompt_ids(const GenerateArgs& a, const tokenizer::Tokenizer* tok) {
  if (!a.prompt) return parse_ids(a.prompt_ids);
  if (!tok) return error("--prompt needs a tokenizer in {} (tiktoken.model or tokenizer.json); use --prompt-ids", a.model);
  if (!a.chat) {
    MLA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->try_encode(*a.prompt, {tokenizer::EncodeOptions::Special::None}));
    if (tok->bos_id()) ids.insert(ids.begin(), *tok->bos_id());
    return ids;
  }
  MLA_ASSIGN_OR_RETURN(tokenizer::ChatTemplateConfig tc, tokenizer::load_chat_template_config(a.model + "/tokenizer_config.json"));
  tokenizer::RenderOptions ro;
  ro.add_generation_prompt = true;
  ro.bos_token = tc.bos_token;
  ro.eos_token = tc.eos_token;
  const nlohmann::ordered_json messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", *a.prompt}}});
  MLA_ASSIGN_OR_RETURN(std::string text, tokenizer::render_chat_template(tc.chat_template, messages, ro));
  return tok->try_encode(text, {tokenizer::EncodeOptions::Special::All});  // the template's markers are specials
}

int run_generate(const GenerateArgs& a) {
  Result<std::unique_ptr<ops::Backend>> made = make_backend(a.device, a.gemm_precision);
  if (!made) return fail(made.status().message());
  std::unique_ptr<ops::Backend> backend = std::move(made).value();
  const bool on_gpu = a.device != "cpu";
  std::unique_ptr<tokenizer::Tokenizer> tok;
  if (auto t = tokenizer::Tokenizer::from_model_dir(a.model); t) tok = std::move(t).value();
  else if (a.prompt) return fail(t.status().message());
  Result<std::vector<int32_t>> prompt = prompt_ids(a, tok.get());
  if (!prompt) return fail(prompt.status().message());
  dist::SingleProcessCommunicator comm;
  model::ModelLimits limits;
  limits.max_tokens = std::max(1, a.max_tokens_per_step);
  limits.max_seqs = 1;
  ProgressBar bar("loading " + a.model);
  Result<std::unique_ptr<model::DeepseekV3>> m = model::DeepseekV3::load(
      a.model, *backend, limits, comm, [&bar](uint64_t done, uint64_t total) { bar.update(done, total); });
  if (!m) return fail(m.status().message());
  model::DeepseekV3& mdl = **m;
  const bool random_weights = has_random_weights(mdl.checkpoint());

  runtime::GenerationRequest req;
  req.prompt = *prompt;
  req.max_tokens = a.max_tokens;
  req.sampling = {a.temperature, a.top_k, a.top_p, a.min_p, a.seed};
  if (!a.ignore_eos) req.stop_token_ids = tok ? tok->eos_ids() : mdl.config().eos_token_id;
  runtime::EngineOptions opt;
  opt.max_tokens_per_step = limits.max_tokens;
  opt.capture_prompt_logits = a.logits;
  opt.mla_path = a.mla_path == "naive" ? model::MlaPath::Naive
                 : a.mla_path == "absorbed" ? model::MlaPath::Absorbed : model::MlaPath::Auto;
  opt.kv_cache_dtype = a.kv_cache_dtype == "bf16" || (a.kv_cache_dtype == "auto" && on_gpu) ? DType::BF16 : DType::F32;
  opt.decode_graphs = a.decode_graphs == "on" || (a.decode_graphs == "auto" && on_gpu);
  runtime::EngineStats stats;
  Result<std::vector<runtime::GenerationResult>> res = runtime::generate(mdl, *backend, {req}, opt, &stats);
  if (!res) return fail(res.status().message());
  const runtime::GenerationResult& r = res->front();
  const double prefill_tps = stats.prefill_seconds > 0 ? double(stats.prompt_tokens) / stats.prefill_seconds : 0;
  // The first generated token comes out of the prefill step; decode steps make the rest.
  const int64_t decoded = std::max<int64_t>(0, stats.generated_tokens - 1);
  const double decode_tps = stats.decode_seconds > 0 ? double(decoded) / stats.decode_seconds : 0;

  if (a.json) {
    nlohmann::json j;
    j["tokens"] = r.tokens;
    j["finish_reason"] = r.finish_reason;
    j["prompt_tokens"] = stats.prompt_tokens;
    j["random_weights"] = random_weights;
    j["backend"] = std::string(backend->name());
    j["kv_cache_dtype"] = std::string(dtype_name(opt.kv_cache_dtype));
    j["timing"] = {{"prefill_seconds", stats.prefill_seconds}, {"decode_seconds", stats.decode_seconds},
                   {"prefill_tokens_per_second", prefill_tps}, {"decode_tokens_per_second", decode_tps},
                   {"time_to_first_token_seconds", r.time_to_first_token_s}};
    if (a.logits) j["last_logits"] = r.prompt_logits;
    if (tok) j["text"] = detokenize(*tok, r.tokens);
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  if (random_weights)
    std::printf("NOTE: this model's weights are RANDOM (written by `mlaserve make-model`): the tokens below are "
                "not meaningful text; they show the engine running.\n");
  std::printf("model: %s (%s, %d layers, %d heads, %d routed experts, %lld params)\n", a.model.c_str(),
              mdl.config().model_type.c_str(), mdl.config().num_hidden_layers, mdl.config().num_attention_heads,
              mdl.config().n_routed_experts, static_cast<long long>(io::parameter_count(mdl.config())));
  std::printf("prompt ids (%zu):", prompt->size());
  for (int32_t t : *prompt) std::printf(" %d", t);
  std::printf("\ngenerated ids (%zu, finish: %s):", r.tokens.size(), r.finish_reason.c_str());
  for (int32_t t : r.tokens) std::printf(" %d", t);
  if (tok) std::printf("\ngenerated text: %s", nlohmann::json(detokenize(*tok, r.tokens)).dump().c_str());
  std::printf("\nprefill: %.1f tok/s (%lld tokens in %.1f ms); decode: %.1f tok/s (%lld tokens in %.1f ms); "
              "backend: %s (kv cache %s, decode graphs %s)\n",
              prefill_tps, static_cast<long long>(stats.prompt_tokens), stats.prefill_seconds * 1e3, decode_tps,
              static_cast<long long>(decoded), stats.decode_seconds * 1e3, std::string(backend->name()).c_str(),
              std::string(dtype_name(opt.kv_cache_dtype)).c_str(), opt.decode_graphs ? "on" : "off");
  return 0;
}

// Speculative generation runs through the serving engine (the one place speculation lives), with
// the same flags, and adds the acceptance figures to the report.
int run_generate_speculative(const GenerateArgs& a) {
  EngineArgs e = a.spec;
  e.model = a.model;
  e.device = a.device;
  e.gemm_precision = a.gemm_precision;
  e.max_num_seqs = 1;
  e.max_tokens_per_step = std::max(1, a.max_tokens_per_step);
  e.kv_cache_dtype = a.kv_cache_dtype;
  e.decode_graphs = a.decode_graphs;
  e.mla_path = a.mla_path;
  Result<std::unique_ptr<LoadedServing>> loaded = load_serving(e, /*show_progress=*/true);
  if (!loaded) return fail(loaded.status().message());
  LoadedServing& s = **loaded;
  Result<std::vector<int32_t>> prompt = prompt_ids(a, s.tok.get());
  if (!prompt) return fail(prompt.status().message());
  runtime::RequestParams p;
  p.prompt = *prompt;
  p.max_tokens = a.max_tokens;
  p.sampling = {a.temperature, a.top_k, a.top_p, a.min_p, a.seed};
  p.ignore_eos = a.ignore_eos;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  runtime::SubmitResult sub = s.engine->submit(std::move(p));
  if (!sub.ok()) return fail(sub.error.message);
  std::vector<int32_t> tokens;
  std::string finish = "length";
  Clock::time_point first{}, last{};
  while (std::optional<runtime::RequestOutput> out = sub.stream->next()) {
    if (!out->token_ids.empty()) {
      last = Clock::now();
      if (tokens.empty()) first = last;
      tokens.insert(tokens.end(), out->token_ids.begin(), out->token_ids.end());
    }
    if (out->finished) {
      if (!out->error.empty()) return fail(out->error);
      finish = out->finish_reason == runtime::FinishReason::Stop ? "stop" : "length";
      break;
    }
  }
  const runtime::EngineMetrics m = s.engine->metrics();
  const double ttft = std::chrono::duration<double>(first - start).count();
  const double decode_s = std::chrono::duration<double>(last - first).count();
  const double decode_tps = tokens.size() > 1 && decode_s > 0 ? double(tokens.size() - 1) / decode_s : 0;
  const spec::SpecStats& st = m.spec;
  const double mean_len = st.num_drafts ? 1.0 + double(st.num_accepted_tokens) / double(st.num_drafts) : 0;
  std::vector<double> per_pos;
  for (int64_t c : st.accepted_per_pos) per_pos.push_back(st.num_drafts ? double(c) / double(st.num_drafts) : 0);
  if (a.json) {
    nlohmann::json j;
    j["tokens"] = tokens;
    j["finish_reason"] = finish;
    j["prompt_tokens"] = prompt->size();
    j["backend"] = std::string(s.backend->name());
    j["timing"] = {{"decode_tokens_per_second", decode_tps}, {"time_to_first_token_seconds", ttft},
                   {"decode_seconds", decode_s}};
    j["speculative"] = {{"method", e.speculative}, {"num_draft_tokens", e.num_draft_tokens},
                        {"rounds", st.num_drafts}, {"draft_tokens", st.num_draft_tokens},
                        {"accepted_tokens", st.num_accepted_tokens}, {"mean_accepted_length", mean_len},
                        {"acceptance_rate_per_position", per_pos}};
    if (s.tok) j["text"] = detokenize(*s.tok, tokens);
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("generated ids (%zu, finish: %s):", tokens.size(), finish.c_str());
  for (int32_t t : tokens) std::printf(" %d", t);
  if (s.tok) std::printf("\ngenerated text: %s", nlohmann::json(detokenize(*s.tok, tokens)).dump().c_str());
  std::printf("\ndecode: %.1f tok/s (%zu tokens in %.1f ms, first token after %.1f ms); backend: %s\n", decode_tps,
              tokens.size() > 0 ? tokens.size() - 1 : 0, decode_s * 1e3, ttft * 1e3, std::string(s.backend->name()).c_str());
  std::printf("speculative (%s, K=%d): mean accepted length %.2f over %lld rounds; acceptance per position:",
              e.speculative.c_str(), e.num_draft_tokens, mean_len, static_cast<long long>(st.num_drafts));
  for (double r : per_pos) std::printf(" %.2f", r);
  std::printf("\n");
  return 0;
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* sub = app.add_subcommand("generate", "Prefill a prompt of token ids, decode, and print the generated ids and speed");
  sub->add_option("--model", a->model, "Model directory (config.json + safetensors)")->required();
  CLI::Option* ids = sub->add_option("--prompt-ids", a->prompt_ids, "Comma-separated prompt token ids, e.g. 1,2,3");
  CLI::Option* text = sub->add_option("--prompt", a->prompt, "Prompt text, encoded with the model's tokenizer");
  ids->excludes(text);
  sub->add_flag("--chat", a->chat, "With --prompt: format it as one user message with the model's chat template");
  sub->add_option("--max-tokens", a->max_tokens, "Tokens to generate")->capture_default_str();
  sub->add_option("--temperature", a->temperature, "0 = greedy")->capture_default_str();
  sub->add_option("--top-k", a->top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str();
  sub->add_option("--top-p", a->top_p, "Nucleus sampling mass (1 = off)")->capture_default_str();
  sub->add_option("--min-p", a->min_p, "Drop tokens below min_p * max prob (0 = off)")->capture_default_str();
  sub->add_option("--seed", a->seed, "Seed of this request's generator");
  sub->add_flag("--json", a->json, "Print one JSON object (tokens, timing)");
  sub->add_flag("--logits", a->logits, "With --json: include last_logits, the fp32 logits at the last prompt position");
  sub->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at the model's eos token");
  sub->add_option("--max-tokens-per-step", a->max_tokens_per_step, "Token budget of one step (chunked prefill)")
      ->capture_default_str();
  sub->add_option("--mla-path", a->mla_path, "MLA formulation: auto, naive or absorbed")
      ->check(CLI::IsMember({"auto", "naive", "absorbed"}))
      ->capture_default_str();
  sub->add_option("--device", a->device, "Where the model runs: cpu, or cuda (a build with the GPU backend)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  sub->add_option("--gemm-precision", a->gemm_precision,
                  "cuda: fp32 (3-term bf16 split, matches the CPU) or bf16 (activations rounded once, faster)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  sub->add_option("--kv-cache-dtype", a->kv_cache_dtype, "Latent cache dtype: auto (bf16 on cuda, f32 on cpu), f32, bf16")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}))
      ->capture_default_str();
  sub->add_option("--decode-graphs", a->decode_graphs, "Replay captured graphs for decode steps: auto (on for cuda), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  add_speculative_options(sub, a->spec);
  return {sub, [a, ids, text] {
            if (ids->count() + text->count() == 0) return fail("one of --prompt-ids or --prompt is required");
            return a->spec.speculative.empty() ? run_generate(*a) : run_generate_speculative(*a);
          }};
}

}  // namespace mla::cli
