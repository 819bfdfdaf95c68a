// text/preprocess.h over a byte tokenizer (id = byte, EOD 256): Megatron's preprocess_data
// semantics (a document per line, a sequence per string or list element, empty text written
// as an empty document, --append-eod on the last sequence, one dataset per key), output files
// byte-identical for every worker count and for inputs split across files, bad lines reported
// by file and line in input order or skipped and counted, no output left by a failed run,
// raw-text split points that never change a pre-tokenizer piece, and --partitions in a world of
// one: every line dealt as Megatron deals it (none dropped, none moved), written in partition
// order, whatever the byte-range chunk boundaries cut (a CRLF, a line, a range with no line
// start); the record queue that holds tokens arriving before their turn, in memory then in a
// spool file. Under MPI: tests/tools/mt-tokenize-partitions.bats.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "text/preprocess.h"
#include "text/record_queue.h"
#include "data/token_dataset.h"
#include "byte_tokenizer.h"

using namespace mt::text;
using namespace mt::data;
namespace fs = std::filesystem;

namespace {


class PreprocessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() / ("mt_preprocess_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string bytes_of(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  PreprocessOptions options(std::vector<std::string> inputs, const std::string& prefix) {
    PreprocessOptions o;
    o.input.inputs = std::move(inputs);
    o.output_prefix = path(prefix);
    o.output_format = TokenDatasetFormat::both;
    return o;
  }

  mt::testing::ByteTokenizer tokenizer_;
  fs::path dir_;
};

std::vector<int32_t> ids(const std::string& text) {
  std::vector<int32_t> result;
  for (char c : text) result.push_back(static_cast<unsigned char>(c));
  return result;
}

TEST_F(PreprocessTest, MegatronDocumentsSequencesAndKeys) {
  const std::string input = write("in.jsonl",
                                  "{\"text\": \"ab\", \"title\": \"T\"}\n"
                                  "{\"text\": \"\", \"title\": \"U\"}\n"
                                  "{\"text\": [\"cd\", \"\", \"e\"], \"title\": \"\"}\n");
  PreprocessOptions o = options({input}, "out");
  o.json_keys = {"text", "title"};
  o.append_eod = true;
  const PreprocessStats stats = preprocess_jsonl(tokenizer_, o);
  EXPECT_EQ(stats.documents, 3);
  EXPECT_EQ(stats.empty_documents, 2);  // text of line 2, title of line 3
  EXPECT_EQ(stats.sequences, 3 + 2);
  EXPECT_EQ(stats.tokens, 3 + 4 + 2 + 2);
  EXPECT_EQ(stats.outputs.size(), 6u);

  TokenDataset text = TokenDataset::open(path("out_text_document"));
  ASSERT_EQ(text.sequence_count(), 3);
  EXPECT_EQ(text.get(0), (std::vector<int32_t>{'a', 'b', 256}));
  EXPECT_EQ(text.get(1), ids("cd"));
  EXPECT_EQ(text.get(2), (std::vector<int32_t>{'e', 256}));
  EXPECT_EQ(std::vector<int64_t>(text.document_indices().begin(), text.document_indices().end()),
            (std::vector<int64_t>{0, 1, 1, 3}));
  EXPECT_EQ(text.metadata().eod_id, 256);
  EXPECT_EQ(text.metadata().tokenizer, "bytes");

  TokenDataset title = TokenDataset::open(path("out_title_document.bin"));
  EXPECT_EQ(std::vector<int64_t>(title.document_indices().begin(), title.document_indices().end()),
            (std::vector<int64_t>{0, 1, 2, 2}));
}

TEST_F(PreprocessTest, SpecialTokensOnlyWhenAllowed) {
  const std::string input = write("in.jsonl", R"({"text": "a<|endoftext|>"})" "\n");
  PreprocessOptions o = options({input}, "plain");
  EXPECT_EQ(preprocess_jsonl(tokenizer_, o).tokens, 14);
  o = options({input}, "special");
  o.allow_special = true;
  preprocess_jsonl(tokenizer_, o);
  EXPECT_EQ(TokenDataset::open(path("special_text_document")).get(0), (std::vector<int32_t>{'a', 256}));
}

