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
    case OutputFormat::table: collect_table_row(record); return;
    case OutputFormat::csv: write_csv(record); break;
  }
  std::fflush(out_);
}

void RecordWriter::finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_) return;
  if (format_ == OutputFormat::json) {
    std::fprintf(out_, "%s\n", collected_.dump(2, ' ', false, Record::error_handler_t::replace).c_str());
  } else if (format_ == OutputFormat::table) {
    write_tables();
  }
  std::fflush(out_);
}

std::string escape_cell(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    // C1 controls (U+0080..U+009F) and the Unicode line and paragraph separators break lines too.
    const bool c1 = byte == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) <= 0x9F &&
                    static_cast<unsigned char>(text[i + 1]) >= 0x80;
    const bool separator = byte == 0xE2 && i + 2 < text.size() && text[i + 1] == '\x80' &&
                           (text[i + 2] == '\xA8' || text[i + 2] == '\xA9');
    char escaped[8];
    if (byte == '\\') {
      out += "\\\\";
    } else if (byte == '\n') {
      out += "\\n";
    } else if (byte == '\r') {
      out += "\\r";
    } else if (byte == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7F) {
      std::snprintf(escaped, sizeof escaped, "\\u%04x", byte);
      out += escaped;
    } else if (c1) {
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned char>(text[++i]));
      out += escaped;
    } else if (separator) {
      out += text[i + 2] == '\xA8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += static_cast<char>(byte);
    }
  }
  return out;
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

// RFC 4180: a field holding a comma or a double quote is quoted, quotes doubled (escape_cell has
// already turned line breaks into \n, so a record is one line).
std::string csv_field(const std::string& text) {
  const std::string cell = escape_cell(text);
  if (cell.find_first_of(",\"") == std::string::npos) return cell;
  std::string quoted = "\"";
  for (char c : cell) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

}  // namespace

// The section of `record`'s kind and keys, created (in order of first appearance) if new.
RecordWriter::Section& RecordWriter::section_of(const Record& record, bool* created) {
  std::string kind = record_kind(record);
  std::vector<std::string> columns = record_columns(record);
  for (Section& section : sections_) {
    if (section.kind == kind && section.columns == columns) {
      *created = false;
      return section;
    }
  }
  *created = true;
  return sections_.emplace_back(Section{std::move(kind), std::move(columns), {}});
}

void RecordWriter::collect_table_row(const Record& record) {
  bool created = false;
  Section& section = section_of(record, &created);
  std::vector<std::string> cells;
  for (const auto& column : section.columns) cells.push_back(escape_cell(format_value(record[column])));
  section.rows.push_back(std::move(cells));
}

// One table per record kind: a "# kind" title, the header, a rule, and every row of that kind,
// each column as wide as its widest cell (at least 10), right-aligned.
void RecordWriter::write_tables() {
  bool first = true;
  for (const Section& section : sections_) {
    std::vector<size_t> widths;
    for (const auto& column : section.columns) widths.push_back(std::max(escape_cell(column).size(), size_t{10}));
    for (const auto& row : section.rows) {
      for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
    }
    auto line = [&](const auto& cell_of) {
      std::string text;
      for (size_t i = 0; i < widths.size(); ++i) {
        const std::string cell = cell_of(i);
        text += std::string(widths[i] > cell.size() ? widths[i] - cell.size() : 0, ' ') + cell + "  ";
      }
      std::fprintf(out_, "%s\n", text.c_str());
    };
    if (!first) std::fprintf(out_, "\n");
    first = false;
    if (!section.kind.empty()) std::fprintf(out_, "# %s\n", escape_cell(section.kind).c_str());
    line([&](size_t i) { return escape_cell(section.columns[i]); });
    line([&](size_t i) { return std::string(widths[i], '-'); });
    for (const auto& row : section.rows) line([&](size_t i) { return row[i]; });
  }
}

// Rows stream as they come (flushed per record); a kind's header is written once, before its
// first row, after a blank line when rows came before. Each row leads with its kind, so rows of
// kinds that alternate (split, blend, split, ...) stay readable under their one header.
void RecordWriter::write_csv(const Record& record) {
  bool created = false;
  const Section& section = section_of(record, &created);
  if (created) {
    if (sections_.size() > 1) std::fprintf(out_, "\n");
    std::string header = "record";
    for (const auto& column : section.columns) {
      header += ',';
      header += csv_field(column);
    }
    std::fprintf(out_, "%s\n", header.c_str());
  }
  std::string row = csv_field(section.kind);
  for (const auto& column : section.columns) {
    row += ',';
    row += csv_field(format_value(record[column]));
  }
  std::fprintf(out_, "%s\n", row.c_str());
}

}  // namespace mt::tools
