// Record printers: jsonl leads with the run record, json is one parseable array, table and csv
// print a header per record kind.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "tools/common/records.h"
#include "core/error.h"

using mt::tools::OutputFormat;
using mt::tools::Record;
using mt::tools::RecordWriter;

namespace {
std::string render(OutputFormat format, bool enabled = true) {
  std::FILE* file = std::tmpfile();
  {
    RecordWriter writer(format, file, enabled);
    writer.write_run(Record{{"record", "run"}, {"tool", "mt-test"}});
    writer.write(Record{{"record", "step"}, {"iteration", 1}, {"lm_loss", 2.5}});
    writer.write(Record{{"record", "step"}, {"iteration", 2}, {"lm_loss", 2.25}});
    writer.write(Record{{"record", "summary"}, {"note", "a,b"}});
  }
  std::rewind(file);
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, file)) > 0) text.append(buffer, n);
  std::fclose(file);
  return text;
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