TEST_F(PreprocessTest, OutputIsIdenticalForEveryWorkerCountAndInputSplit) {
  std::string all, first, second;
  for (int i = 0; i < 3000; ++i) {
    const std::string line = "{\"text\": \"document " + std::to_string(i) + std::string(i % 37, 'x') + "\"}\n";
    all += line;
    (i < 1234 ? first : second) += line;
  }
  const std::string whole = write("all.jsonl", all);
  const std::vector<std::string> parts = {write("a.jsonl", first), write("b.jsonl", second)};
  PreprocessOptions reference = options({whole}, "w1");
  reference.input.batch_bytes = 4096;  // many batches
  preprocess_jsonl(tokenizer_, reference);
  for (int workers : {2, 3, 7}) {
    PreprocessOptions o = options({whole}, "w" + std::to_string(workers));
    o.input.batch_bytes = 4096;
    o.workers = workers;
    preprocess_jsonl(tokenizer_, o);
  }
  PreprocessOptions split = options(parts, "split");
  split.workers = 2;
  preprocess_jsonl(tokenizer_, split);
  for (const char* prefix : {"w2", "w3", "w7", "split"}) {
    for (const char* extension : {".h5", ".bin", ".idx"}) {
      EXPECT_EQ(bytes_of(path(std::string(prefix) + "_text_document" + extension)),
                bytes_of(path(std::string("w1_text_document") + extension)))
          << prefix << extension;
    }
  }
  EXPECT_EQ(TokenDataset::open(path("w1_text_document")).document_count(), 3000);
}

TEST_F(PreprocessTest, FirstBadLineInInputOrderFailsTheRunAndLeavesNoOutput) {
  std::string content;
  for (int i = 1; i <= 500; ++i) {
    if (i == 123) content += "{\"text\": 7}\n";
    else if (i == 400) content += "not json\n";
    else content += "{\"text\": \"line " + std::to_string(i) + "\"}\n";
  }
  const std::string input = write("bad.jsonl", content);
  for (int workers : {1, 4}) {
    PreprocessOptions o = options({input}, "bad");
    o.input.batch_bytes = 512;
    o.workers = workers;
    try {
      preprocess_jsonl(tokenizer_, o);
      FAIL() << "no error";
    } catch (const mt::Error& e) {
      EXPECT_EQ(std::string(e.what()), input + ":123: key 'text': is a number, expected a string or a list of strings");
    }
    EXPECT_EQ(files(), std::vector<std::string>{"bad.jsonl"});
  }
  PreprocessOptions o = options({input}, "skipped");
  o.skip_bad_lines = true;
  o.workers = 3;
  const PreprocessStats stats = preprocess_jsonl(tokenizer_, o);
  EXPECT_EQ(stats.bad_lines, 2);
  EXPECT_EQ(stats.documents, 498);
}

TEST_F(PreprocessTest, LongLinesAndMissingInputsAreErrors) {
  const std::string input = write("long.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"" + std::string(5000, 'y') + "\"}\n");
  PreprocessOptions o = options({input}, "long");
  o.input.max_line_bytes = 1000;
  try {
    preprocess_jsonl(tokenizer_, o);
    FAIL() << "no error";
  } catch (const mt::Error& e) {
    EXPECT_EQ(std::string(e.what()), input + ":2: longer than --max-line-bytes: 1000");
  }
  o = options({path("missing.jsonl")}, "missing");
  EXPECT_THROW(preprocess_jsonl(tokenizer_, o), mt::Error);
  o = options({input}, "");
  o.output_prefix.clear();
  EXPECT_THROW(preprocess_jsonl(tokenizer_, o), mt::UsageError);
}

