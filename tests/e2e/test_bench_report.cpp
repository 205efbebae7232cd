// The bench HTML report: built from a synthetic result, checked as text (charts, table rows, no
// network references, cost arithmetic, escaping, bad input), then rendered in headless Chromium
// (Debian's `chromium`, installed by scripts/install_deps.sh): the page's self-check must pass, the
// console must stay silent, and the PNG of the main chart must come out at the requested size.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/report.h"
#include "bench/svg_chart.h"

namespace mla::bench {
namespace {

using nlohmann::json;

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos; pos = haystack.find(needle, pos + 1)) ++n;
  return n;
}

// Five concurrency points shaped like a real sweep (per-user speed falls, aggregate rises, the last
// one is past the knee and dominated), each with per-request TTFT and ITL samples in seconds.
json synthetic_result() {
  struct Row { int c; double tpot_ms, ttft_ms, out_tps; };
  const Row rows[] = {{1, 8.0, 40, 124}, {4, 9.0, 55, 440}, {16, 12.0, 90, 1300}, {64, 25.0, 300, 2500},
                      {128, 50.0, 900, 2400}};
  json points = json::array();
  for (const Row& r : rows) {
    json ttfts = json::array(), itls = json::array();
    const int requests = 2 * r.c;
    for (int i = 0; i < requests; ++i) {
      ttfts.push_back(r.ttft_ms * (0.8 + 0.4 * i / requests) / 1e3);
      json gaps = json::array();
      for (int t = 0; t < 20; ++t) gaps.push_back(r.tpot_ms * (0.9 + 0.01 * ((i * 7 + t * 3) % 20)) / 1e3);
      itls.push_back(gaps);
    }
    points.push_back({{"max_concurrency", r.c},
                      {"request_rate", "inf"},
                      {"completed", requests},
                      {"failed", 0},
                      {"request_throughput", r.out_tps / 400},
                      {"output_throughput", r.out_tps},
                      {"input_throughput", r.out_tps * 1024 / 400},
                      {"total_token_throughput", r.out_tps * 1424 / 400},
                      {"mean_ttft_ms", r.ttft_ms},
                      {"median_ttft_ms", r.ttft_ms},
                      {"p99_ttft_ms", r.ttft_ms * 1.2},
                      {"mean_tpot_ms", r.tpot_ms},
                      {"p99_tpot_ms", r.tpot_ms * 1.1},
                      {"mean_itl_ms", r.tpot_ms},
                      {"p99_itl_ms", r.tpot_ms * 1.1},
                      {"mean_e2el_ms", r.ttft_ms + 399 * r.tpot_ms},
                      {"p99_e2el_ms", (r.ttft_ms + 399 * r.tpot_ms) * 1.1},
                      {"ttfts", ttfts},
                      {"itls", itls}});
  }
  return {{"model", "synthetic"},
          {"input_len", 1024},
          {"output_len", 400},
          {"points", points},
          {"cost", {{"gpu", "mi355x"}, {"gpus", 8}, {"usd_per_gpu_hour", 2.0}}}};
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "mla-report-test-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

TEST(BenchReport, HtmlHasEveryChartTheTableAndNoNetworkReference) {
  auto html = render_report_html(synthetic_result(), {});
  ASSERT_TRUE(html.is_ok()) << html.status().message();
  const std::string& h = html.value();
  for (const char* id : {"chart-pareto", "chart-cost", "chart-ttft", "chart-itl", "points-table"})
    EXPECT_EQ(count(h, fmt::format("id=\"{}\"", id)), 1u) << id;
  EXPECT_EQ(count(h, "<tr class=\"point-row\">"), 5u);
  EXPECT_EQ(count(h, "class=\"axis-label x-label\""), 4u);
  EXPECT_EQ(count(h, "class=\"axis-label y-label\""), 4u);
  EXPECT_EQ(count(h, "class=\"legend\""), 4u);
  EXPECT_NE(h.find("per-user output tok/s"), std::string::npos);
  EXPECT_NE(h.find("output tok/s per GPU"), std::string::npos);
  // c=128 is slower per user and lower per GPU than c=64: the only hollow (dominated) marker.
  EXPECT_EQ(count(h, "class=\"point hollow\""), 1u);
  EXPECT_EQ(count(h, "class=\"point\""), 4u);
  // Self-contained: nothing that could make a request.
  for (const char* bad : {"src=", "href=", "url(http", "@import", "http://", "https://", "<link", "<img"})
    EXPECT_EQ(h.find(bad), std::string::npos) << bad;
  EXPECT_NE(h.find("Content-Security-Policy"), std::string::npos);
}

TEST(BenchReport, CostAndPerGpuArithmetic) {
  json r = synthetic_result();
  auto html = render_report_html(r, {});
  ASSERT_TRUE(html.is_ok()) << html.status().message();
  // c=16: 1300 tok/s on 8 GPUs at $2/GPU-hour = $16/hour.
  const double per_gpu = 1300.0 / 8;
  const double usd_out = 16.0 / (1300.0 * 3600) * 1e6;
  const double usd_in = 16.0 / (1300.0 * 1024 / 400 * 3600) * 1e6;
  EXPECT_NE(html->find(fmt::format("data-y=\"{}\"", per_gpu)), std::string::npos);
  EXPECT_NE(html->find(fmt::format("data-x=\"{}\"", 1000.0 / 12.0)), std::string::npos);  // 1000 / TPOT
  EXPECT_NE(html->find(fmt::format("data-value=\"{}\"", usd_out)), std::string::npos) << usd_out;
  EXPECT_NE(html->find(fmt::format("data-value=\"{}\"", usd_in)), std::string::npos) << usd_in;
  EXPECT_NE(html->find("8 × mi355x at $2/GPU-hour"), std::string::npos);
  // A figure the point gives itself wins over the derived one; usd_per_hour wins over per-GPU price.
  r["points"][2]["usd_per_mtok_output"] = 9.5;
  r["cost"]["usd_per_hour"] = 32.0;
  auto html2 = render_report_html(r, {});
  ASSERT_TRUE(html2.is_ok());
  EXPECT_NE(html2->find("data-value=\"9.5\""), std::string::npos);
  EXPECT_NE(html2->find(fmt::format("data-value=\"{}\"", 32.0 / (2500.0 * 3600) * 1e6)), std::string::npos);
}

TEST(BenchReport, PlannerEstimateIsDrawnBesideTheMeasurement) {
  json r = synthetic_result();
  r["plan"] = {{"gpus", 8},
               {"points", {{{"plan_concurrency", 1}, {"plan_decode_tok_s", 400.0}, {"plan_decode_tok_s_per_user", 400.0}},
                           {{"plan_concurrency", 64}, {"plan_decode_tok_s", 8000.0}, {"plan_decode_tok_s_per_user", 125.0}}}}};
  auto html = render_report_html(r, {});
  ASSERT_TRUE(html.is_ok()) << html.status().message();
  EXPECT_NE(html->find("data-name=\"planner estimate"), std::string::npos);
  EXPECT_NE(html->find(">plan c=64<"), std::string::npos);
  EXPECT_NE(html->find("data-y=\"1000\""), std::string::npos);  // 8000 tok/s over 8 GPUs
}

TEST(BenchReport, WithoutPriceOrSamplesSaysSo) {
  json r = synthetic_result();
  r.erase("cost");
  for (auto& p : r["points"]) {
    p.erase("ttfts");
    p.erase("itls");
  }
  auto html = render_report_html(r, {});
  ASSERT_TRUE(html.is_ok()) << html.status().message();
  EXPECT_NE(html->find("id=\"chart-pareto\""), std::string::npos);
  for (const char* id : {"chart-cost", "chart-ttft", "chart-itl"}) EXPECT_EQ(html->find(id), std::string::npos) << id;
  EXPECT_NE(html->find("--price"), std::string::npos);
  EXPECT_EQ(count(*html, "no per-request samples"), 2u);
  EXPECT_NE(html->find("output tok/s (all GPUs)"), std::string::npos);
}

TEST(BenchReport, EscapesTextAndRejectsMalformedResults) {
  json r = synthetic_result();
  r["model"] = "<script>alert('x')</script>";
  auto html = render_report_html(r, {});
  ASSERT_TRUE(html.is_ok());
  EXPECT_EQ(html->find("<script>alert"), std::string::npos);
  EXPECT_NE(html->find("&lt;script&gt;alert(&#39;x&#39;)"), std::string::npos);

  EXPECT_FALSE(render_report_html(json::object(), {}).is_ok());
  EXPECT_FALSE(render_report_html({{"points", json::array()}}, {}).is_ok());
  json bad = synthetic_result();
  bad["points"][1]["output_throughput"] = "fast";
  const auto e = render_report_html(bad, {});
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("points[1].output_throughput"), std::string::npos) << e.status().message();
  bad = synthetic_result();
  bad["points"][0]["itls"] = json::array({"x"});
  EXPECT_FALSE(render_report_html(bad, {}).is_ok());
  // Nulls (vLLM writes max_concurrency: null in rate mode) and NaN-free gaps are fine.
  json rate = synthetic_result();
  for (auto& p : rate["points"]) p["max_concurrency"] = nullptr;
  rate["points"][0]["request_rate"] = 4.0;
  rate["points"][1]["request_rate"] = 2.5;
  rate["points"][1]["max_concurrency"] = 8;
  auto ok = render_report_html(rate, {});
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_NE(ok->find(">r=4/s<"), std::string::npos);
  EXPECT_NE(ok->find(">r=2.50/s c≤8<"), std::string::npos);
  EXPECT_NE(ok->find(">r=inf<"), std::string::npos);
  EXPECT_FALSE(write_report(synthetic_result(), "/nonexistent-dir/x.html").is_ok());
}

