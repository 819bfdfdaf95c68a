// Record printers shared by every tool: one record definition (an ordered JSON object whose first
// key "record" names its kind: run, step, eval, ckpt, summary, ...) and printers for
// --format table|json|jsonl|csv. stdout carries data only; under MPI only rank 0 writes.
//   jsonl  one record per line, flushed per record, led by the run record
//   json   one array of the records, written by finish()
//   table  for reading: one table per record kind (a "# kind" title, one header, every row of the
//          kind in order, columns as wide as their widest cell), written by finish()
//   csv    streamed, flushed per record: each kind's header once, before its first row; every row
//          leads with its kind; RFC 4180 quoting
// Table and csv cells escape backslash and control characters as JSON strings do (\n, \t,
// \u001b, also C1 controls and U+2028/U+2029), so a decoded newline never breaks a row.
// Tested in tests/unit/tools/test_records.cpp.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::tools {

using Record = nlohmann::ordered_json;

enum class OutputFormat { table, json, jsonl, csv };

OutputFormat parse_format(const std::string& name);  // throws mt::UsageError
const char* format_name(OutputFormat format);

class RecordWriter {
 public:
  // `enabled` false (ranks other than 0) turns every call into a no-op.
  RecordWriter(OutputFormat format, std::FILE* out = stdout, bool enabled = true);
  ~RecordWriter();
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;

  // The run provenance record: written first in jsonl streams, dropped in every other format.
  void write_run(const Record& run);
  void write(const Record& record);
  // Ends the output (json: the collected array; table: the tables). Called by the destructor if
  // needed.
  void finish();
  OutputFormat format() const { return format_; }
  // A failed write (a closed pipe: `| head`, a tee that died) throws mt::Error "stdout: write
  // failed: <why>" by default. A run that can stop cleanly (mt-train) calls this instead (before
  // its first record): the failure requests a stop (core/stop_request.h, as SIGPIPE) and nothing
  // more is written; so does an output nobody reads for kUnreadSecondsAfterStop once a stop was
  // requested (mpirun told to terminate stops reading its ranks' output).
  void stop_run_on_write_error() {
    std::fflush(out_);
    stop_on_write_error_ = true;
  }
  static constexpr int kUnreadSecondsAfterStop = 2;
  // Why the output failed ("Broken pipe"), empty while it works.
  const std::string& write_error() const { return write_error_; }

 private:
  // The records of one kind (and one set of keys) in table and csv output.
  struct Section {
    std::string kind;
    std::vector<std::string> columns;
    std::vector<std::vector<std::string>> rows;  // table: escaped cells, until finish()
  };
  Section& section_of(const Record& record, bool* created);
  void collect_table_row(const Record& record);
  void write_tables();
  void write_csv(const Record& record);
  void emit(const std::string& text);
  void flush_pending();
  void write_unless_stopped(const std::string& text);
  void fail_output(const std::string& why);

  OutputFormat format_;
  std::FILE* out_;
  bool enabled_;
  bool finished_ = false;
  bool stop_on_write_error_ = false;
  std::string write_error_;
  std::string pending_;  // emitted, not yet written
  std::vector<Section> sections_;
  Record collected_ = Record::array();
};

// A scalar as text: integers as such, floats with 6 significant digits, strings raw.
std::string format_value(const Record& value);

// `text` with backslash and control characters escaped as in JSON strings (\\, \n, \r, \t,
// \u00XX), C1 controls and U+2028/U+2029 too: one line whatever the text.
std::string escape_cell(std::string_view text);

}  // namespace mt::tools
