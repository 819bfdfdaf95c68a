// Record printers (see records.h).
#include "tools/common/records.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/stop_request.h"

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
  try {
    if (!finished_) finish();
  } catch (const Error&) {
    // A destructor does not throw; tool_main reports a stdout that failed.
  }
}

void RecordWriter::emit(const std::string& text) { pending_ += text; }

// Writes what emit() gathered. A failed write (EPIPE from a reader that left, ENOSPC, EIO) throws
// "stdout: write failed: <why>", or, for a run that stops cleanly, ends the output and asks the
// run to stop (as SIGPIPE would).
void RecordWriter::flush_pending() {
  std::string text;
  text.swap(pending_);
  if (stop_on_write_error_) {
    write_unless_stopped(text);
    return;
  }
  errno = 0;
  const bool written = std::fwrite(text.data(), 1, text.size(), out_) == text.size() && std::fflush(out_) == 0;
  if (written && !std::ferror(out_)) return;
  const int error = errno != 0 ? errno : EIO;
  std::clearerr(out_);
  throw Error("stdout", std::string("write failed: ") + std::strerror(error));
}

// The stop mode's writes go straight to the descriptor, in pieces a writable pipe or terminal
// takes without blocking, and wait for it at most kUnreadSecondsAfterStop once a stop was
// requested: mpirun stops reading its ranks' output when it is told to terminate, and a rank
// blocked in write(2) would never reach the save its signal asks for.
void RecordWriter::write_unless_stopped(const std::string& text) {
  const int fd = fileno(out_);
  size_t done = 0;
  int waited_ms = 0;
  while (done < text.size() && enabled_) {
    pollfd ready{fd, POLLOUT, 0};
    const int polled = poll(&ready, 1, 100);
    if (polled == 0) {
      waited_ms = stop_signal() != 0 ? waited_ms + 100 : 0;
      if (waited_ms >= kUnreadSecondsAfterStop * 1000) fail_output("not read for " + std::to_string(kUnreadSecondsAfterStop) + " s after a stop signal");
      continue;
    }
    if (polled < 0 && errno == EINTR) continue;
    const ssize_t wrote = ::write(fd, text.data() + done, std::min<size_t>(text.size() - done, 512));
    if (wrote > 0) {
      done += static_cast<size_t>(wrote);
    } else if (wrote < 0 && errno != EINTR && errno != EAGAIN) {
      fail_output(std::strerror(errno));
    }
  }
}

void RecordWriter::fail_output(const std::string& why) {
  enabled_ = false;
  write_error_ = why;
  request_stop(SIGPIPE);
}

void RecordWriter::write_run(const Record& run) {
  if (enabled_ && format_ == OutputFormat::jsonl) write(run);
}

void RecordWriter::write(const Record& record) {
  if (!enabled_) return;
  switch (format_) {
    case OutputFormat::jsonl:
      emit(record.dump(-1, ' ', false, Record::error_handler_t::replace) + "\n");
      break;
    case OutputFormat::json: collected_.push_back(record); return;
    case OutputFormat::table: collect_table_row(record); return;
    case OutputFormat::csv: write_csv(record); break;
  }
  flush_pending();
}

void RecordWriter::finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_) return;
  if (format_ == OutputFormat::json) {
    emit(collected_.dump(2, ' ', false, Record::error_handler_t::replace) + "\n");
  } else if (format_ == OutputFormat::table) {
    write_tables();
  }
  flush_pending();
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
      emit(text + "\n");
    };
    if (!first) emit("\n");
    first = false;
    if (!section.kind.empty()) emit("# " + escape_cell(section.kind) + "\n");
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
    if (sections_.size() > 1) emit("\n");
    std::string header = "record";
    for (const auto& column : section.columns) {
      header += ',';
      header += csv_field(column);
    }
    emit(header + "\n");
  }
  std::string row = csv_field(section.kind);
  for (const auto& column : section.columns) {
    row += ',';
    row += csv_field(format_value(record[column]));
  }
  emit(row + "\n");
}

}  // namespace mt::tools
