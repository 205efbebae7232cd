// `mlaserve`: one binary, one subcommand per job. Errors reach the user as one line on stderr and a
// non-zero exit code; nothing a user passes in can abort the process.
#include <vector>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"mlaserve: an inference engine for DeepSeek-V3 / Kimi K2 class MoE models with MLA"};
  app.require_subcommand(1);
  const std::vector<mla::cli::Command> commands = {
      mla::cli::add_make_model_command(app),
      mla::cli::add_generate_command(app),
      mla::cli::add_info_command(app),
      mla::cli::add_plan_command(app),
      mla::cli::add_chat_template_command(app),
      mla::cli::add_tokenize_command(app),
      mla::cli::add_perplexity_command(app),
      mla::cli::add_serve_command(app),
      mla::cli::add_chat_command(app),
      mla::cli::add_bench_command(app),
  };
  CLI11_PARSE(app, argc, argv);
  for (const mla::cli::Command& c : commands)
    if (c.app->parsed()) return c.run();
  return 1;
}
