// What the tokenizer golden tests share: reading the committed files, the FNV-1a 64 hashes the
// golden makers (tests/golden/*/make_*.py) write, and the checks of a tokenizer's ids and decodes
// against records of tests/golden/sentencepiece (the edge-case, decode and hashed-block records).
// Used by tests/unit/text/test_tokenizer_golden.cpp, test_sentencepiece_golden.cpp,
// test_hf_sentencepiece_golden.cpp, test_wordpiece_golden.cpp and test_deepseek_golden.cpp.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace mt::testing::golden {

namespace fs = std::filesystem;

inline const fs::path kDataDir = fs::path(MT_SOURCE_DIR) / "data";
inline const fs::path kTokenizerGoldenDir = fs::path(MT_SOURCE_DIR) / "tests/golden/tokenizer";

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<nlohmann::json> read_jsonl(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::vector<nlohmann::json> records;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  }
  return records;
}

// FNV-1a 64 over bytes, as the golden makers compute it; hex() is 16 lowercase hex digits.
class Fnv {
 public:
  void add(const void* data, size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) state_ = (state_ ^ bytes[i]) * 0x100000001B3ull;
  }
  // The ids as little-endian int32 bytes.
  void add_ids(const std::vector<int32_t>& ids) {
    for (int32_t id : ids) {
      const auto u = static_cast<uint32_t>(id);
      const unsigned char bytes[4] = {static_cast<unsigned char>(u), static_cast<unsigned char>(u >> 8),
                                      static_cast<unsigned char>(u >> 16), static_cast<unsigned char>(u >> 24)};
      add(bytes, 4);
    }
  }
  // The count as a little-endian int32, then the ids (the sentencepiece goldens' blocks).
  void add_counted_ids(const std::vector<int32_t>& ids) {
    add_ids({static_cast<int32_t>(ids.size())});
    add_ids(ids);
  }
  std::string hex() const {
    char buffer[17];
    std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(state_));
    return buffer;
  }

 private:
  uint64_t state_ = 0xCBF29CE484222325ull;
};

inline std::string ids_fnv(const std::vector<int32_t>& ids) {
  Fnv hash;
  hash.add_ids(ids);
  return hash.hex();
}

inline std::string text_fnv(const std::string& text) {
  Fnv hash;
  hash.add(text.data(), text.size());
  return hash.hex();
}

// [count, FNV-1a 64 of the ids] as the wordpiece and deepseek goldens store it.
inline nlohmann::json ids_hash(const std::vector<int32_t>& ids) { return nlohmann::json::array({ids.size(), ids_fnv(ids)}); }

// [count, FNV-1a 64 of the strings, each with its zero byte] (words, pre-tokenizer pieces).
inline nlohmann::json strings_hash(const std::vector<std::string>& strings) {
  Fnv hash;
  for (const std::string& s : strings) hash.add(s.c_str(), s.size() + 1);
  return nlohmann::json::array({strings.size(), hash.hex()});
}

inline std::vector<int32_t> encode(const mt::text::Tokenizer& tokenizer, const std::string& text, bool allow_special) {
  std::vector<int32_t> ids;
  tokenizer.encode(text, ids, allow_special);
  return ids;
}

// The 10,000 random Unicode strings of tests/golden/tokenizer/random_00..03.jsonl, in order.
inline std::vector<std::string> random_texts() {
  std::vector<std::string> texts;
  for (int part = 0; part < 4; ++part) {
    char name[32];
    std::snprintf(name, sizeof name, "random_%02d.jsonl", part);
    for (const auto& record : read_jsonl(kTokenizerGoldenDir / name)) texts.push_back(record["text"]);
  }
  return texts;
}

// Where a corpus file the goldens name lives: the demo corpus in data/demo, the rest in data/corpus.
inline fs::path corpus_path(const std::string& name) {
  return name == "tinyshakespeare.txt" ? kDataDir / "demo" / name : kDataDir / "corpus" / name;
}

// The whole text of a corpus file, read once.
inline const std::string& whole_file(const std::string& set) {
  static std::map<std::string, std::string> cache;
  auto it = cache.find(set);
  if (it != cache.end()) return it->second;
  return cache.emplace(set, read_file(corpus_path(set))).first->second;
}

