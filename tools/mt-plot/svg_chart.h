// Plain SVG charts for mt-plot, with no library: line panels (several series over a shared kind of
// x axis, one colour per series, a legend) laid out in a grid, and stacked bars (bars grouped by
// label, each bar's segments stacked by category). Each panel's <g class="panel"> carries its axis
// transform as attributes (data-x-domain, data-x-range, data-y-domain, data-y-range: "lo hi" in
// values and in pixels), each polyline its series label (data-series) and each bar segment its
// category and value, so a reader maps what is drawn back to the values.
// Tested in tests/unit/tools/test_svg_chart.cpp and tests/tools/mt-plot.bats.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mt::plot {

struct Series {
  std::string label;
  std::vector<double> x, y;  // same length; non-finite values are left out of the line
};

struct LinePanel {
  std::string title, x_label, y_label;
  std::vector<Series> series;
};

struct BarSegment {
  std::string category;
  double value = 0;
};

struct Bar {
  std::string label;  // under the bar ("predicted", "measured")
  std::vector<BarSegment> segments;
};

struct BarGroup {
  std::string label;  // under the group ("stage 0, rank 1")
  std::vector<Bar> bars;
};

struct BarPanel {
  std::string title, y_label;
  double y_unit = 1;  // axis values are value / y_unit (bytes shown in MiB: 1 << 20)
  std::vector<BarGroup> groups;
};

// An axis over [lo, hi] widened to round ticks: about `count` tick values 1, 2 or 5 times a power
// of ten apart; a single value gets a unit-wide range around it.
struct Axis {
  double min = 0, max = 1;
  std::vector<double> ticks;
};
Axis nice_axis(double lo, double hi, int count);

// A number as a tick label: up to 6 significant digits, no trailing zeros ("0.0003", "25000").
std::string tick_label(double value);

std::string escape_xml(std::string_view text);

// The line panels in a grid of `columns`, under `title`.
std::string line_chart_svg(const std::string& title, const std::vector<LinePanel>& panels, int columns = 2);
std::string bar_chart_svg(const std::string& title, const BarPanel& panel);

}  // namespace mt::plot
