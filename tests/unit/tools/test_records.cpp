// Record printers: jsonl leads with the run record, json is one parseable array, table and csv
// print a header per record kind; a failed write is an error, or a stop request (issue 28 L5).
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tools/common/records.h"
#include "core/error.h"
#include "core/stop_request.h"

using mt::tools::OutputFormat;
using mt::tools::Record;
using mt::tools::RecordWriter;

namespace {
// What a writer puts on its stream for `records` (a "run" record through write_run), finished.
std::string render_records(OutputFormat format, const std::vector<Record>& records, bool enabled = true) {
  std::FILE* file = std::tmpfile();
  {
    RecordWriter writer(format, file, enabled);
    for (const Record& record : records) {
      if (record["record"] == "run") {
        writer.write_run(record);
      } else {
        writer.write(record);
      }
    }
  }
  std::rewind(file);
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, file)) > 0) text.append(buffer, n);
  std::fclose(file);
  return text;
}

std::string render(OutputFormat format, bool enabled = true) {
  return render_records(format,
                        {Record{{"record", "run"}, {"tool", "mt-test"}},
                         Record{{"record", "step"}, {"iteration", 1}, {"lm_loss", 2.5}},
                         Record{{"record", "step"}, {"iteration", 2}, {"lm_loss", 2.25}},
                         Record{{"record", "summary"}, {"note", "a,b"}}},
                        enabled);
}
}  // namespace

TEST(Records, JsonlLeadsWithRunRecord) {
  const std::string text = render(OutputFormat::jsonl);
  EXPECT_EQ(text.substr(0, text.find('\n')), R"({"record":"run","tool":"mt-test"})");
  EXPECT_NE(text.find(R"({"record":"step","iteration":2,"lm_loss":2.25})"), std::string::npos);
}

TEST(Records, JsonIsOneArrayWithoutRunRecord) {
  const Record parsed = Record::parse(render(OutputFormat::json));
  ASSERT_TRUE(parsed.is_array());
  ASSERT_EQ(parsed.size(), 3u);
  EXPECT_EQ(parsed[0]["record"], "step");
  EXPECT_EQ(parsed[2]["note"], "a,b");
}

TEST(Records, TableHasHeaderPerKind) {
  const std::string text = render(OutputFormat::table);
  EXPECT_EQ(text.find("run"), std::string::npos);
  EXPECT_NE(text.find("# step\n iteration     lm_loss  \n"), std::string::npos) << text;
  EXPECT_NE(text.find("# summary"), std::string::npos);
}

TEST(Records, CsvQuotesAndHeaders) {
  const std::string text = render(OutputFormat::csv);
  EXPECT_EQ(text, "record,iteration,lm_loss\nstep,1,2.5\nstep,2,2.25\n\nrecord,note\nsummary,\"a,b\"\n");
}

TEST(Records, DisabledWriterWritesNothing) { EXPECT_EQ(render(OutputFormat::jsonl, false), ""); }

TEST(Records, UnknownFormatIsAUsageError) { EXPECT_THROW(mt::tools::parse_format("xml"), mt::UsageError); }

