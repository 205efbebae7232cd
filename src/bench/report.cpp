// The bench report: JSON result in, one self-contained HTML page out (inline CSS, inline SVG, one
// inline script that only checks the page), plus a PNG of its main chart via headless Chromium.
// Trade-off: charts are drawn in C++ (svg_chart) rather than by a JS library, so the page needs no
// network and renders the same in any browser or in a file viewer that ignores scripts.
#include "bench/report.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "bench/svg_chart.h"

extern char** environ;

namespace mla::bench {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A number field, or NaN when absent, null or non-finite.
double num(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return kNaN;
  double v = it->get<double>();
  return std::isfinite(v) ? v : kNaN;
}

// A positive figure, else NaN: B1's cost arithmetic writes 0 for "no figure".
double positive(double v) { return std::isfinite(v) && v > 0 ? v : kNaN; }

// Seconds → ms, finite values only.
void append_ms(const json& list, std::vector<double>& out) {
  for (const auto& v : list) {
    if (v.is_number() && std::isfinite(v.get<double>())) out.push_back(v.get<double>() * 1e3);
  }
}

// Everything the charts and the table need from one point, in display units.
struct Point {
  std::string label;            // "c=8", "r=4/s", "r=inf" or "#3"
  const json* raw = nullptr;    // the point's JSON (table columns read it directly)
  double per_user = kNaN;       // tok/s one user sees
  double per_gpu = kNaN;        // output tok/s per GPU
  double usd_out = kNaN, usd_in = kNaN, usd_total = kNaN;  // $ per million tokens
  std::vector<double> ttft_ms, itl_ms;
};

struct CostInfo {
  bool present = false;     // a price: $ figures can be derived
  bool gpus_known = false;  // from "cost" or "plan": throughput is divided per GPU
  std::string gpu, source, date;
  double gpus = 1, usd_per_hour = kNaN, usd_per_gpu_hour = kNaN;
};

Status validate(const json& result) {
  if (!result.is_object()) return Status::error("bench result: expected a JSON object");
  auto pts = result.find("points");
  if (pts == result.end() || !pts->is_array() || pts->empty())
    return Status::error("bench result: \"points\" must be a non-empty array");
  static constexpr const char* kNumeric[] = {
      "completed", "request_throughput", "output_throughput", "total_token_throughput", "input_throughput",
      "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms", "per_user_tok_s", "usd_per_mtok_output",
      "usd_per_mtok_input"};
  for (size_t i = 0; i < pts->size(); ++i) {
    const json& p = (*pts)[i];
    if (!p.is_object()) return error("bench result: points[{}] is not an object", i);
    for (const char* key : kNumeric) {
      auto it = p.find(key);
      if (it != p.end() && !it->is_number() && !it->is_null())
        return error("bench result: points[{}].{} must be a number", i, key);
    }
    for (const char* key : {"ttfts", "itls"}) {
      auto it = p.find(key);
      if (it != p.end() && !it->is_array() && !it->is_null())
        return error("bench result: points[{}].{} must be an array", i, key);
    }
    if (auto it = p.find("itls"); it != p.end() && it->is_array()) {
      for (const auto& per_request : *it)
        if (!per_request.is_array() && !per_request.is_number())
          return error("bench result: points[{}].itls must hold one list per request", i);
    }
  }
  if (auto c = result.find("cost"); c != result.end() && !c->is_object() && !c->is_null())
    return Status::error("bench result: \"cost\" must be an object");
  return Status::ok();
}

CostInfo read_cost(const json& result) {
  CostInfo c;
  if (auto p = result.find("plan"); p != result.end() && p->is_object()) {
    if (double g = num(*p, "gpus"); g >= 1) c.gpus = g, c.gpus_known = true;
  }
  auto it = result.find("cost");
  if (it == result.end() || !it->is_object()) return c;
  const json& j = *it;
  if (auto g = j.find("gpu"); g != j.end() && g->is_string()) c.gpu = g->get<std::string>();
  if (auto s = j.find("price_source"); s != j.end() && s->is_string()) c.source = s->get<std::string>();
  if (auto d = j.find("price_date"); d != j.end() && d->is_string()) c.date = d->get<std::string>();
  if (double g = num(j, "gpus"); g >= 1) c.gpus = g, c.gpus_known = true;
  c.usd_per_gpu_hour = positive(num(j, "usd_per_gpu_hour"));
  c.usd_per_hour = positive(num(j, "usd_per_hour"));
  if (std::isnan(c.usd_per_hour)) c.usd_per_hour = c.usd_per_gpu_hour * c.gpus;
  if (std::isnan(c.usd_per_gpu_hour)) c.usd_per_gpu_hour = c.usd_per_hour / c.gpus;
  c.present = std::isfinite(c.usd_per_hour);
  return c;
}

// "c=8" (concurrency sweep), "r=4/s" or "r=4/s c≤8" (Poisson arrivals, optionally capped), "r=inf"
// (all at once, uncapped), else the point's position.
std::string point_label(const json& p, size_t index) {
  const double c = num(p, "max_concurrency");
  const std::string cap = std::isfinite(c) ? format_number(c, 6) : std::string();
  if (auto r = p.find("request_rate"); r != p.end() && r->is_number())
    return fmt::format("r={}/s{}", format_number(r->get<double>(), 3), cap.empty() ? "" : " c≤" + cap);
  if (!cap.empty()) return "c=" + cap;
  if (auto r = p.find("request_rate"); r != p.end() && r->is_string()) return "r=" + r->get<std::string>();
  return fmt::format("#{}", index + 1);
}

// $/Mtok of one token kind: the point's own figure (top level or in its "cost" object), else the
// hour's price over that throughput.
double usd_per_mtok(const json& p, const char* key, double usd_per_hour, double tok_per_s) {
  double v = positive(num(p, key));
  if (auto c = p.find("cost"); std::isnan(v) && c != p.end() && c->is_object()) v = positive(num(*c, key));
  if (std::isnan(v) && std::isfinite(tok_per_s) && tok_per_s > 0) v = positive(usd_per_hour / (tok_per_s * 3600) * 1e6);
  return v;
}

std::vector<Point> read_points(const json& result, const CostInfo& cost) {
  std::vector<Point> out;
  const json& pts = result["points"];
  for (size_t i = 0; i < pts.size(); ++i) {
    const json& p = pts[i];
    Point pt;
    pt.raw = &p;
    pt.label = point_label(p, i);
    const double out_tps = positive(num(p, "output_throughput"));
    pt.per_user = positive(num(p, "per_user_tok_s"));
    if (std::isnan(pt.per_user)) pt.per_user = positive(1e3 / num(p, "mean_tpot_ms"));
    if (std::isnan(pt.per_user)) pt.per_user = positive(out_tps / num(p, "max_concurrency"));
    pt.per_gpu = out_tps / cost.gpus;
    double in_tps = positive(num(p, "input_throughput"));
    if (std::isnan(in_tps)) in_tps = positive(num(p, "total_token_throughput") - out_tps);
    pt.usd_out = usd_per_mtok(p, "usd_per_mtok_output", cost.usd_per_hour, out_tps);
    pt.usd_in = usd_per_mtok(p, "usd_per_mtok_input", cost.usd_per_hour, in_tps);
    pt.usd_total = usd_per_mtok(p, "usd_per_mtok_total", cost.usd_per_hour, positive(num(p, "total_token_throughput")));
    if (auto t = p.find("ttfts"); t != p.end() && t->is_array()) append_ms(*t, pt.ttft_ms);
    if (auto t = p.find("itls"); t != p.end() && t->is_array()) {
      for (const auto& per_request : *t) {
        if (per_request.is_array()) append_ms(per_request, pt.itl_ms);
        else if (per_request.is_number()) append_ms(json::array({per_request}), pt.itl_ms);
      }
    }
    std::sort(pt.ttft_ms.begin(), pt.ttft_ms.end());
    std::sort(pt.itl_ms.begin(), pt.itl_ms.end());
    out.push_back(std::move(pt));
  }
  return out;
}

// The planner's roofline estimate per point (`bench --plan`), as a series in the Pareto chart's
// units: x = plan_decode_tok_s_per_user, y = plan_decode_tok_s / GPUs.
XySeries plan_series(const json& result, double gpus) {
  XySeries s;
  s.name = "planner estimate (roofline, upper bound)";
  s.color = 2;
  auto p = result.find("plan");
  if (p == result.end() || !p->is_object()) return s;
  auto pts = p->find("points");
  if (pts == p->end() || !pts->is_array()) return s;
  for (const json& e : *pts) {
    if (!e.is_object()) continue;
    const double x = positive(num(e, "plan_decode_tok_s_per_user")), y = positive(num(e, "plan_decode_tok_s")) / gpus;
    if (std::isnan(x) || std::isnan(y)) continue;
    const double c = num(e, "plan_concurrency");
    s.x.push_back(x);
    s.y.push_back(y);
    s.hollow.push_back(true);
    s.point_labels.push_back(std::isfinite(c) ? fmt::format("plan c={}", format_number(c)) : "plan");
    s.point_titles.push_back(fmt::format("planner: {} tok/s per user, {} tok/s per GPU", format_number(x),
                                         format_number(y)));
  }
  return s;
}

// Throughput per GPU against per-user tok/s. A point is on the Pareto frontier when no other point
// is at least as fast per user and at least as high per GPU (and better in one); the frontier is
// drawn as a line, dominated points as hollow markers.
std::string pareto_chart(const std::vector<Point>& points, const CostInfo& cost, const json& result) {
  XyChart chart;
  chart.id = "chart-pareto";
  chart.title = "Throughput per GPU vs per-user speed (one point per load level)";
  chart.x.label = "per-user output tok/s (1000 / mean TPOT)";
  chart.y.label = cost.gpus_known ? fmt::format("output tok/s per GPU ({} GPU{})", format_number(cost.gpus, 6),
                                                cost.gpus == 1 ? "" : "s")
                               : std::string("output tok/s (all GPUs)");
  chart.width = 1000;
  chart.height = 560;
  XySeries all, frontier;
  all.name = "measured point (hollow: dominated)";
  frontier.name = "Pareto frontier";
  all.line = false;
  frontier.markers = false;
  frontier.color = 1;
  all.color = 0;
  std::vector<std::pair<double, double>> front;
  for (size_t i = 0; i < points.size(); ++i) {
    const Point& p = points[i];
    if (std::isnan(p.per_user) || std::isnan(p.per_gpu)) continue;
    bool dominated = false;
    for (size_t j = 0; j < points.size() && !dominated; ++j) {
      const Point& q = points[j];
      if (j == i || std::isnan(q.per_user) || std::isnan(q.per_gpu)) continue;
      dominated = q.per_user >= p.per_user && q.per_gpu >= p.per_gpu && (q.per_user > p.per_user || q.per_gpu > p.per_gpu);
    }
    all.x.push_back(p.per_user);
    all.y.push_back(p.per_gpu);
    all.hollow.push_back(dominated);
    all.point_labels.push_back(p.label);
    all.point_titles.push_back(fmt::format("{}: {} tok/s per user, {} tok/s per GPU{}", p.label,
                                           format_number(p.per_user), format_number(p.per_gpu),
                                           std::isnan(p.usd_out) ? "" : fmt::format(", ${}/Mtok out", format_number(p.usd_out))));
    if (!dominated) front.emplace_back(p.per_user, p.per_gpu);
  }
  std::sort(front.begin(), front.end());
  for (const auto& [x, y] : front) {
    frontier.x.push_back(x);
    frontier.y.push_back(y);
  }
  chart.series = {frontier, all};
  if (XySeries plan = plan_series(result, cost.gpus); !plan.x.empty()) chart.series.push_back(std::move(plan));
  return render_xy_chart(chart);
}

// An empirical CDF per point, each downsampled to at most 256 steps; the x axis stops at 1.15 x the
// largest p99 so one outlier does not squash the rest (the note under the chart says so).
std::string cdf_chart(const std::vector<Point>& points, bool itl, const std::string& id, const std::string& title,
                      const std::string& x_label, std::string* note) {
  XyChart chart;
  chart.id = id;
  chart.title = title;
  chart.x.label = x_label;
  chart.y.label = "requests at or below (%)";
  if (itl) chart.y.label = "inter-token gaps at or below (%)";
  chart.y.fixed_range = true;
  chart.y.min = 0;
  chart.y.max = 100;
  double x_max = 0, largest = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    const std::vector<double>& v = itl ? points[i].itl_ms : points[i].ttft_ms;
    if (v.empty()) continue;
    XySeries s;
    s.name = points[i].label;
    s.color = static_cast<int>(i);
    s.step = true;
    s.markers = false;
    const size_t n = v.size(), m = std::min<size_t>(n, 256);
    s.x.push_back(v.front());
    s.y.push_back(0);
    for (size_t k = 0; k < m; ++k) {
      const size_t idx = m == 1 ? n - 1 : (k * (n - 1)) / (m - 1);
      s.x.push_back(v[idx]);
      s.y.push_back(100.0 * static_cast<double>(idx + 1) / static_cast<double>(n));
    }
    x_max = std::max(x_max, v[std::min(n - 1, static_cast<size_t>(std::ceil(0.99 * static_cast<double>(n))) - 1)]);
    largest = std::max(largest, v.back());
    chart.series.push_back(std::move(s));
  }
  if (chart.series.empty()) {
    *note = "no per-request samples in the result";
    return {};
  }
  chart.x.fixed_range = true;
  chart.x.min = 0;
  chart.x.max = std::min(largest, x_max * 1.15);
  if (chart.x.max <= 0) chart.x.max = 1;
  const auto ticks = nice_ticks(0, chart.x.max);
  chart.x.max = ticks.back();
  *note = largest > chart.x.max ? fmt::format("x axis cut at {} ms (1.15 × the largest p99); the slowest sample is {} ms.",
                                              format_number(chart.x.max), format_number(largest))
                                : std::string();
  return render_xy_chart(chart);
}