TEST(BenchReport, NiceTicksAndNumbers) {
  EXPECT_EQ(nice_ticks(0, 97), (std::vector<double>{0, 20, 40, 60, 80, 100}));
  EXPECT_EQ(nice_ticks(0, 1), (std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}));
  const auto single = nice_ticks(5, 5);  // one value: a range around it
  EXPECT_LT(single.front(), 5);
  EXPECT_GT(single.back(), 5);
  EXPECT_EQ(format_number(1234.6), "1235");
  EXPECT_EQ(format_number(64), "64");
  EXPECT_EQ(format_number(0.012345), "0.0123");
  EXPECT_EQ(format_number(2.5), "2.50");
  EXPECT_EQ(format_number(NAN), "–");
}

// Headless Chromium: --dump-dom gives the DOM after the page's inline self-check ran; with
// --enable-logging=stderr every console message shows up as a "CONSOLE" line on stderr.
TEST(BenchReport, RendersInHeadlessChromiumWithoutConsoleErrors) {
  const auto chromium = find_chromium();
  ASSERT_TRUE(chromium.is_ok()) << chromium.status().message() << " (CI installs it; this test is not skipped)";
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  const std::string html_path = (dir.path / "report.html").string();
  ASSERT_TRUE(write_report(synthetic_result(), html_path).is_ok());

  const auto run = run_chromium({"--enable-logging=stderr", "--v=0", "--dump-dom", report_file_url(html_path)}, 60);
  ASSERT_TRUE(run.is_ok()) << run.status().message();
  const std::string& dom = run->stdout_text;
  ASSERT_EQ(run->exit_code, 0) << run->stderr_text;
  EXPECT_NE(dom.find("data-ok=\"1\""), std::string::npos) << dom.substr(0, 2000);
  EXPECT_EQ(dom.find("report-error\""), std::string::npos)
      << dom.substr(dom.find("report-error") == std::string::npos ? 0 : dom.find("report-error"), 500);
  for (const char* id : {"chart-pareto", "chart-cost", "chart-ttft", "chart-itl", "points-table"})
    EXPECT_NE(dom.find(fmt::format("id=\"{}\"", id)), std::string::npos) << id;
  EXPECT_EQ(count(dom, "<tr class=\"point-row\">"), 5u);
  EXPECT_NE(dom.find("per-user output tok/s"), std::string::npos);
  std::istringstream err(run->stderr_text);
  for (std::string line; std::getline(err, line);) EXPECT_EQ(line.find("CONSOLE"), std::string::npos) << line;

  // The PNG of the main chart, at the window size asked for (width and height are the big-endian
  // words at bytes 16..23 of the IHDR chunk).
  const std::string png_path = (dir.path / "report.png").string();
  const Status st = render_report_png(html_path, png_path, 900, 600);
  ASSERT_TRUE(st.is_ok()) << st.message();
  std::ifstream in(png_path, std::ios::binary);
  std::string png((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GE(png.size(), 24u);
  auto be32 = [&](size_t at) {
    return (static_cast<uint32_t>(static_cast<unsigned char>(png[at])) << 24) |
           (static_cast<uint32_t>(static_cast<unsigned char>(png[at + 1])) << 16) |
           (static_cast<uint32_t>(static_cast<unsigned char>(png[at + 2])) << 8) |
           static_cast<uint32_t>(static_cast<unsigned char>(png[at + 3]));
  };
  EXPECT_EQ(png.compare(0, 8, "\x89PNG\r\n\x1a\n"), 0);
  EXPECT_EQ(be32(16), 900u);
  EXPECT_EQ(be32(20), 600u);
}

TEST(BenchReport, MissingChromiumIsAClearError) {
  const char* old = std::getenv("MLA_CHROMIUM");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("MLA_CHROMIUM", "/nonexistent/chromium", 1);
  const auto r = find_chromium();
  if (old != nullptr) ::setenv("MLA_CHROMIUM", saved.c_str(), 1);
  else ::unsetenv("MLA_CHROMIUM");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("MLA_CHROMIUM"), std::string::npos);
  TempDir dir;
  EXPECT_FALSE(render_report_png((dir.path / "missing.html").string(), (dir.path / "x.png").string()).is_ok());
}

}  // namespace
}  // namespace mla::bench
