// Record printers (see records.h).
#include "tools/common/records.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::tools {

OutputFormat parse_format(const std::string& name) {
  if (name == "table") return OutputFormat::table;
  if (name == "json") return OutputFormat::json;
  if (name == "jsonl") return OutputFormat::jsonl;
  if (name == "csv") return OutputFormat::csv;
  throw UsageError("--format " + name, "unknown format (table, json, jsonl, csv)");
}

const char* format_name(OutputFormat format) {
  switch (format) {
    case OutputFormat::table: return "table";
    case OutputFormat::json: return "json";
    case OutputFormat::jsonl: return "jsonl";
    case OutputFormat::csv: return "csv";
  }
  return "?";
}

std::string format_value(const Record& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) {
    const double x = value.get<double>();
    if (!std::isfinite(x)) return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.6g", x);
    return buffer;
  }
  if (value.is_null()) return "";
  return value.dump();
}

RecordWriter::RecordWriter(OutputFormat format, std::FILE* out, bool enabled)
    : format_(format), out_(out), enabled_(enabled) {}

RecordWriter::~RecordWriter() {
  if (!finished_) finish();
}

void RecordWriter::write_run(const Record& run) {
  if (enabled_ && format_ == OutputFormat::jsonl) write(run);
}

void RecordWriter::write(const Record& record) {
  if (!enabled_) return;
  switch (format_) {
    case OutputFormat::jsonl:
      std::fprintf(out_, "%s\n", record.dump(-1, ' ', false, Record::error_handler_t::replace).c_str());
      break;
    case OutputFormat::json: collected_.push_back(record); return;
    case OutputFormat::table: write_table(record); break;
    case OutputFormat::csv: write_csv(record); break;
  }
  std::fflush(out_);
}

void RecordWriter::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_ && format_ == OutputFormat::json) {
    std::fprintf(out_, "%s\n", collected_.dump(2, ' ', false, Record::error_handler_t::replace).c_str());
    std::fflush(out_);
  }
}

namespace {

std::string record_kind(const Record& record) {
  auto it = record.find("record");
  return it != record.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::vector<std::string> record_columns(const Record& record) {
  std::vector<std::string> columns;
  for (auto it = record.begin(); it != record.end(); ++it) {
    if (it.key() != "record") columns.push_back(it.key());
  }
  return columns;
}

std::string csv_escape(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

}  // namespace

// Table and CSV output is streamed in sections: a new header whenever the record kind (or its
// keys) changes, separated from the previous section by a blank line. Returns true when `record`
// starts a section.
bool RecordWriter::begin_section(const Record& record) {
  const std::string kind = record_kind(record);
  std::vector<std::string> columns = record_columns(record);
  if (kind == current_kind_ && columns == columns_) return false;
  if (!columns_.empty()) std::fprintf(out_, "\n");
  current_kind_ = kind;
  columns_ = std::move(columns);
  return true;
}

// Column widths come from the header and the first row (at least 10, so later rows mostly fit).
void RecordWriter::write_table(const Record& record) {
  if (begin_section(record)) {
    const std::string& kind = current_kind_;
    widths_.clear();
    std::string header, rule;
    for (const auto& column : columns_) {
      const size_t width = std::max({column.size(), format_value(record[column]).size(), size_t{10}});
      widths_.push_back(width);
      char cell[256];
      std::snprintf(cell, sizeof cell, "%*s  ", static_cast<int>(width), column.c_str());
      header += cell;
      rule += std::string(width, '-') + "  ";
    }
    if (!kind.empty()) std::fprintf(out_, "# %s\n", kind.c_str());
    std::fprintf(out_, "%s\n%s\n", header.c_str(), rule.c_str());
  }
  std::string row;
  for (size_t i = 0; i < columns_.size(); ++i) {
    const std::string text = format_value(record[columns_[i]]);
    row += std::string(widths_[i] > text.size() ? widths_[i] - text.size() : 0, ' ') + text + "  ";
  }
  std::fprintf(out_, "%s\n", row.c_str());
}

void RecordWriter::write_csv(const Record& record) {
  if (begin_section(record)) {
    std::string header = "record";
    for (const auto& column : columns_) {
      header += ',';
      header += csv_escape(column);
    }
    std::fprintf(out_, "%s\n", header.c_str());
  }
  std::string row = csv_escape(current_kind_);
  for (const auto& column : columns_) {
    row += ',';
    row += csv_escape(format_value(record[column]));
  }
  std::fprintf(out_, "%s\n", row.c_str());
}

}  // namespace mt::tools
