// Subcommands of the `mlaserve` binary; each registers its options on the CLI11 app and returns
// the parsed subcommand with the function that runs it. One file per subcommand.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace mla::cli {

struct Command {
  CLI::App* app;            // the registered subcommand
  std::function<int()> run; // runs it after parsing; returns the exit code
};

Command add_make_model_command(CLI::App& app);
Command add_generate_command(CLI::App& app);
Command add_info_command(CLI::App& app);
Command add_plan_command(CLI::App& app);
Command add_chat_template_command(CLI::App& app);
Command add_tokenize_command(CLI::App& app);
Command add_perplexity_command(CLI::App& app);
Command add_serve_command(CLI::App& app);
Command add_chat_command(CLI::App& app);
Command add_bench_command(CLI::App& app);

}  // namespace mla::cli