TEST_F(PreprocessTest, EncodeStreamEmitsOneDocumentPerLineOrTheRawTextInOrder) {
  const std::string input = write("in.jsonl", "{\"text\": \"ab\"}\n{\"text\": [\"c\", \"d\"]}\n{\"text\": \"\"}\n");
  EncodeOptions o;
  o.input.inputs = {input};
  std::vector<std::vector<int32_t>> documents;
  encode_stream(tokenizer_, o, [&](std::span<const int32_t> ids, bool end) {
    EXPECT_TRUE(end);
    documents.emplace_back(ids.begin(), ids.end());
  });
  EXPECT_EQ(documents, (std::vector<std::vector<int32_t>>{ids("ab"), ids("cd"), {}}));

  std::string text;
  for (int i = 0; i < 20000; ++i) text += "Line " + std::to_string(i) + ".\nword\n";
  o.input.inputs = {write("raw.txt", text + "\xFF")};
  o.raw = true;
  o.workers = 3;
  std::vector<int32_t> all;
  int ends = 0;
  const PreprocessStats stats = encode_stream(tokenizer_, o, [&](std::span<const int32_t> ids, bool end) {
    all.insert(all.end(), ids.begin(), ids.end());
    ends += end;
  });
  EXPECT_EQ(ends, 1);
  EXPECT_EQ(stats.replaced, 1);
  EXPECT_EQ(all, ids(text + "\xEF\xBF\xBD"));
}

// Issue 11 case 8: a line longer than --max-line-bytes is read past in chunks; with
// skip_bad_lines it is counted and the lines after it are read (their numbers still right),
// without it the error names it. Here a 1 MB line against max_line_bytes 10000 and 4 KiB batches.
TEST_F(PreprocessTest, Issue11Case08LongLinesAreSkippedWhenAskedAndNamedOtherwise) {
  const std::string long_line = "{\"text\": \"" + std::string(1 << 20, 'z') + "\"}";
  const std::string input = write("long.jsonl", "{\"text\": \"ab\"}\n" + long_line + "\n{\"text\": \"cd\"}\n" +
                                                    "not json\n{\"text\": \"ef\"}\n" + long_line);
  for (int workers : {1, 3}) {
    PreprocessOptions o = options({input}, "skip" + std::to_string(workers));
    o.input.batch_bytes = 4096;
    o.input.max_line_bytes = 10000;
    o.workers = workers;
    o.skip_bad_lines = true;
    const PreprocessStats stats = preprocess_jsonl(tokenizer_, o);
    EXPECT_EQ(stats.bad_lines, 3);  // two long lines, one malformed
    EXPECT_EQ(stats.documents, 3);
    EXPECT_EQ(stats.input_bytes, static_cast<int64_t>(bytes_of(input).size()));
    TokenDataset dataset = TokenDataset::open(path("skip" + std::to_string(workers) + "_text_document"));
    ASSERT_EQ(dataset.sequence_count(), 3);
    EXPECT_EQ(dataset.get(1), ids("cd"));
    EXPECT_EQ(dataset.get(2), ids("ef"));

    o = options({input}, "fail");
    o.input.batch_bytes = 4096;
    o.input.max_line_bytes = 10000;
    o.workers = workers;
    try {
      preprocess_jsonl(tokenizer_, o);
      FAIL() << "no error";
    } catch (const mt::Error& e) {
      EXPECT_EQ(std::string(e.what()), input + ":2: longer than --max-line-bytes: 10000");
    }
  }
  // The streaming encoder (mt-tokenize encode) and read_texts (mt-tokenize train) do the same.
  const std::string head = write("head.jsonl", "{\"text\": \"x\"}\n" + long_line + "\n\n{\"text\": 5}\n");
  EncodeOptions encode;
  encode.input.inputs = {head};
  encode.input.batch_bytes = 4096;
  encode.input.max_line_bytes = 10000;
  encode.skip_bad_lines = true;
  EXPECT_EQ(encode_stream(tokenizer_, encode, [](std::span<const int32_t>, bool) {}).bad_lines, 2);
  const PreprocessStats read = read_texts(encode.input, false, "text", true, [](std::string_view) {});
  EXPECT_EQ(read.bad_lines, 2);
  EXPECT_EQ(read.documents, 1);
  EXPECT_EQ(read.blank_lines, 1);
  encode.skip_bad_lines = false;
  try {
    encode_stream(tokenizer_, encode, [](std::span<const int32_t>, bool) {});
    FAIL() << "no error";
  } catch (const mt::Error& e) {
    EXPECT_EQ(std::string(e.what()), head + ":2: longer than --max-line-bytes: 10000");
  }
}

