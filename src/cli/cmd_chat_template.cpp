// `mlaserve chat-template`: render a conversation with a model directory's chat template
// (tokenizer_config.json) and print the prompt exactly, with no trailing newline added.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "tokenizer/chat_template.h"

namespace mla::cli {
namespace {

Result<nlohmann::ordered_json> read_json_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return error("{}: cannot open", path);
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return error("{}: invalid JSON", path);
  return j;
}

struct Options {
  std::string model_dir;
  std::string messages_file;
  std::string tools_file;
  bool add_generation_prompt = false;
};

int run(const Options& o) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "mlaserve chat-template: %s\n", s.message().c_str());
    return 1;
  };
  auto cfg = tokenizer::load_chat_template_config(o.model_dir + "/tokenizer_config.json");
  if (!cfg) return fail(cfg.status());
  auto messages = read_json_file(o.messages_file);
  if (!messages) return fail(messages.status());
  tokenizer::RenderOptions opts;
  opts.add_generation_prompt = o.add_generation_prompt;
  opts.bos_token = cfg->bos_token;
  opts.eos_token = cfg->eos_token;
  if (!o.tools_file.empty()) {
    auto tools = read_json_file(o.tools_file);
    if (!tools) return fail(tools.status());
    opts.tools = *tools;
  }
  auto text = tokenizer::render_chat_template(cfg->chat_template, *messages, opts);
  if (!text) return fail(text.status());
  std::fwrite(text->data(), 1, text->size(), stdout);
  return 0;
}

}  // namespace

Command add_chat_template_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("chat-template", "Render a conversation with the model's chat template");
  sub->add_option("--model", o->model_dir, "Model directory (reads tokenizer_config.json)")->required();
  sub->add_option("--messages", o->messages_file, "JSON file with an array of messages")->required();
  sub->add_option("--tools", o->tools_file, "JSON file with an array of tool schemas");
  sub->add_flag("--add-generation-prompt", o->add_generation_prompt, "End with the assistant turn opener");
  return {sub, [o] { return run(*o); }};
}

}  // namespace mla::cli
