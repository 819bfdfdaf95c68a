// Tokenizers against the committed reference ids of tests/golden/tokenizer (made by
// make_token_goldens.py with tiktoken and HF tokenizers; nothing from Python is needed here):
// edge cases, llama.cpp's test vectors and ~10,000 random Unicode 15.0.0 strings with full ids,
// and the big corpora (tiny shakespeare, War and Peace; per document and whole files) as id count
// plus FNV-1a 64 of the ids. Every id must be equal:
//   GPT2BPETokenizer (encoder.json + vocab.bpe) and TikTokenizer r50k_base   == "gpt2"    (tiktoken)
//   HuggingFaceTokenizer gpt2-hf/tokenizer.json                                == "gpt2_hf" (HF tokenizers)
//   TikTokenizer cl100k_base                                                   == "cl100k"  (tiktoken)
//   TikTokenizer llama3/tokenizer.model                                        == "llama3"  (tiktoken + Meta's pattern)
// and decode(encode(text)) must give the text back; post-processor templates (TemplateProcessing)
// against HF's add_special_tokens=True (templates.jsonl). The tokenizer files and corpora are the
// repository's data/tokenizers, data/corpus and data/demo; the goldens' two JSONL corpora are those
// texts split by the rules of data/corpus/SOURCES.md, made here rather than stored.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../temp_dir.h"
#include "golden_records.h"
#include "text/tokenizer.h"

using mt::text::Tokenizer;
using mt::text::TokenizerOptions;
using mt::testing::golden::ids_fnv;
using mt::testing::golden::read_file;
using mt::testing::golden::read_jsonl;
namespace fs = std::filesystem;

namespace {

const fs::path kGoldenDir = fs::path(MT_SOURCE_DIR) / "tests/golden/tokenizer";

const fs::path kDataDir = fs::path(MT_SOURCE_DIR) / "data";
fs::path tokenizer_dir() { return kDataDir / "tokenizers"; }

// The documents of a corpus the goldens name: a .txt is one document; the two JSONL corpora are
// texts split by the rules of data/corpus/SOURCES.md (what make_token_goldens.py does too).
std::vector<std::string> corpus_documents(const std::string& corpus) {
  if (corpus == "tinyshakespeare.txt") return {read_file(kDataDir / "demo/tinyshakespeare.txt")};
  if (corpus == "war_and_peace_pg2600.txt") return {read_file(kDataDir / "corpus/war_and_peace_pg2600.txt")};
  std::vector<std::string> docs;
  if (corpus == "tinyshakespeare.jsonl") {
    // One document per speech: the text split at every "\n\n", which belongs to neither side.
    const std::string text = read_file(kDataDir / "demo/tinyshakespeare.txt");
    size_t begin = 0;
    for (size_t end; (end = text.find("\n\n", begin)) != std::string::npos; begin = end + 2)
      docs.push_back(text.substr(begin, end - begin));
    docs.push_back(text.substr(begin));
  } else if (corpus == "war_and_peace.jsonl") {
    // One document per chapter: a cut before every "\r\nCHAPTER <roman numeral>\r\n".
    const std::string text = read_file(kDataDir / "corpus/war_and_peace_pg2600.txt");
    const std::string heading = "\r\nCHAPTER ";
    size_t begin = 0;
    for (size_t at = text.find(heading); at != std::string::npos; at = text.find(heading, at + 1)) {
      const size_t numeral_end = text.find_first_not_of("IVXLC", at + heading.size());
      if (numeral_end == at + heading.size() || text.compare(numeral_end, 2, "\r\n") != 0) continue;
      if (at > begin) docs.push_back(text.substr(begin, at - begin));
      begin = at;
    }
    docs.push_back(text.substr(begin));
  } else {
    throw std::runtime_error("the goldens name an unknown corpus: " + corpus);
  }
  return docs;
}

// Printable form of a (UTF-8) string for failure messages: ASCII kept, the rest escaped, cut short.
std::string show(const std::string& text, size_t max_chars = 100) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size() && out.size() < max_chars; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\\' || c == '"') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  out += out.size() >= max_chars ? "\"..." : "\"";
  out += " (" + std::to_string(text.size()) + " bytes)";
  return out;
}