// Issue 11 case 21: blank lines are skipped (counted, never documents) and a UTF-8 byte order
// mark at the start of an input is dropped, in every JSONL reader.
TEST_F(PreprocessTest, Issue11Case21BlankLinesAndByteOrderMarks) {
  const std::string bom = "\xEF\xBB\xBF";
  const std::string first = write("first.jsonl", bom + "{\"text\": \"ab\"}\n\n   \n{\"text\": \"c\"}\n\r\n");
  const std::string second = write("second.jsonl", bom + "\n{\"text\": \"d\"}");
  PreprocessOptions o = options({first, second}, "out");
  const PreprocessStats stats = preprocess_jsonl(tokenizer_, o);
  EXPECT_EQ(stats.documents, 3);
  EXPECT_EQ(stats.blank_lines, 4);
  EXPECT_EQ(stats.bad_lines, 0);
  TokenDataset dataset = TokenDataset::open(path("out_text_document"));
  ASSERT_EQ(dataset.sequence_count(), 3);
  EXPECT_EQ(dataset.get(0), ids("ab"));
  EXPECT_EQ(dataset.get(2), ids("d"));

  EncodeOptions encode;
  encode.input.inputs = {first, second};
  std::vector<std::vector<int32_t>> documents;
  const PreprocessStats encoded = encode_stream(tokenizer_, encode, [&](std::span<const int32_t> ids, bool) {
    documents.emplace_back(ids.begin(), ids.end());
  });
  EXPECT_EQ(documents, (std::vector<std::vector<int32_t>>{ids("ab"), ids("c"), ids("d")}));
  EXPECT_EQ(encoded.blank_lines, 4);
  EXPECT_EQ(read_texts(encode.input, false, "text", false, [](std::string_view) {}).blank_lines, 4);

  // Only the start of an input: a mark later in a line is the line's text (malformed JSON here).
  const std::string inner = write("inner.jsonl", "{\"text\": \"a\"}\n" + bom + "{\"text\": \"b\"}\n");
  try {
    preprocess_jsonl(tokenizer_, options({inner}, "inner"));
    FAIL() << "no error";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find(inner + ":2: malformed JSON"), std::string::npos) << e.what();
  }
}

// A tokenizer with a post-processor template: 257 before each sequence, 258 after it.
class TemplateByteTokenizer : public mt::testing::ByteTokenizer {
 public:
  int64_t vocab_size() const override { return 259; }
  std::span<const int32_t> sequence_prefix() const override { return prefix_; }
  std::span<const int32_t> sequence_suffix() const override { return suffix_; }

 private:
  std::vector<int32_t> prefix_{257}, suffix_{258};
};

// Issue 11 case 9: the template goes around every sequence Megatron writes (each sentence of a
// list, an empty one kept because it is no longer empty), around each JSONL document encode
// emits, and once around a raw text however many workers cut it.
TEST_F(PreprocessTest, Issue11Case09TemplatesGoAroundEverySequence) {
  const TemplateByteTokenizer templated;
  const std::string input = write("in.jsonl", "{\"text\": \"ab\"}\n{\"text\": [\"c\", \"\"]}\n");
  PreprocessOptions o = options({input}, "out");
  o.append_eod = true;
  const PreprocessStats stats = preprocess_jsonl(templated, o);
  EXPECT_EQ(stats.sequences, 3);
  TokenDataset dataset = TokenDataset::open(path("out_text_document"));
  ASSERT_EQ(dataset.sequence_count(), 3);
  EXPECT_EQ(dataset.get(0), (std::vector<int32_t>{257, 'a', 'b', 258, 256}));
  EXPECT_EQ(dataset.get(1), (std::vector<int32_t>{257, 'c', 258}));
  EXPECT_EQ(dataset.get(2), (std::vector<int32_t>{257, 258, 256}));

  std::string text;
  for (int i = 0; i < 20000; ++i) text += "Line " + std::to_string(i) + ".\nword\n";
  EncodeOptions encode;
  encode.input.inputs = {write("raw.txt", text)};
  encode.raw = true;
  encode.workers = 3;
  std::vector<int32_t> all;
  encode_stream(templated, encode, [&](std::span<const int32_t> ids, bool) { all.insert(all.end(), ids.begin(), ids.end()); });
  std::vector<int32_t> expected = ids(text);
  expected.insert(expected.begin(), 257);
  expected.push_back(258);
  EXPECT_EQ(all, expected);
}

