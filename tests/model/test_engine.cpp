// The serving engine end to end on the CPU backend and a tiny random model with the byte-level
// tokenizer: determinism under batching, preemption by recompute, prefix caching, aborts without
// leaks, stop strings split across tokens, max_tokens / stop tokens / min_tokens, logprobs
// against a direct log_softmax, and the error codes the server maps to HTTP statuses.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <random>
#include <thread>

#include "io/presets.h"
#include "model/deepseek_v3_synthetic.h"
#include "model/model_test_util.h"
#include "stress_scale.h"
#include "runtime/engine.h"
#include "tokenizer/byte_tokenizer_writer.h"

namespace mla::test {
namespace {

using runtime::Engine;
using runtime::EngineConfig;
using runtime::FinishReason;
using runtime::RequestOutput;
using runtime::RequestParams;

std::string engine_model_dir() {
  return (std::filesystem::temp_directory_path() / fmt::format("mlaserve_test_engine_{}", getpid())).string();
}

class EngineModelCleanup : public ::testing::Environment {
 public:
  void TearDown() override { std::filesystem::remove_all(engine_model_dir()); }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new EngineModelCleanup);

// The tiny bf16 model plus the byte-level tokenizer, written once per test binary.
struct Fixture {
  std::unique_ptr<LoadedModel> lm;
  std::unique_ptr<tokenizer::Tokenizer> tok;
};

Fixture& fixture() {
  static Fixture f = [] {
    Fixture x;
    const std::string dir = engine_model_dir();
    if (!std::filesystem::exists(dir + "/config.json")) {
      auto cfg = io::preset_config("tiny");
      EXPECT_TRUE(cfg.is_ok());
      auto q = io::with_quantization(*cfg, "bf16");
      EXPECT_TRUE(q.is_ok());
      model::SyntheticOptions opt;
      opt.seed = 11;
      EXPECT_TRUE(model::write_synthetic_checkpoint(*q, dir, opt).is_ok());
      EXPECT_TRUE(tokenizer::write_byte_level_tokenizer(dir).is_ok());
    }
    x.lm = load_cpu_model(dir, /*max_tokens=*/64, /*max_seqs=*/16);
    auto t = tokenizer::Tokenizer::from_model_dir(dir);
    EXPECT_TRUE(t.is_ok()) << t.status().message();
    if (t.is_ok()) x.tok = std::move(t).value();
    return x;
  }();
  return f;
}

EngineConfig small_config() {
  EngineConfig c;
  c.max_num_seqs = 16;
  c.max_tokens_per_step = 48;
  c.block_size = 4;
  c.num_blocks = 512;
  c.eos_token_ids = fixture().tok->eos_ids();
  return c;
}

std::unique_ptr<Engine> make_engine(const EngineConfig& c) {
  Fixture& f = fixture();
  auto e = Engine::create(*f.lm->model, *f.lm->backend, f.tok.get(), c);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  return e.is_ok() ? std::move(e).value() : nullptr;
}

std::vector<int32_t> prompt_of(int n, uint32_t seed, int vocab = 256) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t& t : p) t = int32_t(rng() % uint32_t(vocab));
  return p;
}

// All deltas of a stream merged; `deltas` receives each delta's text.
RequestOutput collect(runtime::RequestStream& s, std::vector<std::string>* deltas = nullptr) {
  RequestOutput all;
  while (auto d = s.next()) {
    all.token_ids.insert(all.token_ids.end(), d->token_ids.begin(), d->token_ids.end());
    all.text += d->text;
    if (deltas) deltas->push_back(d->text);
    for (auto& lp : d->logprobs) all.logprobs.push_back(lp);
    all.finished = d->finished;
    all.finish_reason = d->finish_reason;
    all.stop_string = d->stop_string;
    all.stop_token = d->stop_token;
    all.prompt_tokens = d->prompt_tokens;
    all.completion_tokens = d->completion_tokens;
    all.cached_tokens = d->cached_tokens;
  }
  return all;
}

RequestOutput run_one(Engine& e, const RequestParams& p, std::vector<std::string>* deltas = nullptr) {
  runtime::SubmitResult r = e.submit(p);
  EXPECT_TRUE(r.ok()) << r.error.message;
  if (!r.ok()) return {};
  return collect(*r.stream, deltas);
}