std::string cost_chart(const std::vector<Point>& points) {
  BarChart chart;
  chart.id = "chart-cost";
  chart.title = "$ per million tokens at each load level";
  chart.x_label = "load level";
  chart.y.label = "$ / Mtok";
  chart.width = 1000;
  chart.height = 320;
  BarSeries out{"output tokens", {}}, in{"input tokens", {}};
  bool any_in = false;
  for (const Point& p : points) {
    chart.categories.push_back(p.label);
    out.values.push_back(p.usd_out);
    in.values.push_back(p.usd_in);
    any_in |= std::isfinite(p.usd_in);
  }
  chart.series.push_back(std::move(out));
  if (any_in) chart.series.push_back(std::move(in));
  return render_bar_chart(chart);
}

std::string cell(double v, int significant = 3) {
  return fmt::format("<td class=\"num\">{}</td>", format_number(v, significant));
}

std::string points_table(const std::vector<Point>& points) {
  std::string out =
      "<table id=\"points-table\" data-points=\"" + std::to_string(points.size()) +
      "\">\n<thead><tr><th>point</th><th>completed</th><th>failed</th><th>req/s</th><th>output tok/s</th>"
      "<th>total tok/s</th><th>tok/s per GPU</th><th>tok/s per user</th>"
      "<th>TTFT mean / p50 / p99 (ms)</th><th>TPOT mean / p99 (ms)</th><th>ITL mean / p99 (ms)</th>"
      "<th>E2E mean / p99 (ms)</th><th>$/Mtok out</th><th>$/Mtok in</th></tr></thead>\n<tbody>\n";
  for (const Point& p : points) {
    const json& j = *p.raw;
    auto trio = [&](const char* a, const char* b, const char* c) {
      return fmt::format("<td class=\"num\">{} / {} / {}</td>", format_number(num(j, a)), format_number(num(j, b)),
                         format_number(num(j, c)));
    };
    auto pair = [&](const char* a, const char* b) {
      return fmt::format("<td class=\"num\">{} / {}</td>", format_number(num(j, a)), format_number(num(j, b)));
    };
    out += "<tr class=\"point-row\"><th scope=\"row\">" + html_escape(p.label) + "</th>";
    out += cell(num(j, "completed"), 9) + cell(num(j, "failed"), 9) + cell(num(j, "request_throughput")) +
           cell(num(j, "output_throughput"), 4) + cell(num(j, "total_token_throughput"), 4) + cell(p.per_gpu, 4) +
           cell(p.per_user);
    out += trio("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms") + pair("mean_tpot_ms", "p99_tpot_ms") +
           pair("mean_itl_ms", "p99_itl_ms") + pair("mean_e2el_ms", "p99_e2el_ms");
    out += cell(p.usd_out) + cell(p.usd_in) + "</tr>\n";
  }
  out += "</tbody>\n</table>\n";
  return out;
}