TEST(SplitPoints, AfterANewlineBetweenPrintableAsciiAndALetterOrBeforeASpaceBetweenLetters) {
  const std::string text = "abc.\nDef  \nghi\n\nJkl!\n9x\nmno.\nPqr";
  const std::vector<size_t> points = split_points_for_parallel_encoding(text, 1);
  EXPECT_EQ(points, (std::vector<size_t>{5, 24, 29}));
  for (size_t point : points) EXPECT_EQ(text[point - 1], '\n');
  const std::string crlf = "One two\r\nthree  four 5 x\r\n";
  EXPECT_EQ(split_points_for_parallel_encoding(crlf, 1), (std::vector<size_t>{3}));
  EXPECT_EQ(split_points_for_parallel_encoding(crlf + crlf, 8), (std::vector<size_t>{29}));
}

// Expected values from Python 3.11's fnmatch.fnmatchcase and os.path.splitext (Megatron's glob
// and partition file names).
TEST(Partitions, FnmatchCaseEqualsPythons) {
  const std::vector<std::tuple<std::string, std::string, bool>> cases = {
      {"a.jsonl", "*.jsonl", true}, {"a.json", "*.jsonl", false}, {"[x].jsonl", "[[]x].jsonl", true},
      {"b", "[!a]", true},          {"a", "[!a]", false},         {"a-b", "a[-]b", true},
      {"c", "[a-c]", true},         {"d", "[a-c]", false},        {"[", "[", true},
      {"ab", "a*b*", true},         {"abc", "a?c", true},         {"ac", "a?c", false},
      {"x]", "[]]", false},         {"]", "[]]", true},           {"aXbXc", "a*b*c", true}};
  for (const auto& [name, pattern, expected] : cases) {
    EXPECT_EQ(fnmatch_case(name, pattern), expected) << name << " vs " << pattern;
  }
}

TEST(Partitions, FileNamesFollowOsPathSplitext) {
  EXPECT_EQ(partition_file_name("data/*.jsonl", 0), "data/*_0.jsonl");
  EXPECT_EQ(partition_file_name("a.b/c", 1), "a.b/c_1");
  EXPECT_EQ(partition_file_name(".hidden", 2), ".hidden_2");
  EXPECT_EQ(partition_file_name("x/..jsonl", 0), "x/..jsonl_0");
  EXPECT_EQ(partition_file_name("a.tar.gz", 3), "a.tar_3.gz");
}

// --partitions in a world of one, against Megatron's dealing restated here: line j of the files
// in glob order (blank lines included) to partition j % N, or to j / ceil(lines / N); the output
// holds partition 0's documents, then partition 1's, ... Each line names itself, so a dropped,
// repeated or moved line shows as the document at its place.
class PartitionTest : public PreprocessTest {
 protected:
  // Three files whose lines are documents "<file>.<line>" with two sentences of text and a title:
  // LF, CRLF and lone CR ends, blank lines, a BOM and a last line without an end.
  void SetUp() override {
    PreprocessTest::SetUp();
    fs::create_directories(dir_ / "in");
    const std::vector<std::string> ends = {"\n", "\r\n", "\r"};
    for (const auto& [name, count] : std::vector<std::pair<std::string, int>>{{"a", 37}, {"b", 101}, {"c", 8}}) {
      std::string content = name == "b" ? "\xEF\xBB\xBF" : "";
      std::vector<std::string>& ids = ids_[path("in/" + name + ".jsonl")];
      for (int i = 1; i <= count; ++i) {
        const std::string id = name + "." + std::to_string(i);
        const bool blank = i % 10 == 4;
        ids.push_back(blank ? "" : id);
        content += blank ? "  " : R"({"text": [")" + id + R"( one", ")" + id + R"( two"], "title": "t)" + id + R"("})";
        if (name != "c" || i < count) content += ends[static_cast<size_t>(i) % ends.size()];
      }
      write("in/" + name + ".jsonl", content);
    }
  }

