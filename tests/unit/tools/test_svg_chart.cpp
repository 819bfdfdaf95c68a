// mt-plot's SVG charts (tools/mt-plot/svg_chart.h): round axes that cover the data, tick labels,
// XML escaping, polylines whose points map back through the panel's declared transform to the
// values (within half a pixel), non-finite values left out, stacked bar segments whose heights are
// their values. The end-to-end check (the SVG parsed as XML by Python) is tests/tools/mt-plot.bats.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tools/mt-plot/svg_chart.h"

using namespace mt;

namespace {

// The value of attribute `name` in the first element at or after `from` that has it.
std::string attribute(const std::string& svg, const std::string& name, size_t from = 0) {
  const size_t at = svg.find(" " + name + "=\"", from);
  if (at == std::string::npos) return "";
  const size_t start = at + name.size() + 3;
  return svg.substr(start, svg.find('"', start) - start);
}

std::pair<double, double> pair_of(const std::string& text) {
  std::istringstream in(text);
  double a = 0, b = 0;
  in >> a >> b;
  return {a, b};
}

}  // namespace

TEST(SvgChart, NiceAxesCoverTheDataWithRoundTicks) {
  const plot::Axis a = plot::nice_axis(0.13, 9.7, 5);
  EXPECT_LE(a.min, 0.13);
  EXPECT_GE(a.max, 9.7);
  EXPECT_EQ(a.min, 0);
  EXPECT_EQ(a.max, 10);
  EXPECT_EQ(a.ticks, (std::vector<double>{0, 2, 4, 6, 8, 10}));
  const plot::Axis single = plot::nice_axis(3, 3, 5);  // one value: a range around it
  EXPECT_LT(single.min, 3);
  EXPECT_GT(single.max, 3);
  EXPECT_EQ(plot::tick_label(0.0003), "0.0003");
  EXPECT_EQ(plot::tick_label(25000), "25000");
  EXPECT_EQ(plot::tick_label(0.1 + 0.2), "0.3");
  EXPECT_EQ(plot::escape_xml("a<b & \"c\">"), "a&lt;b &amp; &quot;c&quot;&gt;");
}

TEST(SvgChart, PolylinePointsMapBackToTheValues) {
  plot::LinePanel panel{"lm loss", "iteration", "loss", {}};
  panel.series.push_back({"run <1>", {1, 2, 3, 4}, {10.5, 9.25, NAN, 7.125}});
  panel.series.push_back({"run 2", {1, 2}, {11, 3}});
  const std::string svg = plot::line_chart_svg("title & more", {panel}, 1);
  const auto [x0, x1] = pair_of(attribute(svg, "data-x-domain"));
  const auto [px0, px1] = pair_of(attribute(svg, "data-x-range"));
  const auto [y0, y1] = pair_of(attribute(svg, "data-y-domain"));
  const auto [py0, py1] = pair_of(attribute(svg, "data-y-range"));
  ASSERT_LT(x0, x1);
  ASSERT_LT(y0, y1);
  const size_t first = svg.find("<polyline");
  ASSERT_NE(first, std::string::npos);
  EXPECT_EQ(attribute(svg, "data-series", first), "run &lt;1&gt;");
  std::istringstream points(attribute(svg, "points", first));
  const std::vector<std::pair<double, double>> values{{1, 10.5}, {2, 9.25}, {4, 7.125}};  // NaN left out
  for (const auto& [x, y] : values) {
    double px = 0, py = 0;
    char comma = 0;
    ASSERT_TRUE(points >> px >> comma >> py);
    EXPECT_NEAR(x0 + (px - px0) / (px1 - px0) * (x1 - x0), x, 0.5 * (x1 - x0) / std::abs(px1 - px0));
    EXPECT_NEAR(y0 + (py - py0) / (py1 - py0) * (y1 - y0), y, 0.5 * (y1 - y0) / std::abs(py1 - py0));
  }
  double extra = 0;
  EXPECT_FALSE(points >> extra);
  EXPECT_NE(svg.find("title &amp; more"), std::string::npos);
  EXPECT_NE(svg.find("<g class=\"legend\">"), std::string::npos);
}

TEST(SvgChart, StackedSegmentsAreAsTallAsTheirValues) {
  plot::BarPanel panel{"memory", "MiB", 1 << 20, {}};
  panel.groups.push_back({"stage 0", {{"predicted", {{"weights", 3 << 20}, {"grads", 1 << 20}}},
                                      {"measured", {{"weights", 3 << 20}, {"grads", 2 << 20}}}}});
  const std::string svg = plot::bar_chart_svg("bars", panel);
  const auto [y0, y1] = pair_of(attribute(svg, "data-y-domain"));
  const auto [py0, py1] = pair_of(attribute(svg, "data-y-range"));
  const double pixels_per_mib = (py0 - py1) / (y1 - y0);
  std::regex segment("<rect class=\"segment\"[^>]* data-category=\"([a-z]+)\" data-value=\"([0-9.e+]+)\"[^>]* y=\"([0-9.]+)\" "
                     "width=\"[0-9.]+\" height=\"([0-9.]+)\"");
  int count = 0;
  double measured_top = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), segment); it != std::sregex_iterator(); ++it, ++count) {
    const double value = std::stod((*it)[2]) / (1 << 20);
    EXPECT_NEAR(std::stod((*it)[4]), value * pixels_per_mib, 0.5) << (*it)[0];
    if (count == 3) measured_top = std::stod((*it)[3]);
  }
  EXPECT_EQ(count, 4);
  EXPECT_NEAR(measured_top, py0 - 5 * pixels_per_mib, 0.5);  // the measured bar stacks to 5 MiB
}