// The texts a block record counts in: a random_NN set's strings, or a corpus file's lines.
inline const std::vector<std::string>& texts_of(const std::string& set) {
  static std::map<std::string, std::vector<std::string>> cache;
  auto it = cache.find(set);
  if (it != cache.end()) return it->second;
  std::vector<std::string> texts;
  if (set.starts_with("random_")) {
    for (const auto& record : read_jsonl(kTokenizerGoldenDir / (set + ".jsonl"))) texts.push_back(record["text"]);
  } else {
    const std::string& text = whole_file(set);
    size_t begin = 0;
    for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
      texts.push_back(text.substr(begin, end - begin));
    }
    texts.push_back(text.substr(begin));
  }
  return cache.emplace(set, std::move(texts)).first->second;
}

// Every "edge_cases" record of `model`: the ids and the decode equal. Returns how many were checked.
inline int check_edge_cases(const mt::text::Tokenizer& tokenizer, const std::vector<nlohmann::json>& records,
                            const std::string& model, bool allow_special) {
  int checked = 0;
  for (const auto& record : records) {
    if (record["model"] != model || record["set"] != "edge_cases") continue;
    const std::string text = record["text"];
    const auto ids = encode(tokenizer, text, allow_special);
    EXPECT_EQ(ids, record["ids"].get<std::vector<int32_t>>()) << "edge case " << record["index"] << ": " << text;
    EXPECT_EQ(tokenizer.decode(ids), record["decoded"].get<std::string>()) << "edge case " << record["index"];
    ++checked;
  }
  return checked;
}

// Every "decode" record of `model`: the decode of its random ids equal. Returns how many were checked.
inline int check_decodes(const mt::text::Tokenizer& tokenizer, const std::vector<nlohmann::json>& records,
                         const std::string& model) {
  int checked = 0;
  for (const auto& record : records) {
    if (record["model"] != model || record["set"] != "decode") continue;
    const auto ids = record["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer.decode(ids), record["decoded"].get<std::string>()) << "sequence " << record["index"];
    ++checked;
  }
  return checked;
}

struct BlockCounts {
  int blocks = 0;  // records of `count` texts from `first`
  int wholes = 0;  // records of a whole corpus file (first == -1)
};

// Every hashed record of `model` (ids_fnv): the token count, the FNV-1a 64 of the counted ids and of
// the decodes (each followed by a 0xff byte) over its block of texts or its whole file equal.
inline BlockCounts check_hashed_blocks(const mt::text::Tokenizer& tokenizer, const std::vector<nlohmann::json>& records,
                                       const std::string& model, bool allow_special) {
  BlockCounts counts;
  for (const auto& record : records) {
    if (record["model"] != model || !record.contains("ids_fnv")) continue;
    const std::string set = record["set"];
    const int64_t first = record["first"];
    std::vector<std::string> block;
    if (first < 0) {
      block.push_back(whole_file(set));
      ++counts.wholes;
    } else {
      const auto& texts = texts_of(set);
      const auto count = record["count"].get<size_t>();
      EXPECT_LE(first + count, texts.size()) << set;
      if (first + count > texts.size()) continue;
      block.assign(texts.begin() + first, texts.begin() + first + static_cast<int64_t>(count));
      ++counts.blocks;
    }
    Fnv ids_hash, text_hash;
    int64_t tokens = 0;
    for (const std::string& text : block) {
      const auto ids = encode(tokenizer, text, allow_special);
      tokens += static_cast<int64_t>(ids.size());
      ids_hash.add_counted_ids(ids);
      const std::string decoded = tokenizer.decode(ids);
      text_hash.add(decoded.data(), decoded.size());
      text_hash.add("\xff", 1);
    }
    EXPECT_EQ(tokens, record["tokens"].get<int64_t>()) << set << " from " << first;
    EXPECT_EQ(ids_hash.hex(), record["ids_fnv"].get<std::string>()) << set << " from " << first;
    EXPECT_EQ(text_hash.hex(), record["decoded_fnv"].get<std::string>()) << set << " decoded, from " << first;
  }
  return counts;
}

}  // namespace mt::testing::golden