  // The document ids in Megatron's merged order (blank lines dealt, then skipped).
  std::vector<std::string> megatron_order(int n, bool sequential) {
    std::vector<std::string> lines;
    for (const std::string& file : expand_input_glob(path("in/*.jsonl"))) {  // readdir's order, as glob.glob
      lines.insert(lines.end(), ids_.at(file).begin(), ids_.at(file).end());
    }
    const size_t parts = static_cast<size_t>(n), block = (lines.size() + parts - 1) / parts;
    std::vector<std::vector<std::string>> dealt(parts);
    for (size_t j = 0; j < lines.size(); ++j) dealt[sequential ? j / block : j % parts].push_back(lines[j]);
    std::vector<std::string> order;
    for (const auto& part : dealt) {
      for (const std::string& id : part) {
        if (!id.empty()) order.push_back(id);
      }
    }
    return order;
  }

  PreprocessStats run(int n, bool sequential, int workers, const std::string& prefix,
                      const std::string& pattern = "in/*.jsonl") {
    PreprocessOptions o = options({path(pattern)}, prefix);
    o.json_keys = {"text", "title"};
    o.workers = workers;
    o.input.batch_bytes = 200;  // many batches per partition
    PartitionOptions partitions;
    partitions.partitions = n;
    partitions.keep_sequential = sequential;
    auto world = mt::comm::make_single_communicator();
    return preprocess_partitions(tokenizer_, o, partitions, *world);
  }

  // Each document of `prefix`'s outputs names its id: text "<id> one", "<id> two"; title "t<id>".
  void expect_documents(const std::string& prefix, const std::vector<std::string>& order) {
    const TokenDataset text = TokenDataset::open(path(prefix + "_text_document"));
    const TokenDataset title = TokenDataset::open(path(prefix + "_title_document.bin"));
    ASSERT_EQ(text.document_count(), static_cast<int64_t>(order.size()));
    ASSERT_EQ(title.document_count(), static_cast<int64_t>(order.size()));
    for (size_t d = 0; d < order.size(); ++d) {
      const int64_t first = text.document_indices()[d];
      ASSERT_EQ(text.document_indices()[d + 1] - first, 2) << "document " << d;
      EXPECT_EQ(text.get(first), ids(order[d] + " one")) << "document " << d;
      EXPECT_EQ(text.get(first + 1), ids(order[d] + " two")) << "document " << d;
      EXPECT_EQ(title.get(title.document_indices()[d]), ids("t" + order[d])) << "document " << d;
    }
  }

  std::map<std::string, std::vector<std::string>> ids_;  // per file, per line: its id ("" when blank)
};

TEST_F(PartitionTest, EveryLineIsDealtAsMegatronDealsItAndWrittenInPartitionOrder) {
  const int64_t input_bytes = static_cast<int64_t>(fs::file_size(path("in/a.jsonl")) + fs::file_size(path("in/b.jsonl")) +
                                                   fs::file_size(path("in/c.jsonl")));
  for (const bool sequential : {false, true}) {
    for (const int n : {2, 3, 7}) {
      for (const int threads : {1, 2}) {  // per partition: inline, or worker threads
        const std::string prefix = std::string(sequential ? "s" : "r") + std::to_string(n) + (threads == 1 ? "i" : "t");
        SCOPED_TRACE(prefix);
        const PreprocessStats stats = run(n, sequential, n * threads, prefix);
        expect_documents(prefix, megatron_order(n, sequential));
        EXPECT_EQ(stats.documents, 146 - 15);
        EXPECT_EQ(stats.blank_lines, 15);  // lines 4, 14, ... of each file
        EXPECT_EQ(stats.input_bytes, input_bytes);
      }
    }
  }
  // Only the outputs: no partition file, per-partition output or spool file is left.
  for (const std::string& name : files()) {
    EXPECT_TRUE(name == "in" || std::regex_match(name, std::regex("[rs][237][it]_(text|title)_document\\.(h5|bin|idx)")))
        << name;
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(path("in")), fs::directory_iterator()), 3);
}