RequestParams greedy(std::vector<int32_t> prompt, int max_tokens) {
  RequestParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.sampling.temperature = 0.0f;
  p.ignore_eos = true;
  return p;
}

TEST(Engine, SameSeedSameTokensAloneOrWith15Others) {
  auto e = make_engine(small_config());
  ASSERT_TRUE(e);
  RequestParams target;
  target.prompt = prompt_of(23, 2);
  target.max_tokens = 12;
  target.ignore_eos = true;
  target.sampling.temperature = 0.8f;
  target.sampling.top_k = 50;
  target.sampling.top_p = 0.9f;
  target.sampling.seed = 1234;
  const RequestOutput alone = run_one(*e, target);
  ASSERT_EQ(alone.token_ids.size(), 12u);

  std::vector<runtime::SubmitResult> subs;
  size_t target_index = 0;
  for (int i = 0; i < 15; ++i) {
    RequestParams o;
    o.prompt = prompt_of(3 + 5 * i, 100 + uint32_t(i));
    o.max_tokens = 4 + i;
    o.sampling.temperature = i % 3 == 0 ? 0.0f : 1.1f;
    o.sampling.seed = uint64_t(i);
    subs.push_back(e->submit(o));
    if (i == 7) {
      target_index = subs.size();
      subs.push_back(e->submit(target));
    }
  }
  for (auto& s : subs) ASSERT_TRUE(s.ok()) << s.error.message;
  std::vector<RequestOutput> outs;
  for (auto& s : subs) outs.push_back(collect(*s.stream));
  EXPECT_EQ(outs[target_index].token_ids, alone.token_ids);
  EXPECT_EQ(outs[target_index].text, alone.text);
  // Another seed gives another sequence (12 draws at T=0.8: a collision is practically impossible).
  target.sampling.seed = 4321;
  EXPECT_NE(run_one(*e, target).token_ids, alone.token_ids);
}

TEST(Engine, TinyPoolPreemptsAndGreedyOutputsMatchAnUnpreemptedRun) {
  std::vector<RequestParams> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(greedy(prompt_of(9 + 4 * i, 200 + uint32_t(i)), 16));
  auto run_all = [&](const EngineConfig& c, runtime::EngineMetrics* m) {
    auto e = make_engine(c);
    std::vector<runtime::SubmitResult> subs;
    for (const RequestParams& p : reqs) subs.push_back(e->submit(p));
    std::vector<RequestOutput> outs;
    for (auto& s : subs) {
      EXPECT_TRUE(s.ok()) << s.error.message;
      if (s.ok()) outs.push_back(collect(*s.stream));
    }
    e->shutdown();
    *m = e->metrics();
    return outs;
  };
  EngineConfig big = small_config();
  runtime::EngineMetrics mb, mt;
  const std::vector<RequestOutput> ref = run_all(big, &mb);
  EXPECT_EQ(mb.preemptions, 0);
  EngineConfig tiny = small_config();
  tiny.num_blocks = 12;  // 48 tokens: one sequence of <= 45 tokens at a time, barely
  const std::vector<RequestOutput> got = run_all(tiny, &mt);
  EXPECT_GT(mt.preemptions, 0);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(got[i].finish_reason, FinishReason::Length) << i;
    EXPECT_EQ(got[i].token_ids, ref[i].token_ids) << "request " << i;
  }
  EXPECT_EQ(mt.num_blocks_used, 0);
}

TEST(Engine, RepeatedLongPromptHitsThePrefixCacheWithIdenticalOutput) {
  auto e = make_engine(small_config());
  ASSERT_TRUE(e);
  const RequestParams p = greedy(prompt_of(150, 9), 8);
  const RequestOutput first = run_one(*e, p);
  EXPECT_EQ(first.cached_tokens, 0);
  const runtime::EngineMetrics m1 = e->metrics();
  const RequestOutput second = run_one(*e, p);
  EXPECT_EQ(second.cached_tokens, 148);  // full blocks, leaving the last token to compute
  EXPECT_EQ(second.token_ids, first.token_ids);
  EXPECT_EQ(second.text, first.text);
  const runtime::EngineMetrics m2 = e->metrics();
  EXPECT_EQ(m2.prefix_hit_tokens - m1.prefix_hit_tokens, 148);
  EXPECT_GT(m2.prefix_hit_rate, 0.0);
  // Another tenant's salt sees nothing of it; with the salt the output is unchanged.
  RequestParams salted = p;
  salted.cache_salt = "tenant-b";
  const RequestOutput third = run_one(*e, salted);
  EXPECT_EQ(third.cached_tokens, 0);
  EXPECT_EQ(third.token_ids, first.token_ids);
  // A prompt sharing the first 100 tokens reuses exactly those blocks.
  RequestParams partial = p;
  partial.prompt.resize(130);
  for (size_t i = 100; i < 130; ++i) partial.prompt[i] = int32_t((partial.prompt[i] + 1) % 256);
  EXPECT_EQ(run_one(*e, partial).cached_tokens, 100);
}

