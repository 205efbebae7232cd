// The self-contained HTML benchmark report (`mlaserve bench --report out.html`): inline CSS, inline
// SVG charts drawn here in C++, no script or font from the network. A PNG of its main chart (for
// the README) is rendered by headless Chromium, the one external tool this file depends on.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mla::bench {

// Input: the bench result JSON, as `mlaserve bench --result-json` writes it.
//
// {
//   "model": "NAME",                       optional, shown in the title
//   "url": "http://...",                   optional
//   "input_len": 1024, "output_len": 400,  optional, shown in the header
//   "points": [                            one per concurrency / request-rate point, required
//     {
//       "max_concurrency": 8,              int or null (request-rate mode); point label
//       "request_rate": "inf" | 4.0,       number or string (vLLM writes "inf"); label in rate mode
//       "completed": 64,                   requests that succeeded
//       "request_throughput": 1.9,         req/s
//       "output_throughput": 760.0,        output tok/s, aggregate (all GPUs)
//       "total_token_throughput": 2700.0,  (input + output) tok/s
//       "input_throughput": 1940.0,        input tok/s; optional (else total - output)
//       "failed": 0,                       optional
//       "per_user_tok_s": 95.0,            optional; else 1000 / mean_tpot_ms
//       "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
//       "mean_tpot_ms", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms",
//       "mean_itl_ms",  "median_itl_ms",  "p90_itl_ms",  "p99_itl_ms",
//       "mean_e2el_ms", "median_e2el_ms", "p90_e2el_ms", "p99_e2el_ms",   all ms; any may be absent
//       "ttfts": [0.05, ...],              seconds, one per request (histogram/CDF); optional
//       "itls":  [[0.01, 0.011, ...], ...] seconds, one list per request; optional
//       "usd_per_mtok_output": 0.42,       optional (here or in a per-point "cost" object); else
//       "usd_per_mtok_input": 0.12         derived from cost.usd_per_hour (below); 0 = no figure
//     }, ...
//   ],
//   "cost": {                              optional (no $ chart without it)
//     "gpu": "mi355x", "gpus": 8,          GPU kind and count (per-GPU throughput divides by gpus)
//     "usd_per_gpu_hour": 2.1,             price of one GPU
//     "usd_per_hour": 16.8,                price of all of them; if absent, usd_per_gpu_hour * gpus
//     "price_source": "...", "price_date": "2026-01"   optional, shown in the header
//   },
//   "plan": {                              optional (`bench --plan`): drawn in the Pareto chart
//     "gpus": 8,
//     "points": [ {"plan_concurrency": 8, "plan_decode_tok_s": 900.0,
//                  "plan_decode_tok_s_per_user": 112.0}, ... ]
//   }
// }
// "model", "url", "input_len" and "output_len" are also looked up in a top-level "config" object.
//
// Derived per point (written beside each chart so a reader can check it):
//   per-user tok/s  = 1000 / mean_tpot_ms  (decode speed one user sees; falls back to
//                     output_throughput / max_concurrency when TPOT is absent)
//   tok/s per GPU   = output_throughput / gpus  (cost.gpus, else plan.gpus, else 1: "all GPUs")
//   $/Mtok output   = usd_per_hour / (output_throughput * 3600) * 1e6, unless the point gives it;
//   $/Mtok input    = usd_per_hour / (input_throughput * 3600) * 1e6, likewise.
// Points that lack output_throughput are listed in the table and left out of the charts.

struct ReportOptions {
  std::string title = "mlaserve bench report";  // <title> and <h1>
};

// Builds the report HTML in memory (the test and write_report share it). Errors: a missing or empty
// "points" array, or a field of the wrong JSON type.
Result<std::string> render_report_html(const nlohmann::json& bench_result, const ReportOptions& options);

// Writes render_report_html(...) to html_path.
Status write_report(const nlohmann::json& bench_result, const std::string& html_path,
                    const ReportOptions& options = {});

// Screenshots html_path's main chart (the Pareto curve) into png_path with headless Chromium
// (`chromium` on PATH, or $MLA_CHROMIUM). It opens the page as file://...#png, where the page's own
// script hides everything but the title and that chart. Errors name what is missing.
Status render_report_png(const std::string& html_path, const std::string& png_path, int width = 1200,
                         int height = 800);

// file:// URL of a local file (made absolute, percent-encoded), with an optional #fragment.
std::string report_file_url(const std::string& html_path, const std::string& fragment = {});

// One headless Chromium run: the flags TOOLCHAIN.md lists (no sandbox, no GPU, no background
// networking), a fresh --user-data-dir removed afterwards, then `args`. Killed (with its helper
// processes) after timeout_s. Errors: Chromium missing, not startable, or timed out.
struct ChromiumRun {
  int exit_code = -1;        // -1 when killed by a signal
  std::string stdout_text;   // e.g. the DOM with --dump-dom
  std::string stderr_text;   // with --enable-logging=stderr, console messages appear as "CONSOLE"
};
Result<ChromiumRun> run_chromium(const std::vector<std::string>& args, int timeout_s = 60);

// Finds the Chromium binary: $MLA_CHROMIUM, then chromium, chromium-browser, google-chrome on PATH.
// Returns an error saying how to install it (scripts/install_deps.sh) when none is found.
Result<std::string> find_chromium();

}  // namespace mla::bench