// The reader takes 1 MiB at a time: a CRLF cut by that boundary is one line end, not two.
TEST_F(PartitionTest, ALineEndAcrossTheReadBoundaryIsOneEnd) {
  const auto line = [](const std::string& id) { return R"({"text": [")" + id + R"( one", ")" + id + R"( two"], "title": "t)" + id + "\""; };
  fs::create_directories(dir_ / "edge");
  std::string first = line("x.1");
  first += std::string((size_t{1} << 20) - 1 - first.size() - 1, ' ') + "}";  // its CR is the chunk's last byte
  write("edge/x.jsonl", first + "\r\n" + line("x.2") + "}\r" + line("x.3") + "}\r\n");
  ASSERT_EQ(bytes_of(path("edge/x.jsonl"))[(size_t{1} << 20) - 1], '\r');
  const PreprocessStats stats = run(2, false, 2, "edge", "edge/*.jsonl");
  EXPECT_EQ(stats.blank_lines, 0);
  expect_documents("edge", {"x.1", "x.3", "x.2"});  // a second end would deal x.2 to partition 0
}

TEST_F(PartitionTest, ABadLineIsNamedByItsInputFileAndLine) {
  std::string b = bytes_of(path("in/b.jsonl"));
  b.replace(b.find(R"({"text": ["b.17 one")"), 1, "[");  // line 17 of b: not an object
  write("in/b.jsonl", b);
  for (const bool sequential : {false, true}) {
    try {
      run(3, sequential, 3, "bad");
      ADD_FAILURE() << "the bad line was not found";
    } catch (const mt::Error& e) {
      EXPECT_TRUE(std::string(e.what()).starts_with(path("in/b.jsonl") + ":17: ")) << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(path("bad_text_document.bin")));
}

TEST_F(PartitionTest, PartitionFilesAnEarlierRunLeftAreReadInsteadOfTheInput) {
  write("in/*_0.jsonl", "{\"text\": [\"x.1 one\", \"x.1 two\"], \"title\": \"tx.1\"}\n");
  write("in/*_1.jsonl", "{\"text\": [\"y.1 one\", \"y.1 two\"], \"title\": \"ty.1\"}\r\n"
                        "{\"text\": [\"y.2 one\", \"y.2 two\"], \"title\": \"ty.2\"}");
  const PreprocessStats stats = run(2, false, 2, "reused");
  EXPECT_TRUE(stats.partition_files_reused);
  expect_documents("reused", {"x.1", "y.1", "y.2"});
  // Only some of them: the pattern would read one as input, so the run is refused.
  fs::remove(path("in/*_1.jsonl"));
  EXPECT_THROW(run(2, false, 2, "some"), mt::UsageError);
}

// Chunk boundaries at every 100th byte (3200 bytes, 2 partitions: 32 chunks): a CRLF whose LF is
// a boundary's byte, a line after a lone CR starting exactly on one, a 799-byte line over seven
// chunks that hold no line start, a line straddling one, a blank line, the last line without an end.
TEST_F(PartitionTest, ChunkBoundariesCutNoLineAndMoveNoLine) {
  const auto line = [](const std::string& id, size_t bytes) {
    std::string text = R"({"text": [")" + id + R"( one", ")" + id + R"( two"], "title": "t)" + id + "\"";
    return text + std::string(bytes - text.size() - 1, ' ') + "}";
  };
  std::string content = line("x.1", 99) + "\r\n" + line("x.2", 98) + "\r" + line("x.3", 799) + "\n" + line("x.4", 149) + "\n";
  std::vector<std::string> ids = {"x.1", "x.2", "x.3", "x.4", ""};
  content += "   \n";
  const std::vector<std::string> ends = {"\n", "\r\n", "\r"};
  for (int i = 5; content.size() + 60 < 3200 - 60; ++i) {
    const std::string& end = ends[static_cast<size_t>(i) % ends.size()];
    ids.push_back("x." + std::to_string(i));
    content += line(ids.back(), 60 - end.size()) + end;
  }
  ids.push_back("x.last");
  content += line(ids.back(), 3200 - content.size());
  ASSERT_EQ(content.size(), 3200u);
  ASSERT_EQ(content.substr(99, 2), "\r\n");  // the LF is byte 100, chunk 1's first
  ASSERT_EQ(content[199], '\r');              // x.3 starts at byte 200, chunk 2's first
  ASSERT_EQ(content[999], '\n');              // chunks 3 to 9 ([300, 1000)) start no line
  fs::create_directories(dir_ / "edge");
  write("edge/x.jsonl", content);
  for (const bool sequential : {false, true}) {
    std::vector<std::string> order;
    for (const int part : {0, 1}) {
      for (size_t j = 0; j < ids.size(); ++j) {
        if (!ids[j].empty() && (sequential ? part == 0 : j % 2 == static_cast<size_t>(part))) order.push_back(ids[j]);
      }
    }
    const std::string prefix = sequential ? "edge_s" : "edge_r";
    const PreprocessStats stats = run(2, sequential, 2, prefix, "edge/*.jsonl");
    expect_documents(prefix, order);
    EXPECT_EQ(stats.blank_lines, 1);
  }
}