std::string str_field(const json& result, const char* key) {
  for (const json* j : {&result, result.contains("config") ? &result["config"] : nullptr}) {
    if (j == nullptr || !j->is_object()) continue;
    auto it = j->find(key);
    if (it == j->end()) continue;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number()) return format_number(it->get<double>(), 9);
  }
  return {};
}

// Print: ~A4 landscape; #png (render_report_png): only the title and the main chart, filling the
// window.
constexpr const char* kCss = R"CSS(
:root { --fg: #1d2430; --muted: #5b6573; --line: #d8dde4; --card: #ffffff; --bg: #f3f5f8; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
       font: 14px/1.45 "DejaVu Sans", "Liberation Sans", Arial, Helvetica, sans-serif; }
header { padding: 18px 28px 6px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 0 0 8px; }
.meta { color: var(--muted); margin: 0; }
main { padding: 8px 28px 28px; max-width: 1400px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 14px 16px;
        margin-bottom: 16px; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(440px, 1fr)); gap: 16px; }
.cards .card { margin-bottom: 0; }
.cards + .card { margin-top: 16px; }
.note, .missing { color: var(--muted); font-size: 12.5px; margin: 6px 0 0; }
.missing { font-style: italic; }
svg.chart { width: 100%; height: auto; display: block; }
svg.chart text { font-family: "DejaVu Sans", "Liberation Sans", Arial, sans-serif; fill: var(--fg); }
.chart-bg { fill: #ffffff; }
.chart-title { font-size: 15px; font-weight: bold; }
.tick, .bar-label, .legend-entry { font-size: 11.5px; }
.point-label { font-size: 12px; fill: var(--muted) !important; }
.axis-label { font-size: 13px; }
line.grid { stroke: #e7eaef; stroke-width: 1; }
.axis-line { stroke: #7a8494; stroke-width: 1.2; }
.series-line { fill: none; stroke-width: 2.2; }
circle.point { stroke-width: 2; }
.legend-box { fill: #ffffff; fill-opacity: 0.9; stroke: var(--line); }
table { border-collapse: collapse; width: 100%; font-size: 12.5px; }
th, td { padding: 5px 8px; border-bottom: 1px solid var(--line); text-align: left; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
thead th { color: var(--muted); font-weight: 600; }
.table-wrap { overflow-x: auto; }
footer { color: var(--muted); font-size: 12px; padding: 0 28px 24px; }
#report-error { color: #b00020; white-space: pre-wrap; }
html.png body { background: #ffffff; }
html.png .cards, html.png #card-cost, html.png #card-table, html.png footer, html.png #card-pareto .note { display: none; }
html.png main { padding-top: 0; }
html.png #card-pareto { border: none; padding: 0 8px; }
)CSS";

// Self-check run by the browser (and by the CI test through --dump-dom): every chart has both axis
// titles and something drawn, and the table has one row per point. Success sets data-ok="1" on
// <body>; any failure or uncaught error appends <pre id="report-error"> with the reason.
constexpr const char* kScript = R"JS(
(function () {
  function fail(msg) {
    var el = document.getElementById('report-error');
    if (!el) {
      el = document.createElement('pre');
      el.id = 'report-error';
      document.body.appendChild(el);
    }
    el.textContent += msg + '\n';
    document.body.setAttribute('data-ok', '0');
  }
  window.addEventListener('error', function (e) { fail('error: ' + e.message); });
  var consoleError = console.error;
  console.error = function () { fail('console.error: ' + Array.prototype.join.call(arguments, ' ')); consoleError.apply(console, arguments); };
  if (location.hash === '#png') document.documentElement.classList.add('png');
  try {
    var charts = document.querySelectorAll('svg.chart');
    if (charts.length === 0) fail('no charts');
    charts.forEach(function (svg) {
      if (svg.querySelectorAll('.axis-label').length !== 2) fail(svg.id + ': expected two axis labels');
      if (svg.querySelectorAll('.tick').length < 2) fail(svg.id + ': no ticks');
      if (svg.querySelectorAll('.point, .bar, .series-line').length === 0) fail(svg.id + ': nothing drawn');
      var box = svg.getBoundingClientRect();
      var hidden = document.documentElement.classList.contains('png') && svg.id !== 'chart-pareto';
      if (!hidden && !(box.width > 0 && box.height > 0)) fail(svg.id + ': not laid out');
    });
    var table = document.getElementById('points-table');
    var rows = table ? table.querySelectorAll('tbody tr.point-row').length : -1;
    if (!table || String(rows) !== table.getAttribute('data-points')) fail('table: ' + rows + ' rows');
    if (!document.getElementById('report-error')) document.body.setAttribute('data-ok', '1');
  } catch (e) {
    fail('exception: ' + e);
  }
})();
)JS";

std::string percent_encode_path(const std::string& path) {
  std::string out;
  for (unsigned char c : path) {
    if (std::isalnum(c) || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') out += static_cast<char>(c);
    else out += fmt::format("%{:02X}", c);
  }
  return out;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool is_executable(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

}  // namespace

Result<std::string> render_report_html(const json& bench_result, const ReportOptions& options) {
  MLA_RETURN_IF_ERROR(validate(bench_result));
  const CostInfo cost = read_cost(bench_result);
  const std::vector<Point> points = read_points(bench_result, cost);

  std::vector<std::string> meta;
  if (auto m = str_field(bench_result, "model"); !m.empty()) meta.push_back("model " + html_escape(m));
  if (auto u = str_field(bench_result, "url"); !u.empty()) meta.push_back("server " + html_escape(u));
  auto in_len = str_field(bench_result, "input_len"), out_len = str_field(bench_result, "output_len");
  if (!in_len.empty() && !out_len.empty())
    meta.push_back(fmt::format("{} tokens in / {} out", html_escape(in_len), html_escape(out_len)));
  if (cost.present) {
    meta.push_back(fmt::format("{} × {} at ${}/GPU-hour{}", format_number(cost.gpus, 6),
                               html_escape(cost.gpu.empty() ? std::string("GPU") : cost.gpu),
                               format_number(cost.usd_per_gpu_hour),
                               cost.source.empty() ? std::string()
                                                   : " (" + html_escape(cost.source) +
                                                         (cost.date.empty() ? "" : ", " + html_escape(cost.date)) + ")"));
  }
  meta.push_back(fmt::format("{} load level{}", points.size(), points.size() == 1 ? "" : "s"));
  if (auto d = str_field(bench_result, "date"); !d.empty()) meta.push_back(html_escape(d));

  std::string html;
  html += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  // No network: the policy forbids every fetch; a violation shows as a console error, which the
  // CI test treats as a failure.
  html += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
          "script-src 'unsafe-inline'\">\n";
  html += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  html += "<title>" + html_escape(options.title) + "</title>\n<style>" + kCss + "</style>\n</head>\n<body>\n";
  html += "<header>\n<h1>" + html_escape(options.title) + "</h1>\n<p class=\"meta\">";
  for (size_t i = 0; i < meta.size(); ++i) html += (i ? " · " : "") + meta[i];
  html += "</p>\n</header>\n<main>\n";

  html += "<section class=\"card\" id=\"card-pareto\">\n" + pareto_chart(points, cost, bench_result);
  html += "<p class=\"note\">Each point is one load level (c = concurrent requests, r = request rate). Up and to "
          "the right is better: the frontier is the best throughput per GPU available at each per-user speed. "
          "Per-user tok/s = 1000 / mean TPOT; tok/s per GPU = output tok/s / GPUs.</p>\n</section>\n";

  html += "<section class=\"card\" id=\"card-cost\">\n";
  bool any_cost = false;
  for (const Point& p : points) any_cost |= std::isfinite(p.usd_out);
  if (any_cost) {
    html += cost_chart(points);
    html += "<p class=\"note\">$/Mtok = $/hour of all GPUs / (tok/s × 3600) × 10<sup>6</sup>, for output and "
            "input tokens separately; each charges the whole hour to that token kind, so they do not add up.</p>\n";
  } else {
    html += "<h2>$ per million tokens</h2><p class=\"missing\">No price in the result: run bench with --gpu KIND "
            "--gpus N or --price USD_PER_GPU_HOUR.</p>\n";
  }
  html += "</section>\n<div class=\"cards\">\n";
  for (bool itl : {false, true}) {
    std::string note;
    const std::string id = itl ? "chart-itl" : "chart-ttft";
    const std::string svg =
        itl ? cdf_chart(points, true, id, "Inter-token latency (ITL), CDF per load level", "ITL (ms)", &note)
            : cdf_chart(points, false, id, "Time to first token (TTFT), CDF per load level", "TTFT (ms)", &note);
    html += fmt::format("<section class=\"card\" id=\"card-{}\">\n", itl ? "itl" : "ttft");
    if (svg.empty()) {
      html += fmt::format("<h2>{}</h2><p class=\"missing\">{}</p>\n", itl ? "Inter-token latency" : "Time to first token",
                          note);
    } else {
      html += svg;
      if (!note.empty()) html += "<p class=\"note\">" + html_escape(note) + "</p>\n";
    }
    html += "</section>\n";
  }
  html += "</div>\n";

  html += "<section class=\"card\" id=\"card-table\">\n<h2>Points</h2>\n<div class=\"table-wrap\">\n" +
          points_table(points) + "</div>\n</section>\n</main>\n";
  html += "<footer>Generated by <code>mlaserve bench --report</code>. Self-contained: no network access, "
          "charts are inline SVG.</footer>\n";
  html += std::string("<script>") + kScript + "</script>\n</body>\n</html>\n";
  return html;
}

Status write_report(const json& bench_result, const std::string& html_path, const ReportOptions& options) {
  MLA_ASSIGN_OR_RETURN(std::string html, render_report_html(bench_result, options));
  std::ofstream out(html_path, std::ios::binary | std::ios::trunc);
  if (!out) return error("cannot write the report to {}", html_path);
  out << html;
  out.close();
  if (!out) return error("writing the report to {} failed", html_path);
  return Status::ok();
}

Result<std::string> find_chromium() {
  if (const char* env = std::getenv("MLA_CHROMIUM"); env != nullptr && *env != '\0') {
    if (is_executable(env)) return std::string(env);
    return error("$MLA_CHROMIUM={} is not an executable file", env);
  }
  const char* path_env = std::getenv("PATH");
  std::string path = path_env != nullptr ? path_env : "/usr/bin:/bin";
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    std::stringstream ss(path);
    std::string dir;
    while (std::getline(ss, dir, ':')) {
      if (dir.empty()) continue;
      fs::path candidate = fs::path(dir) / name;
      if (is_executable(candidate)) return candidate.string();
    }
  }
  return Status::error(
      "headless Chromium not found (looked for chromium, chromium-browser, google-chrome on PATH and "
      "$MLA_CHROMIUM); install Debian's package: scripts/install_deps.sh, or apt-get install chromium");
}

Result<ChromiumRun> run_chromium(const std::vector<std::string>& args, int timeout_s) {
  MLA_ASSIGN_OR_RETURN(std::string chromium, find_chromium());
  std::error_code ec;
  std::string tmpl = (fs::temp_directory_path(ec) / "mla-chromium-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) return error("mkdtemp {} failed", tmpl);
  const fs::path work = tmpl;
  const std::string out_path = (work / "stdout").string(), err_path = (work / "stderr").string();

  std::vector<std::string> argv_s = {chromium,
                                     "--headless",
                                     "--no-sandbox",
                                     "--disable-gpu",
                                     "--disable-background-networking",
                                     "--disable-component-update",
                                     "--disable-sync",
                                     "--no-first-run",
                                     "--no-default-browser-check",
                                     "--hide-scrollbars",
                                     "--user-data-dir=" + (work / "profile").string()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawnattr_init(&attr);
  // Its own process group, so a timeout can end Chromium's helper processes with it (and only them).
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, chromium.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    fs::remove_all(work, ec);
    return error("cannot start {}: {}", chromium, std::strerror(rc));
  }

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int wstatus = 0;
  bool timed_out = false;
  while (true) {
    pid_t w = ::waitpid(pid, &wstatus, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &wstatus, 0);
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ChromiumRun run;
  run.exit_code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  run.stdout_text = read_file(out_path);
  run.stderr_text = read_file(err_path);
  fs::remove_all(work, ec);
  if (timed_out) return error("{} did not finish within {} s", chromium, timeout_s);
  return run;
}

std::string report_file_url(const std::string& html_path, const std::string& fragment) {
  std::error_code ec;
  fs::path abs = fs::absolute(html_path, ec);
  return "file://" + percent_encode_path(abs.lexically_normal().string()) + (fragment.empty() ? "" : "#" + fragment);
}

Status render_report_png(const std::string& html_path, const std::string& png_path, int width, int height) {
  std::error_code ec;
  if (!fs::is_regular_file(html_path, ec)) return error("report {} does not exist", html_path);
  if (width <= 0 || height <= 0) return error("bad PNG size {}x{}", width, height);
  const fs::path png_abs = fs::absolute(png_path, ec);
  fs::remove(png_abs, ec);
  MLA_ASSIGN_OR_RETURN(ChromiumRun run,
                       run_chromium({"--screenshot=" + png_abs.string(), fmt::format("--window-size={},{}", width, height),
                                     report_file_url(html_path, "png")},
                                    /*timeout_s=*/60));
  const std::string png = read_file(png_abs);
  if (run.exit_code != 0 || png.size() < 8 || png.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) {
    std::string tail = run.stderr_text.substr(run.stderr_text.size() > 600 ? run.stderr_text.size() - 600 : 0);
    return error("chromium did not write a PNG to {} (exit {}); its stderr ends: {}", png_abs.string(), run.exit_code,
                 tail);
  }
  return Status::ok();
}

}  // namespace mla::bench