std::string show_ids(const std::vector<int32_t>& ids, size_t from, size_t count = 8) {
  std::string out = "[";
  if (from > 0) out += "... ";
  for (size_t i = from; i < ids.size() && i < from + count; ++i) {
    if (i > from) out += ", ";
    out += std::to_string(ids[i]);
  }
  if (from + count < ids.size()) out += ", ...";
  return out + "] (" + std::to_string(ids.size()) + " ids)";
}

// Empty when equal, else where and how the ids first differ.
std::string first_difference(const std::vector<int32_t>& expected, const std::vector<int32_t>& got) {
  size_t i = 0;
  while (i < expected.size() && i < got.size() && expected[i] == got[i]) ++i;
  if (i == expected.size() && i == got.size()) return {};
  const size_t from = i >= 2 ? i - 2 : 0;
  return "first difference at id position " + std::to_string(i) + ": expected " + show_ids(expected, from) +
         ", got " + show_ids(got, from);
}

struct Config {
  std::string label;   // test name suffix
  std::string golden;  // key in the golden records
  TokenizerOptions options;
};
void PrintTo(const Config& config, std::ostream* os) { *os << config.label; }

std::vector<Config> configs() {
  const std::string dir = tokenizer_dir().string();
  std::vector<Config> out;
  {
    Config c{"GPT2BPETokenizer", "gpt2", {}};
    c.options.type = "GPT2BPETokenizer";
    c.options.vocab_file = dir + "/gpt2/encoder.json";
    c.options.merge_file = dir + "/gpt2/vocab.bpe";
    out.push_back(c);
  }
  const auto add = [&](const std::string& label, const std::string& golden, const std::string& type,
                       const std::string& model) {
    Config c{label, golden, {}};
    c.options.type = type;
    c.options.tokenizer_model = dir + "/" + model;
    out.push_back(c);
  };
  add("TikTokenizer_r50k", "gpt2", "TikTokenizer", "r50k_base/r50k_base.tiktoken");
  add("HuggingFaceTokenizer_gpt2", "gpt2_hf", "HuggingFaceTokenizer", "gpt2-hf/tokenizer.json");
  add("TikTokenizer_cl100k", "cl100k", "TikTokenizer", "cl100k_base/cl100k_base.tiktoken");
  add("TikTokenizer_llama3", "llama3", "TikTokenizer", "llama3/tokenizer.model");
  return out;
}

// Each tokenizer is loaded once per process.
const Tokenizer& tokenizer(const Config& config) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard lock(mutex);
  auto& slot = cache[config.label];
  if (!slot) slot = Tokenizer::load(config.options);
  return *slot;
}

// The golden records of one kind, parsed once per process.
const std::vector<nlohmann::json>& golden(const std::string& kind) {
  static std::map<std::string, std::vector<nlohmann::json>> cache;
  auto it = cache.find(kind);
  if (it != cache.end()) return it->second;
  std::vector<nlohmann::json> records;
  if (kind == "random") {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(kGoldenDir)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("random_", 0) == 0 && entry.path().extension() == ".jsonl") files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& file : files) {
      auto part = read_jsonl(file);
      records.insert(records.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
    }
  } else {
    records = read_jsonl(kGoldenDir / (kind + ".jsonl"));
  }
  return cache.emplace(kind, std::move(records)).first->second;
}

const nlohmann::json& meta() {
  static const nlohmann::json m = nlohmann::json::parse(read_file(kGoldenDir / "meta.json"));
  return m;
}

