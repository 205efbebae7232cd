// SVG chart drawing for the bench report. Coordinates are computed here in viewBox units and
// printed with one decimal; styling (fonts, stroke widths) is left to the report's CSS classes so
// that the charts stay small and consistent.
#include "bench/svg_chart.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace mla::bench {
namespace {

// Plot-area margins in viewBox units: room for the title (top), tick labels and axis titles.
constexpr double kLeft = 72, kRight = 18, kTop = 36, kBottom = 54;

struct Range {
  double lo = 0, hi = 1;
  std::vector<double> ticks;
};

Range axis_range(const ChartAxis& axis, const std::vector<double>& values) {
  Range r;
  if (axis.fixed_range) {
    r.lo = axis.min;
    r.hi = axis.max > axis.min ? axis.max : axis.min + 1;
    r.ticks = nice_ticks(r.lo, r.hi);
    std::erase_if(r.ticks, [&](double t) { return t < r.lo - 1e-9 * (r.hi - r.lo) || t > r.hi + 1e-9 * (r.hi - r.lo); });
    return r;
  }
  double lo = INFINITY, hi = -INFINITY;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (axis.from_zero && lo >= 0) lo = 0;
  hi += (hi - lo) * 0.06;  // headroom: markers and their labels stay inside the plot
  r.ticks = nice_ticks(lo, hi);
  r.lo = r.ticks.front();
  r.hi = r.ticks.back();
  return r;
}

std::string tick_label(double v, double step) {
  if (std::abs(v) < step * 1e-9) return "0";
  int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  if (std::abs(v) >= 1e6) return fmt::format("{:.3g}", v);
  return fmt::format("{:.{}f}", v, std::clamp(decimals, 0, 9));
}

struct Frame {
  double width, height;
  Range xr, yr;
  double pw() const { return width - kLeft - kRight; }
  double ph() const { return height - kTop - kBottom; }
  double sx(double x) const { return kLeft + (x - xr.lo) / (xr.hi - xr.lo) * pw(); }
  double sy(double y) const { return kTop + ph() - (y - yr.lo) / (yr.hi - yr.lo) * ph(); }
};

void open_svg(std::string& out, const std::string& id, const std::string& title, int width, int height) {
  out += fmt::format(
      "<svg id=\"{0}\" class=\"chart\" viewBox=\"0 0 {1} {2}\" role=\"img\" aria-labelledby=\"{0}-title\">\n"
      "<title id=\"{0}-title\">{3}</title>\n"
      "<rect class=\"chart-bg\" x=\"0\" y=\"0\" width=\"{1}\" height=\"{2}\"/>\n"
      "<text class=\"chart-title\" x=\"{4:.1f}\" y=\"22\" text-anchor=\"middle\">{3}</text>\n",
      html_escape(id), width, height, html_escape(title), width / 2.0);
}

// Grid lines, ticks, tick labels and the two axis titles. x_ticks = false leaves the x axis to the
// caller (bar charts label categories instead).
void draw_axes(std::string& out, const Frame& f, const std::string& x_label, const std::string& y_label,
               bool x_ticks) {
  const double x0 = kLeft, x1 = kLeft + f.pw(), y0 = kTop + f.ph(), y1 = kTop;
  out += "<g class=\"y-axis axis\">\n";
  double ystep = f.yr.ticks.size() > 1 ? f.yr.ticks[1] - f.yr.ticks[0] : 1;
  for (double t : f.yr.ticks) {
    double y = f.sy(t);
    out += fmt::format("<line class=\"grid\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>", x0, y, x1, y);
    out += fmt::format("<text class=\"tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", x0 - 6,
                       y + 4, tick_label(t, ystep));
  }
  out += fmt::format("<line class=\"axis-line\" x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\"/>\n", x0,
                     y0, y1);
  out += fmt::format(
      "<text class=\"axis-label y-label\" x=\"0\" y=\"0\" text-anchor=\"middle\" "
      "transform=\"translate(16 {:.1f}) rotate(-90)\">{}</text>\n</g>\n",
      kTop + f.ph() / 2, html_escape(y_label));
  out += "<g class=\"x-axis axis\">\n";
  if (x_ticks) {
    double xstep = f.xr.ticks.size() > 1 ? f.xr.ticks[1] - f.xr.ticks[0] : 1;
    for (double t : f.xr.ticks) {
      double x = f.sx(t);
      out += fmt::format("<line class=\"grid\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>", x, y0, x, y1);
      out += fmt::format("<text class=\"tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", x,
                         y0 + 16, tick_label(t, xstep));
    }
  }
  out += fmt::format("<line class=\"axis-line\" x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\"/>\n", x0, y0,
                     x1);
  out += fmt::format("<text class=\"axis-label x-label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n</g>\n",
                     kLeft + f.pw() / 2, f.height - 12, html_escape(x_label));
}

enum class Swatch { Line, Rect, Marker };
struct LegendEntry {
  std::string name;
  int color;
  Swatch swatch;
};

// Legend box in the plot area's top-right corner.
void draw_legend(std::string& out, const Frame& f, const std::vector<LegendEntry>& entries) {
  if (entries.empty()) return;
  size_t longest = 0;
  for (const auto& e : entries) longest = std::max(longest, e.name.size());
  const double w = 34 + 6.5 * static_cast<double>(longest), h = 8 + 17.0 * static_cast<double>(entries.size());
  const double x = kLeft + f.pw() - w - 6, y = kTop + 6;
  out += fmt::format("<g class=\"legend\">\n<rect class=\"legend-box\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" "
                     "height=\"{:.1f}\"/>\n", x, y, w, h);
  for (size_t i = 0; i < entries.size(); ++i) {
    const double cy = y + 13 + 17.0 * static_cast<double>(i);
    const char* color = chart_color(entries[i].color);
    if (entries[i].swatch == Swatch::Rect) {
      out += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"14\" height=\"10\" fill=\"{}\"/>", x + 8, cy - 5,
                         color);
    } else if (entries[i].swatch == Swatch::Marker) {
      out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4.5\" fill=\"{}\"/>", x + 15, cy, color);
    } else {
      out += fmt::format("<line class=\"series-line\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
                         "stroke=\"{}\"/>", x + 6, cy, x + 24, cy, color);
    }
    out += fmt::format("<text class=\"legend-entry\" x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", x + 28, cy + 4,
                       html_escape(entries[i].name));
  }
  out += "</g>\n";
}

}  // namespace