namespace {
size_t count_of(const std::string& text, const std::string& part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

// mt-shard inspect's shape: kinds that alternate, and samples whose decoded text has newlines and
// whose token list is wider than any fixed buffer.
std::vector<Record> inspect_like_records() {
  std::vector<int> tokens(300, 12345);
  return {Record{{"record", "split"}, {"split", "train"}, {"samples", 10}},
          Record{{"record", "blend"}, {"split", "train"}, {"weight", 1.0}},
          Record{{"record", "split"}, {"split", "valid"}, {"samples", 3}},
          Record{{"record", "blend"}, {"split", "valid"}, {"weight", 1.0}},
          Record{{"record", "sample"}, {"sample", 0}, {"tokens", tokens}, {"text", "line one\nline two\r\n\tend"}},
          Record{{"record", "sample"}, {"sample", 1}, {"tokens", tokens}, {"text", "say \"hi\", \x1b[31mred\\"}}};
}
}  // namespace

// Issue 11 case 20: table and csv cells escape control characters (a decoded newline never breaks
// a row), every column has its header however wide, and each record kind gets one header.
TEST(Issue11Case20, TableHasOneHeaderPerKindAndOneLinePerRow) {
  const std::string text = render_records(OutputFormat::table, inspect_like_records());
  EXPECT_EQ(count_of(text, "# split\n"), 1u) << text;
  EXPECT_EQ(count_of(text, "# blend\n"), 1u) << text;
  EXPECT_EQ(count_of(text, "# sample\n"), 1u) << text;
  // 3 sections of title, header and rule, 6 rows, 2 blank lines between sections.
  EXPECT_EQ(count_of(text, "\n"), 3u * 3 + 6 + 2) << text;
  EXPECT_LT(text.find("# split\n"), text.find("# blend\n"));
  EXPECT_NE(text.find("line one\\nline two\\r\\n\\tend"), std::string::npos) << text;
  EXPECT_NE(text.find("say \"hi\", \\u001b[31mred\\\\"), std::string::npos) << text;
  // The sample header names every column: its last column, "text", ends the header line.
  const size_t header = text.find('\n', text.find("# sample\n")) + 1;
  const std::string header_line = text.substr(header, text.find('\n', header) - header);
  EXPECT_NE(header_line.find("tokens"), std::string::npos) << header_line;
  EXPECT_EQ(header_line.substr(header_line.size() - 6), "text  ") << header_line;
  // Rows are as wide as the header: every column lines up.
  const size_t row = text.find('\n', text.find('\n', header) + 1) + 1;
  EXPECT_EQ(text.find('\n', row) - row, header_line.size());
}

TEST(Issue11Case20, CsvIsOneLinePerRecordWithRfc4180Quoting) {
  const std::string text = render_records(OutputFormat::csv, inspect_like_records());
  EXPECT_EQ(count_of(text, "record,split,samples\n"), 1u) << text;
  EXPECT_EQ(count_of(text, "record,split,weight\n"), 1u) << text;
  EXPECT_EQ(count_of(text, "\n"), 3u + 6 + 2) << text;  // 3 headers, 6 rows, 2 blank lines
  EXPECT_NE(text.find("\nsplit,valid,3\n"), std::string::npos) << text;
  EXPECT_NE(text.find(",line one\\nline two\\r\\n\\tend\n"), std::string::npos) << text;
  EXPECT_NE(text.find(",\"say \"\"hi\"\", \\u001b[31mred\\\\\"\n"), std::string::npos) << text;
  EXPECT_NE(text.find(",\"[12345,12345,"), std::string::npos) << "a list cell holds commas: quoted";
}

TEST(Issue11Case20, EscapeCellCoversEveryLineBreak) {
  EXPECT_EQ(mt::tools::escape_cell("a\nb\rc\td\\e"), "a\\nb\\rc\\td\\\\e");
  EXPECT_EQ(mt::tools::escape_cell(std::string("\0\x1f\x7f", 3)), "\\u0000\\u001f\\u007f");
  EXPECT_EQ(mt::tools::escape_cell("next\xC2\x85line\xE2\x80\xA8sep\xE2\x80\xA9par"), "next\\u0085line\\u2028sep\\u2029par");
  EXPECT_EQ(mt::tools::escape_cell("caf\xC3\xA9 \xE2\x82\xAC"), "caf\xC3\xA9 \xE2\x82\xAC");  // other UTF-8 stays
}

namespace {
// A stream whose reader has gone, as stdout after `| head -1` exits (SIGPIPE ignored, as tool_main does).
std::FILE* closed_pipe() {
  signal(SIGPIPE, SIG_IGN);
  int ends[2];
  if (pipe(ends) != 0) return nullptr;
  close(ends[0]);
  return fdopen(ends[1], "w");
}
}  // namespace

TEST(Issue28L5, AFailedWriteIsAnErrorNamingStdoutAndWhy) {
  std::FILE* out = closed_pipe();
  ASSERT_NE(out, nullptr);
  RecordWriter writer(OutputFormat::jsonl, out);
  try {
    writer.write(Record{{"record", "x"}});
    FAIL() << "no error";
  } catch (const mt::Error& e) {
    EXPECT_STREQ(e.what(), "stdout: write failed: Broken pipe");
  }
  writer.finish();
  std::fclose(out);
}

TEST(Issue28L5, AFailedWriteStopsARunThatCanStop) {
  std::FILE* out = closed_pipe();
  ASSERT_NE(out, nullptr);
  mt::clear_stop_request();
  {
    RecordWriter writer(OutputFormat::jsonl, out);
    writer.stop_run_on_write_error();
    EXPECT_NO_THROW(writer.write(Record{{"record", "x"}}));
    EXPECT_EQ(writer.write_error(), "Broken pipe");
    EXPECT_EQ(mt::stop_signal(), SIGPIPE);
    EXPECT_NO_THROW(writer.write(Record{{"record", "y"}}));  // nothing more is written
  }
  mt::clear_stop_request();
  std::fclose(out);
}
