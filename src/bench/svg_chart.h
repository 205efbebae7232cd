// Inline SVG charts for the bench report: an XY chart (lines and/or markers) and a grouped bar
// chart, each with axes, "nice" ticks, axis labels and a legend. Plain strings, no DOM: the report
// embeds the output in its HTML. Every element a test may look for carries a class (`chart`,
// `x-axis`, `y-axis`, `axis-label`, `tick`, `legend`, `series`, `point`, `bar`).
#pragma once

#include <string>
#include <vector>

namespace mla::bench {

struct ChartAxis {
  std::string label;           // axis title, with its unit
  double min = 0.0;            // used when fixed_range
  double max = 0.0;
  bool fixed_range = false;    // else the range is the data's, widened to nice ticks (from 0 if
  bool from_zero = true;       // from_zero and all data are non-negative)
};

struct XySeries {
  std::string name;                       // legend entry; empty = no legend entry
  std::vector<double> x, y;               // same length; non-finite pairs are skipped
  std::vector<std::string> point_labels;  // empty or one per point: text beside each marker
  std::vector<std::string> point_titles;  // empty or one per point: hover tooltip (<title>)
  std::vector<bool> hollow;               // empty or one per point: drawn as an unfilled marker
  bool line = true;                       // polyline through the points in the given order
  bool step = false;                      // line as a right-continuous step (CDFs)
  bool markers = true;
  int color = -1;                         // palette index; -1 = the series' position
};

struct XyChart {
  std::string id;     // the <svg> element's id
  std::string title;  // drawn at the top
  ChartAxis x, y;
  std::vector<XySeries> series;
  int width = 560, height = 380;  // viewBox size; the SVG scales to its container
};

struct BarSeries {
  std::string name;            // legend entry
  std::vector<double> values;  // one per category; non-finite = no bar
};

struct BarChart {
  std::string id, title;
  std::vector<std::string> categories;  // x tick labels
  std::string x_label;
  ChartAxis y;
  std::vector<BarSeries> series;
  int width = 560, height = 380;
};

std::string render_xy_chart(const XyChart& chart);
std::string render_bar_chart(const BarChart& chart);

// Tick values covering [lo, hi] with a 1-2-5 step, about `target` of them; the first is <= lo and
// the last >= hi. lo == hi gives a range of ±half of it (at least ±0.5), clamped at 0.
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

// Number formatting shared by charts and tables: up to `significant` digits, no exponent in the
// range tables use, thousands without separators ("1234", "0.0123", "1.5e+09").
std::string format_number(double v, int significant = 3);

// Escapes & < > " ' for HTML text and attribute values.
std::string html_escape(const std::string& s);

// The series palette (colour-blind-safe, Okabe-Ito order); index wraps.
const char* chart_color(int index);

}  // namespace mla::bench