const char* chart_color(int index) {
  static constexpr const char* kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                             "#E69F00", "#56B4E9", "#555555", "#F0E442"};
  constexpr int n = sizeof(kPalette) / sizeof(kPalette[0]);
  return kPalette[((index % n) + n) % n];
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {0, 1};
  if (hi < lo) std::swap(lo, hi);
  if (hi - lo <= std::abs(hi) * 1e-12) {  // a single value: a range of ±half of it (at least ±0.5)
    double pad = std::max(std::abs(lo) * 0.5, 0.5);
    lo = lo >= 0 && lo - pad < 0 ? 0 : lo - pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  const double start = std::floor(lo / step + 1e-9) * step;
  const double end = std::ceil(hi / step - 1e-9) * step;
  const int n = std::min(50, static_cast<int>(std::lround((end - start) / step)) + 1);
  std::vector<double> ticks;
  for (int i = 0; i < n; ++i) ticks.push_back(start + step * i);
  if (ticks.size() < 2) ticks.push_back(start + step);
  return ticks;
}

std::string format_number(double v, int significant) {
  if (!std::isfinite(v)) return "–";
  if (v == 0) return "0";
  const double a = std::abs(v);
  if (a >= 1e9 || a < 1e-4) return fmt::format("{:.{}g}", v, significant);
  if (v == std::round(v)) return fmt::format("{:.0f}", v);  // counts and integer settings stay exact
  const int decimals = std::max(0, significant - 1 - static_cast<int>(std::floor(std::log10(a))));
  return fmt::format("{:.{}f}", v, decimals);
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string render_xy_chart(const XyChart& chart) {
  std::vector<double> xs, ys;
  for (const auto& s : chart.series) {
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      xs.push_back(s.x[i]);
      ys.push_back(s.y[i]);
    }
  }
  Frame f{static_cast<double>(chart.width), static_cast<double>(chart.height), axis_range(chart.x, xs),
          axis_range(chart.y, ys)};
  std::string out;
  open_svg(out, chart.id, chart.title, chart.width, chart.height);
  out += fmt::format("<clipPath id=\"{}-clip\"><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\"/>"
                     "</clipPath>\n", html_escape(chart.id), kLeft, kTop - 4, f.pw() + 4, f.ph() + 8);
  draw_axes(out, f, chart.x.label, chart.y.label, /*x_ticks=*/true);
  std::vector<LegendEntry> legend;
  for (size_t si = 0; si < chart.series.size(); ++si) {
    const XySeries& s = chart.series[si];
    const int color_index = s.color >= 0 ? s.color : static_cast<int>(si);
    const char* color = chart_color(color_index);
    if (!s.name.empty()) legend.push_back({s.name, color_index, s.line ? Swatch::Line : Swatch::Marker});
    out += fmt::format("<g class=\"series series-{}\" data-name=\"{}\" clip-path=\"url(#{}-clip)\">\n", si,
                       html_escape(s.name), html_escape(chart.id));
    const size_t n = std::min(s.x.size(), s.y.size());
    if (s.line && n > 1) {
      std::string d;
      bool first = true;
      for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
        if (first) {
          d += fmt::format("M{:.1f} {:.1f}", f.sx(s.x[i]), f.sy(s.y[i]));
          first = false;
        } else if (s.step) {
          d += fmt::format("H{:.1f}V{:.1f}", f.sx(s.x[i]), f.sy(s.y[i]));
        } else {
          d += fmt::format("L{:.1f} {:.1f}", f.sx(s.x[i]), f.sy(s.y[i]));
        }
      }
      out += fmt::format("<path class=\"series-line\" d=\"{}\" stroke=\"{}\"/>\n", d, color);
    }
    if (s.markers) {
      for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
        const bool hollow = i < s.hollow.size() && s.hollow[i];
        const double px = f.sx(s.x[i]), py = f.sy(s.y[i]);
        out += fmt::format("<circle class=\"point{}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4.5\" stroke=\"{}\" fill=\"{}\" "
                           "data-x=\"{}\" data-y=\"{}\">",
                           hollow ? " hollow" : "", px, py, color, hollow ? "#ffffff" : color, s.x[i], s.y[i]);
        if (i < s.point_titles.size()) out += fmt::format("<title>{}</title>", html_escape(s.point_titles[i]));
        out += "</circle>\n";
        if (i < s.point_labels.size() && !s.point_labels[i].empty()) {
          out += fmt::format("<text class=\"point-label\" x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", px + 7, py - 7,
                             html_escape(s.point_labels[i]));
        }
      }
    }
    out += "</g>\n";
  }
  draw_legend(out, f, legend);
  out += "</svg>\n";
  return out;
}