class TokenizerGolden : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::is_directory(tokenizer_dir()))
        << "tokenizer files not found at " << tokenizer_dir();
    ASSERT_TRUE(fs::is_regular_file(kGoldenDir / "meta.json")) << "goldens missing in " << kGoldenDir;
  }

  // Compares every record of `kind` with the tokenizer; also decode(encode(text)) == text.
  void check_full_ids(const std::string& kind, size_t min_records) {
    const Config& config = GetParam();
    const Tokenizer& tok = tokenizer(config);
    const auto& records = golden(kind);
    ASSERT_GE(records.size(), min_records) << kind;
    size_t mismatches = 0, round_trip_failures = 0, reported = 0;
    std::vector<int32_t> ids;
    for (size_t i = 0; i < records.size(); ++i) {
      const auto& rec = records[i];
      const std::string text = rec.at("text").get<std::string>();
      const bool allow_special = rec.value("allow_special", false);
      const auto expected = rec.at(config.golden).get<std::vector<int32_t>>();
      ids.clear();
      tok.encode(text, ids, allow_special);
      const std::string where = kind + " string " + std::to_string(i) +
                                (rec.contains("name") ? " (" + rec["name"].get<std::string>() + ")" : "") +
                                (allow_special ? " [allow_special]" : "") + " " + show(text);
      if (const std::string diff = first_difference(expected, ids); !diff.empty()) {
        ++mismatches;
        if (reported++ < 25) ADD_FAILURE() << config.label << " vs " << config.golden << ": " << where << ": " << diff;
      }
      const std::string back = tok.decode(ids);
      if (back != text) {
        ++round_trip_failures;
        if (reported++ < 25) ADD_FAILURE() << config.label << ": decode(encode(x)) != x for " << where
                                           << ": decoded " << show(back);
      }
    }
    EXPECT_EQ(mismatches, 0u) << config.label << ": " << mismatches << " of " << records.size() << " " << kind
                              << " strings differ from " << config.golden;
    EXPECT_EQ(round_trip_failures, 0u) << config.label << ": " << round_trip_failures << " round-trip failures";
  }
};

TEST_P(TokenizerGolden, EdgeCases) { check_full_ids("edge_cases", 40); }

TEST_P(TokenizerGolden, LlamaCppTestVectors) { check_full_ids("testvectors", 46); }

TEST_P(TokenizerGolden, RandomUnicodeStrings) {
  check_full_ids("random", meta().at("random").at("count").get<size_t>());
}

// Whole corpora: per document (JSONL corpora) and whole files (.txt), id count and FNV-1a 64.
TEST_P(TokenizerGolden, Corpora) {
  const Config& config = GetParam();
  const Tokenizer& tok = tokenizer(config);
  const auto& records = golden("corpora");
  ASSERT_GT(records.size(), 7000u);
  std::map<std::string, std::vector<std::string>> docs;  // corpus file -> texts
  std::map<std::string, size_t> golden_docs;              // corpus file -> records naming it
  size_t mismatches = 0, round_trip_failures = 0, reported = 0;
  std::vector<int32_t> ids;
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& rec = records[i];
    const std::string corpus = rec.at("corpus").get<std::string>();
    auto& texts = docs[corpus];
    if (texts.empty()) texts = corpus_documents(corpus);
    ++golden_docs[corpus];
    const int64_t doc = rec.at("doc").get<int64_t>();
    const size_t index = doc < 0 ? 0 : static_cast<size_t>(doc);
    ASSERT_LT(index, texts.size()) << corpus;
    const std::string& text = texts[index];
    ASSERT_EQ(text.size(), rec.at("bytes").get<size_t>()) << corpus << " document " << doc << " is not the text the goldens were made from";
    const auto count = rec.at(config.golden).at(0).get<size_t>();
    const auto hash = rec.at(config.golden).at(1).get<std::string>();
    ids.clear();
    tok.encode(text, ids);
    const std::string got_hash = ids_fnv(ids);
    if (ids.size() != count || got_hash != hash) {
      ++mismatches;
      if (reported++ < 25)
        ADD_FAILURE() << config.label << " vs " << config.golden << ": corpora record " << i << " (" << corpus
                      << (doc < 0 ? " whole file" : " document " + std::to_string(doc)) << ", " << text.size()
                      << " bytes): expected " << count << " ids with FNV-1a " << hash << ", got " << ids.size()
                      << " ids with FNV-1a " << got_hash;
    }
    if (tok.decode(ids) != text) {
      ++round_trip_failures;
      if (reported++ < 25) ADD_FAILURE() << config.label << ": decode(encode(x)) != x for corpora record " << i;
    }
  }
  EXPECT_EQ(mismatches, 0u) << config.label << ": " << mismatches << " of " << records.size()
                            << " corpus documents differ from " << config.golden;
  EXPECT_EQ(round_trip_failures, 0u) << config.label << ": round-trip failures";
  for (const auto& [corpus, texts] : docs)
    EXPECT_EQ(texts.size(), golden_docs[corpus]) << corpus << ": the split gives another number of documents than the goldens";
}

