// Plain SVG charts (see svg_chart.h).
#include "tools/mt-plot/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

namespace mt::plot {

namespace {

// Colours a reader tells apart (Tableau 10).
constexpr const char* kColours[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr int kColourCount = sizeof kColours / sizeof kColours[0];
// Dash patterns by series, so a line drawn over an identical one (a resumed run) still shows.
constexpr const char* kDashes[] = {"", "7 4", "2 3", "9 3 2 3"};
constexpr int kDashCount = sizeof kDashes / sizeof kDashes[0];

constexpr double kPanelWidth = 460, kPanelHeight = 300;
constexpr double kLeft = 70, kRight = 20, kTop = 34, kBottom = 46;  // plot area inside a panel
constexpr double kTitleHeight = 36, kLegendRow = 18;

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", value);
  std::string s = text;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

// Full precision for the axis transform a reader inverts.
std::string exact(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

// A linear map from values [d0, d1] to pixels [p0, p1].
struct Scale {
  double d0, d1, p0, p1;
  double operator()(double v) const { return p0 + (v - d0) / (d1 - d0) * (p1 - p0); }
};

struct Extent {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
};

std::string text(double x, double y, const std::string& content, const std::string& attributes = "") {
  return "<text x=\"" + number(x) + "\" y=\"" + number(y) + "\"" + (attributes.empty() ? "" : " " + attributes) + ">" +
         escape_xml(content) + "</text>\n";
}

// The frame, grid lines, tick labels and axis titles of a panel whose plot area is
// [x0, x1] x [y1, y0] (y grows downwards).
std::string axes(const Axis& x_axis, const Scale& sx, const Axis& y_axis, const Scale& sy, const std::string& x_label,
                 const std::string& y_label) {
  std::string svg;
  for (const double t : y_axis.ticks) {
    const double y = sy(t);
    svg += "<line class=\"grid\" x1=\"" + number(sx.p0) + "\" y1=\"" + number(y) + "\" x2=\"" + number(sx.p1) + "\" y2=\"" +
           number(y) + "\" stroke=\"#e0e0e0\"/>\n";
    svg += text(sx.p0 - 6, y + 4, tick_label(t), "class=\"y-tick\" data-value=\"" + exact(t) + "\" text-anchor=\"end\"");
  }
  for (const double t : x_axis.ticks) {
    const double x = sx(t);
    svg += "<line class=\"grid\" x1=\"" + number(x) + "\" y1=\"" + number(sy.p0) + "\" x2=\"" + number(x) + "\" y2=\"" +
           number(sy.p1) + "\" stroke=\"#f0f0f0\"/>\n";
    svg += text(x, sy.p0 + 16, tick_label(t), "class=\"x-tick\" data-value=\"" + exact(t) + "\" text-anchor=\"middle\"");
  }
  svg += "<rect x=\"" + number(sx.p0) + "\" y=\"" + number(sy.p1) + "\" width=\"" + number(sx.p1 - sx.p0) +
         "\" height=\"" + number(sy.p0 - sy.p1) + "\" fill=\"none\" stroke=\"#666\"/>\n";
  svg += text((sx.p0 + sx.p1) / 2, sy.p0 + 34, x_label, "text-anchor=\"middle\"");
  const double mid = (sy.p0 + sy.p1) / 2;
  svg += "<text x=\"" + number(sx.p0 - 54) + "\" y=\"" + number(mid) + "\" text-anchor=\"middle\" transform=\"rotate(-90 " +
         number(sx.p0 - 54) + " " + number(mid) + ")\">" + escape_xml(y_label) + "</text>\n";
  return svg;
}

std::string panel_open(double left, double top, const Scale& sx, const Scale& sy, const std::string& title) {
  return "<g class=\"panel\" data-title=\"" + escape_xml(title) + "\" data-x-domain=\"" + exact(sx.d0) + " " +
         exact(sx.d1) + "\" data-x-range=\"" + exact(sx.p0) + " " + exact(sx.p1) + "\" data-y-domain=\"" + exact(sy.d0) +
         " " + exact(sy.d1) + "\" data-y-range=\"" + exact(sy.p0) + " " + exact(sy.p1) + "\">\n" +
         text(left + kPanelWidth / 2, top + 20, title, "text-anchor=\"middle\" font-weight=\"bold\"");
}

std::string line_panel(const LinePanel& panel, double left, double top) {
  Extent xs, ys;
  for (const Series& s : panel.series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      xs.add(s.x[i]);
      ys.add(s.y[i]);
    }
  }
  if (xs.empty()) xs.add(0), ys.add(0);
  const Axis x_axis = nice_axis(xs.lo, xs.hi, 6), y_axis = nice_axis(ys.lo, ys.hi, 5);
  const Scale sx{x_axis.min, x_axis.max, left + kLeft, left + kPanelWidth - kRight};
  const Scale sy{y_axis.min, y_axis.max, top + kPanelHeight - kBottom, top + kTop};
  std::string svg = panel_open(left, top, sx, sy, panel.title);
  svg += axes(x_axis, sx, y_axis, sy, panel.x_label, panel.y_label);
  for (size_t k = 0; k < panel.series.size(); ++k) {
    const Series& s = panel.series[k];
    std::string points;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      points += (points.empty() ? "" : " ") + number(sx(s.x[i])) + "," + number(sy(s.y[i]));
    }
    const std::string dash = kDashes[k % kDashCount];
    svg += "<polyline data-series=\"" + escape_xml(s.label) + "\" fill=\"none\" stroke=\"" + kColours[k % kColourCount] +
           "\" stroke-width=\"1.5\"" + (dash.empty() ? "" : " stroke-dasharray=\"" + dash + "\"") + " points=\"" + points +
           "\"/>\n";
  }
  return svg + "</g>\n";
}

// Lines (with their dashes) for line charts, filled boxes for bar charts.
std::string legend(const std::vector<std::string>& labels, double left, double top, bool lines) {
  std::string svg = "<g class=\"legend\">\n";
  for (size_t k = 0; k < labels.size(); ++k) {
    const double y = top + static_cast<double>(k) * kLegendRow;
    const std::string dash = kDashes[k % kDashCount];
    if (lines) {
      svg += "<line x1=\"" + number(left) + "\" y1=\"" + number(y + 5) + "\" x2=\"" + number(left + 24) + "\" y2=\"" +
             number(y + 5) + "\" stroke=\"" + kColours[k % kColourCount] + "\" stroke-width=\"2\"" +
             (dash.empty() ? "" : " stroke-dasharray=\"" + dash + "\"") + "/>\n";
    } else {
      svg += "<rect x=\"" + number(left) + "\" y=\"" + number(y) + "\" width=\"14\" height=\"10\" fill=\"" +
             kColours[k % kColourCount] + "\"/>\n";
    }
    svg += text(left + 30, y + 9, labels[k]);
  }
  return svg + "</g>\n";
}

std::string document(double width, double height, const std::string& title, const std::string& body) {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + number(width) +
         "\" height=\"" + number(height) + "\" viewBox=\"0 0 " + number(width) + " " + number(height) +
         "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n" +
         text(width / 2, 24, title, "text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\"") + body + "</svg>\n";
}

}  // namespace

Axis nice_axis(double lo, double hi, int count) {
  Axis axis;
  if (!(lo <= hi)) lo = hi = 0;
  if (lo == hi) {
    const double half = lo == 0 ? 0.5 : std::abs(lo) * 0.05;
    lo -= half;
    hi += half;
  }
  const double raw = (hi - lo) / std::max(count, 1);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * power;
    if (step >= raw) break;
  }
  axis.min = std::floor(lo / step) * step;
  axis.max = std::ceil(hi / step) * step;
  for (double t = axis.min; t <= axis.max + step * 1e-9; t += step) axis.ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return axis;
}