TEST(Engine, ManyRequestsAThirdAbortedLeakNoBlocks) {
  EngineConfig c = small_config();
  c.max_num_seqs = 8;
  c.num_blocks = 160;
  auto e = make_engine(c);
  ASSERT_TRUE(e);
  std::mt19937 rng(3);
  const std::vector<int32_t> shared = prompt_of(16, 77);
  struct Live {
    std::shared_ptr<runtime::RequestStream> stream;
    bool abort = false, abort_sent = false, done = false;
    FinishReason reason = FinishReason::None;
  };
  std::vector<Live> live;
  const int requests = stress_size(200, 40);
  for (int i = 0; i < requests; ++i) {
    RequestParams p;
    p.prompt = prompt_of(3 + int(rng() % 20), 1000 + uint32_t(i));
    if (i % 4 == 0) p.prompt.insert(p.prompt.begin(), shared.begin(), shared.end());  // prefix sharing
    p.max_tokens = 3 + int(rng() % 8);
    p.sampling.temperature = 1.0f;
    p.sampling.seed = uint64_t(i);
    runtime::SubmitResult r = e->submit(p);
    ASSERT_TRUE(r.ok()) << r.error.message;
    live.push_back({r.stream, i % 3 == 0});
  }
  size_t remaining = live.size();
  // A hang guard only: ~3 s normally, ~60 s under ASan on a loaded 2-core machine.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  while (remaining > 0 && std::chrono::steady_clock::now() < deadline) {
    bool progressed = false;
    for (Live& l : live) {
      if (l.done) continue;
      while (auto d = l.stream->next(std::chrono::milliseconds(0))) {
        progressed = true;
        if (l.abort && !l.abort_sent) {  // cancelled mid-way: after its first output
          e->abort(l.stream->id());
          l.abort_sent = true;
        }
        if (d->finished) {
          l.done = true;
          l.reason = d->finish_reason;
          --remaining;
          break;
        }
      }
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(remaining, 0u) << "requests did not finish in time";
  int aborted = 0, cancelled = 0;
  for (const Live& l : live) {
    if (!l.abort) {
      EXPECT_NE(l.reason, FinishReason::Abort);
    }
    aborted += l.reason == FinishReason::Abort;
    cancelled += l.abort;
  }
  EXPECT_GT(aborted, cancelled * 3 / 10);  // many of the cancelled requests were still running
  runtime::EngineMetrics m = e->metrics();
  for (int i = 0; i < 100 && (m.num_running || m.num_waiting); ++i) {  // metrics publish after the step
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    m = e->metrics();
  }
  EXPECT_EQ(m.num_running, 0);
  EXPECT_EQ(m.num_waiting, 0);
  EXPECT_EQ(m.num_blocks_used, 0) << "blocks leaked";
  EXPECT_GT(m.num_blocks_cached_evictable, 0);  // reported separately: cache-only, reusable
  EXPECT_EQ(m.requests_finished[size_t(FinishReason::Abort)], aborted);
  // The engine still answers.
  const RequestOutput after = run_one(*e, greedy(prompt_of(10, 5), 3));
  EXPECT_EQ(after.finish_reason, FinishReason::Length);
}

// Byte tokens make every multi-character stop string span several tokens.
TEST(Engine, StopStringSplitAcrossTokensIsNeverEmitted) {
  auto e = make_engine(small_config());
  ASSERT_TRUE(e);
  const RequestParams base = greedy(prompt_of(17, 21, 128), 40);
  const RequestOutput full = run_one(*e, base);
  const std::string& text = full.text;
  // A stop string of two whole UTF-8 characters from the middle of the output.
  auto is_lead = [&](size_t i) { return (uint8_t(text[i]) & 0xC0) != 0x80; };
  size_t start = text.size() / 3;
  while (start < text.size() && !is_lead(start)) ++start;
  size_t end = start + 1, chars = 1;
  while (end < text.size() && (chars < 2 || !is_lead(end))) {
    if (is_lead(end)) ++chars;
    ++end;
  }
  ASSERT_LT(end, text.size()) << "output too short for the test: " << text.size() << " bytes";
  const std::string stop = text.substr(start, end - start);
  const size_t at = text.find(stop);
  RequestParams p = base;
  p.stop = {"never-matches-this", stop};
  std::vector<std::string> deltas;
  const RequestOutput got = run_one(*e, p, &deltas);
  EXPECT_EQ(got.finish_reason, FinishReason::Stop);
  ASSERT_TRUE(got.stop_string.has_value());
  EXPECT_EQ(*got.stop_string, stop);
  EXPECT_EQ(got.text, text.substr(0, at));
  std::string so_far;
  for (const std::string& d : deltas) {
    so_far += d;
    EXPECT_EQ(so_far.find(stop), std::string::npos) << "stop string emitted";
  }
  p.include_stop_str_in_output = true;
  EXPECT_EQ(run_one(*e, p).text, text.substr(0, at + stop.size()));
}

TEST(StopStringMatcher, HoldsBackPartialMatchesOnly) {
  runtime::StopStringMatcher m({"abc", "xy"}, false);
  EXPECT_EQ(m.push("hello a", true).emit, "hello ");  // "a" may start "abc"
  EXPECT_EQ(m.push("b", true).emit, "");
  auto s = m.push("d x", true);  // "abd" cannot match: released; "x" held
  EXPECT_EQ(s.emit, "abd ");
  s = m.push("yz", true);
  EXPECT_EQ(s.emit, "");
  ASSERT_TRUE(s.matched.has_value());
  EXPECT_EQ(*s.matched, "xy");
  runtime::StopStringMatcher n({"abc"}, false);
  EXPECT_EQ(n.push("zab", true).emit, "z");
  EXPECT_EQ(n.flush(), "ab");  // the request ended for another reason: held text is output
}

TEST(Engine, MaxTokensStopTokensAndMinTokens) {
  auto e = make_engine(small_config());
  ASSERT_TRUE(e);
  const RequestOutput seven = run_one(*e, greedy(prompt_of(12, 31), 7));
  EXPECT_EQ(seven.finish_reason, FinishReason::Length);
  EXPECT_EQ(seven.token_ids.size(), 7u);
  EXPECT_EQ(seven.completion_tokens, 7);
  EXPECT_EQ(seven.prompt_tokens, 12);
  // Find a token that first appears at index >= 2 and make it a stop token.
  size_t k = 2;
  while (k < seven.token_ids.size() &&
         std::find(seven.token_ids.begin(), seven.token_ids.begin() + long(k), seven.token_ids[k]) !=
             seven.token_ids.begin() + long(k))
    ++k;
  ASSERT_LT(k, seven.token_ids.size());
  RequestParams p = greedy(prompt_of(12, 31), 7);
  p.stop_token_ids = {seven.token_ids[k]};
  const RequestOutput stopped = run_one(*e, p);
  EXPECT_EQ(stopped.finish_reason, FinishReason::Stop);
  ASSERT_TRUE(stopped.stop_token.has_value());
  EXPECT_EQ(*stopped.stop_token, seven.token_ids[k]);
  EXPECT_EQ(stopped.token_ids.size(), k + 1);  // the stop token is returned, its text is not
  // min_tokens masks the stop token until then: none of the first min_tokens tokens is it.
  p.min_tokens = int(k) + 2;
  const RequestOutput held = run_one(*e, p);
  ASSERT_GE(held.token_ids.size(), size_t(p.min_tokens));
  for (int i = 0; i < p.min_tokens; ++i) EXPECT_NE(held.token_ids[size_t(i)], seven.token_ids[k]) << i;
}

TEST(Engine, LogprobsMatchALogSoftmaxOfTheLogits) {
  Fixture& f = fixture();
  auto e = make_engine(small_config());
  ASSERT_TRUE(e);
  RequestParams p = greedy(prompt_of(19, 41), 6);
  p.logprobs = 5;
  const RequestOutput got = run_one(*e, p);
  ASSERT_EQ(got.logprobs.size(), 6u);
  p.logprobs = 0;
  const RequestOutput none_top = run_one(*e, p);
  ASSERT_EQ(none_top.logprobs.size(), 6u);
  EXPECT_TRUE(none_top.logprobs[0].top.empty());
  p.logprobs = 21;
  EXPECT_EQ(e->submit(p).error.param, "logprobs");
  e->shutdown();  // the model is used directly below

  std::vector<int32_t> seq = prompt_of(19, 41);
  seq.insert(seq.end(), got.token_ids.begin(), got.token_ids.end() - 1);
  const int V = f.lm->model->config().vocab_size;
  const std::vector<float> logits = prefill_logits(*f.lm, seq, 64, model::MlaPath::Naive, 4);
  for (size_t j = 0; j < got.logprobs.size(); ++j) {
    const float* row = logits.data() + (19 - 1 + j) * size_t(V);
    double mx = -1e30, sum = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
    for (int v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
    const double lse = mx + std::log(sum);
    const runtime::TokenLogprob& lp = got.logprobs[j];
    EXPECT_EQ(lp.token, got.token_ids[j]);
    // Tolerance: the engine's logits come from decode steps (absorbed MLA), the reference from one
    // naive prefill; fp32 reduction-order differences stay far below 1e-3 in log space.
    EXPECT_NEAR(lp.logprob, double(row[lp.token]) - lse, 1e-3) << j;
    ASSERT_EQ(lp.top.size(), 5u);
    EXPECT_EQ(lp.top[0].first, lp.token);  // greedy: the sampled token is the most likely
    double mass = 0;
    for (size_t i = 0; i < lp.top.size(); ++i) {
      EXPECT_LE(lp.top[i].second, 0.0f);
      if (i) {
        EXPECT_GE(lp.top[i - 1].second, lp.top[i].second);
      }
      EXPECT_NEAR(lp.top[i].second, double(row[lp.top[i].first]) - lse, 1e-3);
      mass += std::exp(double(lp.top[i].second));
    }
    EXPECT_LE(mass, 1.0 + 1e-5);
  }
}

TEST(Engine, ErrorCodesQueueBoundAndDrainingShutdown) {
  EngineConfig c = small_config();
  c.max_num_seqs = 1;
  c.max_waiting = 2;
  auto e = make_engine(c);
  ASSERT_TRUE(e);
  RequestParams bad = greedy({1, 2, 3}, 4);
  bad.sampling.temperature = -1.0f;
  runtime::SubmitResult r = e->submit(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.code, runtime::ErrorCode::InvalidParam);
  EXPECT_EQ(r.error.param, "temperature");
  r = e->submit(greedy({1, 2, 3}, e->max_model_len()));
  EXPECT_EQ(r.error.code, runtime::ErrorCode::ContextLengthExceeded);
  EXPECT_NE(r.error.message.find("maximum context length"), std::string::npos) << r.error.message;

  // One running (max_num_seqs 1) and two queued fill the queue; the next is refused.
  runtime::SubmitResult a = e->submit(greedy(prompt_of(8, 1), 500));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a.stream->next().has_value());  // running now
  runtime::SubmitResult b = e->submit(greedy(prompt_of(8, 2), 4));
  runtime::SubmitResult c2 = e->submit(greedy(prompt_of(8, 3), 4));
  ASSERT_TRUE(b.ok() && c2.ok());
  runtime::SubmitResult d = e->submit(greedy(prompt_of(8, 4), 4));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error.code, runtime::ErrorCode::QueueFull);
  e->abort(a.stream->id());
  EXPECT_EQ(collect(*a.stream).finish_reason, FinishReason::Abort);
  // Draining shutdown finishes the queued requests, then refuses new ones.
  e->shutdown(/*drain=*/true);
  EXPECT_EQ(collect(*b.stream).finish_reason, FinishReason::Length);
  EXPECT_EQ(collect(*c2.stream).finish_reason, FinishReason::Length);
  EXPECT_EQ(e->submit(greedy({1}, 1)).error.code, runtime::ErrorCode::ShuttingDown);
}

}  // namespace
}  // namespace mla::test