// The goldens themselves: the references agreed where they should (make_token_goldens.py counts).
TEST(TokenizerGoldenFiles, ReferencesAgreeAndHashMatchesGenerator) {
  ASSERT_TRUE(fs::is_regular_file(kGoldenDir / "meta.json"));
  EXPECT_EQ(meta().at("unicode").get<std::string>(), "15.0.0");
  EXPECT_EQ(golden("random").size(), meta().at("random").at("count").get<size_t>());
  // FNV-1a 64 of [] and of [0x01020304, -1]: the same function as the generator's.
  EXPECT_EQ(ids_fnv({}), "cbf29ce484222325");
  EXPECT_EQ(ids_fnv({0x01020304, -1}), "8a8e4b80f29e3ee1");
  EXPECT_EQ(ids_fnv({50256}), "a9b90d16ccfa0659");
  const auto& corpora = golden("corpora");
  ASSERT_FALSE(corpora.empty());
  for (const auto& rec : golden("testvectors")) {
    EXPECT_EQ(rec.at("gpt2"), rec.at("llamacpp_gpt2")) << "test vector " << rec.at("index");
    EXPECT_EQ(rec.at("llama3"), rec.at("llamacpp_llama3")) << "test vector " << rec.at("index");
  }
}

// Issue 11 case 9: a TemplateProcessing post-processor's single-sequence template, against HF
// tokenizers' encode(add_special_tokens=True) (templates.jsonl, by make_template_goldens.py):
// GPT-2's tokenizer.json with a BOS template (<|endoftext|> first), and a tokenizer.json laid out as
// LLaMA-3's (post-processor Sequence[ByteLevel, TemplateProcessing], BOS 128000). Without the
// template (include_special_tokens false) the ids are HF's add_special_tokens=False.
TEST(Issue11Case09, TemplateProcessingMatchesHuggingFace) {
  ASSERT_TRUE(fs::is_regular_file(tokenizer_dir() / "gpt2-hf/tokenizer.json")) << tokenizer_dir();
  const mt::testing::TempDir temp("mt_template_golden");
  const fs::path& dir = temp.path();
  auto gpt2 = nlohmann::json::parse(read_file(tokenizer_dir() / "gpt2-hf/tokenizer.json"));
  gpt2["post_processor"] = nlohmann::json::parse(read_file(kGoldenDir / "gpt2_bos_post_processor.json"));
  std::ofstream(dir / "gpt2_bos.json") << gpt2.dump();
  const std::map<std::string, fs::path> files = {{"gpt2_bos", dir / "gpt2_bos.json"},
                                                 {"llama3_style", kGoldenDir / "llama3_style_tokenizer.json"}};
  const auto records = read_jsonl(kGoldenDir / "templates.jsonl");
  ASSERT_GE(records.size(), 90u);
  ASSERT_EQ(records[1].at("text"), "Hello world\n");
  ASSERT_EQ(records[1].at("gpt2_bos"), nlohmann::json({50256, 15496, 995, 198}));  // the issue's example
  for (const auto& [name, file] : files) {
    for (const bool include : {true, false}) {
      TokenizerOptions options;
      options.type = "HuggingFaceTokenizer";
      options.tokenizer_model = file.string();
      options.include_special_tokens = include;
      const auto tok = Tokenizer::load(options);
      const std::string golden = include ? name : name + "_plain";
      size_t mismatches = 0;
      std::vector<int32_t> ids;
      for (const auto& rec : records) {
        const std::string text = rec.at("text").get<std::string>();
        ids.clear();
        tok->encode_sequence(text, ids);
        if (const std::string diff = first_difference(rec.at(golden).get<std::vector<int32_t>>(), ids); !diff.empty()) {
          if (mismatches++ < 10) ADD_FAILURE() << golden << ": " << show(text) << ": " << diff;
        }
      }
      EXPECT_EQ(mismatches, 0u) << golden;
    }
  }
  const auto templates_meta = nlohmann::json::parse(read_file(kGoldenDir / "templates_meta.json"));
  EXPECT_EQ(templates_meta.at("llama3_full_disagreements"), 0) << "the fixture's layout is not LLaMA-3's";
}

INSTANTIATE_TEST_SUITE_P(All, TokenizerGolden, ::testing::ValuesIn(configs()),
                         [](const ::testing::TestParamInfo<Config>& info) { return info.param.label; });

}  // namespace
