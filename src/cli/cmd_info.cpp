// `mlaserve info`: validate a model directory (config + every tensor) and print what it holds.
#include <cstdio>
#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "cli/commands.h"
#include "model/deepseek_v3.h"

namespace mla::cli {

Command add_info_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand("info", "Check a model directory (config and all tensors) and describe it");
  sub->add_option("--model", *dir, "Model directory")->required();
  return {sub, [dir] {
            std::unique_ptr<ops::Backend> backend = cpu::make_cpu_backend();
            dist::SingleProcessCommunicator comm;
            model::ModelLimits limits;
            limits.max_tokens = 1;
            limits.max_seqs = 1;
            auto m = model::DeepseekV3::load(*dir, *backend, limits, comm);
            if (!m) {
              std::fprintf(stderr, "mlaserve info: %s\n", m.status().message().c_str());
              return 1;
            }
            std::printf("%s\ncheckpoint: %zu tensors, %.1f MB in %zu file(s); all checked\n",
                        io::describe((*m)->config()).c_str(), (*m)->checkpoint().num_tensors(),
                        double((*m)->checkpoint().total_bytes()) / 1e6, (*m)->checkpoint().files().size());
            return 0;
          }};
}

}  // namespace mla::cli
