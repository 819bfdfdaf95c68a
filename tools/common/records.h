// Record printers shared by every tool: one record definition (an ordered JSON object whose first
// key "record" names its kind: run, step, eval, ckpt, summary, ...) and printers for
// --format table|json|jsonl|csv. stdout carries data only and is flushed per record; under MPI
// only rank 0 writes. Tested in tests/unit/tools/test_records.cpp.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
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
  // Ends the output (json: writes the collected array). Called by the destructor if needed.
  void finish();
  OutputFormat format() const { return format_; }

 private:
  bool begin_section(const Record& record);
  void write_table(const Record& record);
  void write_csv(const Record& record);

  OutputFormat format_;
  std::FILE* out_;
  bool enabled_;
  bool finished_ = false;
  std::string current_kind_;
  std::vector<std::string> columns_;
  std::vector<size_t> widths_;
  Record collected_ = Record::array();
};

// A scalar as text: integers as such, floats with 6 significant digits, strings raw.
std::string format_value(const Record& value);

}  // namespace mt::tools