std::string render_bar_chart(const BarChart& chart) {
  std::vector<double> values;
  for (const auto& s : chart.series) values.insert(values.end(), s.values.begin(), s.values.end());
  ChartAxis x_axis;
  x_axis.fixed_range = true;
  x_axis.min = 0;
  x_axis.max = std::max<double>(1, static_cast<double>(chart.categories.size()));
  Frame f{static_cast<double>(chart.width), static_cast<double>(chart.height), axis_range(x_axis, {}),
          axis_range(chart.y, values)};
  std::string out;
  open_svg(out, chart.id, chart.title, chart.width, chart.height);
  draw_axes(out, f, chart.x_label, chart.y.label, /*x_ticks=*/false);
  const double ncat = std::max<double>(1, static_cast<double>(chart.categories.size()));
  const double group_w = f.pw() / ncat;
  const double bar_w = group_w * 0.7 / std::max<double>(1, static_cast<double>(chart.series.size()));
  const double base_y = f.sy(std::max(f.yr.lo, 0.0));
  out += "<g class=\"x-categories\">\n";
  for (size_t c = 0; c < chart.categories.size(); ++c) {
    out += fmt::format("<text class=\"tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                       kLeft + group_w * (static_cast<double>(c) + 0.5), kTop + f.ph() + 16,
                       html_escape(chart.categories[c]));
  }
  out += "</g>\n";
  std::vector<LegendEntry> legend;
  for (size_t si = 0; si < chart.series.size(); ++si) {
    const BarSeries& s = chart.series[si];
    const char* color = chart_color(static_cast<int>(si));
    legend.push_back({s.name, static_cast<int>(si), Swatch::Rect});
    out += fmt::format("<g class=\"series series-{}\" data-name=\"{}\">\n", si, html_escape(s.name));
    for (size_t c = 0; c < std::min(s.values.size(), chart.categories.size()); ++c) {
      if (!std::isfinite(s.values[c])) continue;
      const double x = kLeft + group_w * static_cast<double>(c) + group_w * 0.15 + bar_w * static_cast<double>(si);
      const double y = f.sy(s.values[c]);
      out += fmt::format("<rect class=\"bar\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
                         "fill=\"{}\" data-value=\"{}\"><title>{}: {}</title></rect>\n",
                         x, std::min(y, base_y), bar_w, std::abs(base_y - y), color, s.values[c],
                         html_escape(chart.categories[c]), format_number(s.values[c]));
      out += fmt::format("<text class=\"bar-label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                         x + bar_w / 2, std::min(y, base_y) - 4, format_number(s.values[c]));
    }
    out += "</g>\n";
  }
  draw_legend(out, f, legend);
  out += "</svg>\n";
  return out;
}

}  // namespace mla::bench
