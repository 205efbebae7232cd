// `mlaserve chat`: an interactive terminal chat. Each turn renders the whole history with the
// model's chat template and streams the reply token by token (through the serving engine, so the
// prefix cache makes re-sending the history cheap). Lines starting with '/' are commands.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/serving_setup.h"
#include "tokenizer/reasoning_parser.h"

namespace mla::cli {

namespace {

struct ChatArgs {
  EngineArgs engine;
  std::optional<std::string> system;
  int max_tokens = 512;
  float temperature = 0.7f;
  float top_p = 1.0f;
  int top_k = 0;
  std::optional<uint64_t> seed;
};

int fail(const std::string& msg) {
  std::fprintf(stderr, "mlaserve chat: %s\n", msg.c_str());
  return 1;
}

int run_chat(const ChatArgs& a) {
  EngineArgs ea = a.engine;
  ea.max_num_seqs = 1;
  Result<std::unique_ptr<LoadedServing>> loaded = load_serving(ea, /*show_progress=*/isatty(2));
  if (!loaded) return fail(loaded.status().message());
  LoadedServing& s = **loaded;
  if (!s.tok) return fail("the model directory has no tokenizer (tiktoken.model or tokenizer.json)");
  if (!s.chat) return fail("the model directory has no chat template (tokenizer_config.json chat_template)");
  const bool tty = isatty(0);
  const bool think = s.chat->chat_template.find("<think>") != std::string::npos;
  if (tty) std::printf("mlaserve chat: %s. Type a message; /reset clears the history, /exit quits.\n", a.engine.model.c_str());

  std::vector<tokenizer::ChatMessage> history;
  if (a.system) history.push_back({"system", *a.system, std::nullopt, nullptr, std::nullopt, std::nullopt});
  const size_t base = history.size();
  std::string line;
  for (;;) {
    if (tty) std::printf("\n> ");
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      history.resize(base);
      std::printf("(history cleared)\n");
      continue;
    }
    history.push_back({"user", line, std::nullopt, nullptr, std::nullopt, std::nullopt});
    tokenizer::RenderOptions ro;
    ro.add_generation_prompt = true;
    ro.bos_token = s.chat->bos_token;
    ro.eos_token = s.chat->eos_token;
    Result<std::string> text = tokenizer::render_chat_template(s.chat->chat_template, tokenizer::chat_messages_to_json(history), ro);
    if (!text) return fail(text.status().message());
    runtime::RequestParams p;
    p.prompt = s.tok->encode(*text, {tokenizer::EncodeOptions::Special::All});
    const int room = s.engine->max_model_len() - int(p.prompt.size());
    if (room < 1) {
      std::printf("(the conversation no longer fits the context of %d tokens; /reset)\n", s.engine->max_model_len());
      history.pop_back();
      continue;
    }
    p.max_tokens = std::min(a.max_tokens, room);
    p.sampling = {a.temperature, a.top_k, a.top_p, 0.0f, a.seed};
    runtime::SubmitResult sr = s.engine->submit(p);
    if (!sr.ok()) return fail(sr.error.message);
    tokenizer::ReasoningOptions ropt;
    std::string_view t = *text;
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.remove_suffix(1);
    ropt.starts_in_reasoning = think && t.ends_with("<think>");
    tokenizer::ReasoningParser rp(ropt);
    std::string reply, reasoning;
    bool in_thought = false;
    auto show = [&](const tokenizer::ReasoningDelta& d) {
      if (!d.reasoning_text.empty()) {
        if (!in_thought && tty) std::printf("\x1b[2m");  // dim
        in_thought = true;
        std::fwrite(d.reasoning_text.data(), 1, d.reasoning_text.size(), stdout);
        reasoning += d.reasoning_text;
      }
      if (!d.content_text.empty()) {
        if (in_thought) std::printf(tty ? "\x1b[0m\n" : "\n");
        in_thought = false;
        std::fwrite(d.content_text.data(), 1, d.content_text.size(), stdout);
        reply += d.content_text;
      }
      std::fflush(stdout);
    };
    std::string finish;
    while (std::optional<runtime::RequestOutput> d = sr.stream->next()) {
      show(think ? rp.push(d->text) : tokenizer::ReasoningDelta{"", d->text});
      if (d->finished) {
        if (think) show(rp.finish());
        finish = std::string(runtime::finish_reason_name(d->finish_reason));
        if (d->finish_reason == runtime::FinishReason::Error) return fail(d->error);
        break;
      }
    }
    if (in_thought && tty) std::printf("\x1b[0m");
    std::printf(finish == "length" ? " [length limit]\n" : "\n");
    tokenizer::ChatMessage m{"assistant", reply, std::nullopt, nullptr, std::nullopt, std::nullopt};
    if (!reasoning.empty()) m.reasoning_content = reasoning;
    history.push_back(std::move(m));
  }
  return 0;
}

}  // namespace

Command add_chat_command(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* sub = app.add_subcommand("chat", "Interactive terminal chat with streamed replies (history kept)");
  add_engine_options(sub, a->engine);
  add_speculative_options(sub, a->engine);
  sub->add_option("--system", a->system, "A system message that opens the conversation");
  sub->add_option("--max-tokens", a->max_tokens, "Longest reply in tokens")->capture_default_str();
  sub->add_option("--temperature", a->temperature, "0 = greedy")->capture_default_str();
  sub->add_option("--top-p", a->top_p, "Nucleus sampling mass (1 = off)")->capture_default_str();
  sub->add_option("--top-k", a->top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str();
  sub->add_option("--seed", a->seed, "Seed of the first reply's generator (later replies reuse it)");
  return {sub, [a] { return run_chat(*a); }};
}

}  // namespace mla::cli