std::string tick_label(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

std::string escape_xml(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out.push_back(c);
    }
  }
  return out;
}

std::string line_chart_svg(const std::string& title, const std::vector<LinePanel>& panels, int columns) {
  columns = std::max(1, columns);
  const int rows = (static_cast<int>(panels.size()) + columns - 1) / columns;
  std::vector<std::string> labels;
  for (const LinePanel& p : panels) {
    for (const Series& s : p.series) {
      if (std::find(labels.begin(), labels.end(), s.label) == labels.end()) labels.push_back(s.label);
    }
  }
  std::string body;
  for (size_t i = 0; i < panels.size(); ++i) {
    const double left = static_cast<double>(static_cast<int>(i) % columns) * kPanelWidth;
    const double top = kTitleHeight + static_cast<double>(static_cast<int>(i) / columns) * kPanelHeight;
    body += line_panel(panels[i], left, top);
  }
  const double legend_top = kTitleHeight + rows * kPanelHeight + 8;
  body += legend(labels, kLeft, legend_top, true);
  return document(columns * kPanelWidth, legend_top + static_cast<double>(labels.size()) * kLegendRow + 10, title, body);
}

std::string bar_chart_svg(const std::string& title, const BarPanel& panel) {
  std::vector<std::string> categories;
  double highest = 0;
  size_t bar_count = 0;
  for (const BarGroup& g : panel.groups) {
    for (const Bar& b : g.bars) {
      double total = 0;
      for (const BarSegment& s : b.segments) {
        total += s.value / panel.y_unit;
        if (std::find(categories.begin(), categories.end(), s.category) == categories.end()) categories.push_back(s.category);
      }
      highest = std::max(highest, total);
      ++bar_count;
    }
  }
  constexpr double kBar = 54, kGap = 8, kGroupGap = 40;
  const double plot_width = std::max(200.0, static_cast<double>(bar_count) * (kBar + kGap) +
                                                static_cast<double>(panel.groups.size()) * kGroupGap);
  const double width = kLeft + plot_width + kRight + 150;
  const double top = kTitleHeight;
  const Axis y_axis = nice_axis(0, highest, 5);
  const Scale sy{y_axis.min, y_axis.max, top + kPanelHeight - kBottom, top + kTop};
  const Scale sx{0, plot_width, kLeft, kLeft + plot_width};
  const Axis x_axis{0, plot_width, {}};
  std::string body = panel_open(0, top, sx, sy, panel.title);
  body += axes(x_axis, sx, y_axis, sy, "", panel.y_label);
  double x = kLeft + kGroupGap / 2;
  for (const BarGroup& g : panel.groups) {
    const double group_left = x;
    for (const Bar& b : g.bars) {
      double base = 0;
      for (const BarSegment& s : b.segments) {
        const size_t c = static_cast<size_t>(std::find(categories.begin(), categories.end(), s.category) - categories.begin());
        const double value = s.value / panel.y_unit;
        const double y_top = sy(base + value), y_bottom = sy(base);
        body += "<rect class=\"segment\" data-group=\"" + escape_xml(g.label) + "\" data-bar=\"" + escape_xml(b.label) +
                "\" data-category=\"" + escape_xml(s.category) + "\" data-value=\"" + exact(s.value) + "\" x=\"" +
                number(x) + "\" y=\"" + number(y_top) + "\" width=\"" + number(kBar) + "\" height=\"" +
                number(y_bottom - y_top) + "\" fill=\"" + kColours[c % kColourCount] + "\"/>\n";
        base += value;
      }
      body += text(x + kBar / 2, sy.p0 + 14, b.label, "text-anchor=\"middle\" font-size=\"10\"");
      x += kBar + kGap;
    }
    body += text((group_left + x - kGap) / 2, sy.p0 + 30, g.label, "text-anchor=\"middle\"");
    x += kGroupGap;
  }
  body += "</g>\n" + legend(categories, kLeft + plot_width + kRight + 10, top + kTop, false);
  return document(width, top + kPanelHeight + 10, title, body);
}

}  // namespace mt::plot