// An empty file among the inputs deals no line (round robin); with --keep-sequential-samples an
// empty one, or one holding only a byte order mark, is refused (Megatron miscounts it).
TEST_F(PartitionTest, AnEmptyFileDealsNoLineAndSequentialRefusesIt) {
  write("in/e.jsonl", "");
  ids_[path("in/e.jsonl")] = {};
  run(3, false, 3, "empty");
  expect_documents("empty", megatron_order(3, false));
  EXPECT_THROW(run(3, true, 3, "empty_s"), mt::UsageError);
  write("in/e.jsonl", "\xEF\xBB\xBF");
  EXPECT_THROW(run(3, true, 3, "bom_s"), mt::UsageError);
}

// A bad line in a chunk that starts inside its file is still named by its line in the file.
TEST_F(PartitionTest, ABadLineDeepInAFileIsNamedByItsLineInTheFile) {
  std::string b = bytes_of(path("in/b.jsonl"));
  b.replace(b.find(R"({"text": ["b.97 one")"), 1, "[");
  write("in/b.jsonl", b);
  try {
    run(2, false, 2, "bad97");
    ADD_FAILURE() << "the bad line was not found";
  } catch (const mt::Error& e) {
    EXPECT_TRUE(std::string(e.what()).starts_with(path("in/b.jsonl") + ":97: ")) << e.what();
  }
}

// Records leave in the order they came, from memory while the shared budget lasts, then from the
// spool file (unlinked: never seen in the directory), which is emptied when the queue is.
TEST_F(PreprocessTest, RecordQueueKeepsTheOrderInMemoryAndInItsSpoolFile) {
  size_t budget = 250;
  RecordQueue queue(path("out"), budget), other(path("out"), budget);
  other.push(9, std::string(100, 'o'));
  EXPECT_EQ(budget, 150u);
  queue.push(1, std::string(100, 'a'));
  queue.push(1, std::string(100, 'b'));  // over the budget: to the file
  queue.push(2, std::string(10, 'c'));   // fits, but follows b into the file
  EXPECT_EQ(queue.records_in_file(), 2u);
  EXPECT_EQ(budget, 50u);
  for (const std::string& name : files()) EXPECT_EQ(name.find("spool"), std::string::npos) << name;
  const std::vector<std::pair<int64_t, std::string>> expected = {
      {1, std::string(100, 'a')}, {1, std::string(100, 'b')}, {2, std::string(10, 'c')}};
  for (const auto& [tag, record] : expected) {
    ASSERT_FALSE(queue.empty());
    EXPECT_EQ(queue.front_tag(), tag);
    EXPECT_EQ(queue.pop(), record);
  }
  EXPECT_TRUE(queue.empty());
  EXPECT_EQ(budget, 150u);
  queue.push(3, std::string(120, 'd'));  // the file is empty again: memory
  EXPECT_EQ(queue.records_in_file(), 0u);
  EXPECT_EQ(queue.pop(), std::string(120, 'd'));
  EXPECT_EQ(other.pop(), std::string(100, 'o'));
  EXPECT_EQ(budget, 250u);
}

}  // namespace
