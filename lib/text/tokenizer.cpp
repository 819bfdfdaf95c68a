// Loading and running the byte-level BPE tokenizers of text/tokenizer.h: file parsers for GPT-2's
// encoder.json + vocab.bpe, tiktoken rank files, Megatron's TikTokenizer JSON vocabulary and Hugging
// Face tokenizer.json, all feeding one BpeModel (text/bpe_model.h) behind one Tokenizer class.
// Tested in tests/unit/text/test_tokenizer.cpp and tests/unit/text/test_tokenizer_golden.cpp.
#include "text/tokenizer.h"

#include <algorithm>
#include <functional>
#include <array>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "core/input_file.h"
#include "text/bpe_model.h"
#include "text/hf_sentencepiece.h"
#include "text/pretokenize.h"
#include "text/sentencepiece_tokenizer.h"
#include "text/split_pretokenizer.h"
#include "text/unicode.h"
#include "text/wordpiece.h"

namespace mt::text {

namespace {

using nlohmann::json;

json parse_json(const std::string& path, const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(path, std::string("not valid JSON: ") + e.what());
  }
}

// FNV-1a 64 over a sequence of byte strings (each followed by its length, so boundaries count).
class Fnv1a64 {
 public:
  void add(std::string_view bytes) {
    for (unsigned char byte : bytes) mix(byte);
    uint64_t length = bytes.size();
    for (int i = 0; i < 8; ++i) mix(static_cast<unsigned char>(length >> (8 * i)));
  }
  std::string hex() const {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string text = "fnv1a64:";
    for (int shift = 60; shift >= 0; shift -= 4) text.push_back(kDigits[(state_ >> shift) & 0xF]);
    return text;
  }

 private:
  void mix(unsigned char byte) {
    state_ ^= byte;
    state_ *= 0x100000001B3ull;
  }
  uint64_t state_ = 0xCBF29CE484222325ull;
};

// Standard base64 with '=' padding (tiktoken files); nullopt when malformed.
std::optional<std::string> base64_decode(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  size_t padding = 0;
  while (padding < 2 && text[text.size() - 1 - padding] == '=') ++padding;
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (size_t i = 0; i < text.size() - padding; ++i) {
    int v = value(text[i]);
    if (v < 0) return std::nullopt;
    buffer = (buffer << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xFF));
    }
  }
  if ((buffer & ((1u << bits) - 1)) != 0) return std::nullopt;
  return out;
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for U+0100 onwards
// in byte order. Token strings of encoder.json / tokenizer.json are written in this alphabet.
struct ByteLevelAlphabet {
  std::unordered_map<char32_t, uint8_t> byte_of_char;

  ByteLevelAlphabet() {
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      char32_t c = printable(b) ? static_cast<char32_t>(b) : next_extra++;
      byte_of_char[c] = static_cast<uint8_t>(b);
    }
  }
  // The bytes a token string of the alphabet stands for; nullopt when a character is outside it.
  std::optional<std::string> decode(std::string_view token) const {
    std::string bytes;
    size_t pos = 0;
    while (pos < token.size()) {
      auto it = byte_of_char.find(decode_utf8(token, pos));
      if (it == byte_of_char.end()) return std::nullopt;
      bytes.push_back(static_cast<char>(it->second));
    }
    return bytes;
  }
};

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

struct SpecialToken {
  std::string text;
  int32_t id;
};

// Everything a loader produces; BpeTokenizer runs it.
struct TokenizerSpec {
  std::string name;
  std::string hash;
  PretokenizePattern pattern = PretokenizePattern::gpt2;
  bool deepseek_v3_splits = false;  // DeepSeek-V3's Split sequence (text/split_pretokenizer.h) instead of `pattern`
  bool whole_piece_lookup = false;
  int64_t vocab_size = 0;
  std::optional<int32_t> eod;
  std::vector<SpecialToken> specials;
  std::vector<int32_t> sequence_prefix, sequence_suffix;  // a post-processor's template around a sequence
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(TokenizerSpec spec, BpeModel model) : spec_(std::move(spec)), model_(std::move(model)) {
    special_of_id_.assign(static_cast<size_t>(spec_.vocab_size), -1);
    for (size_t i = 0; i < spec_.specials.size(); ++i) {
      const SpecialToken& special = spec_.specials[i];
      if (special.id < 0 || special.id >= spec_.vocab_size) {
        throw Error(spec_.name, "special token " + special.text + " has id " + std::to_string(special.id) +
                                    " outside the vocabulary");
      }
      special_of_id_[special.id] = static_cast<int32_t>(i);
      if (!special.text.empty()) specials_by_first_byte_[static_cast<unsigned char>(special.text[0])].push_back(i);
    }
    for (const auto* ids : {&spec_.sequence_prefix, &spec_.sequence_suffix}) {
      for (int32_t id : *ids) {
        if (id < 0 || id >= spec_.vocab_size || (special_of_id_[id] < 0 && !model_.has_id(id))) {
          throw Error(spec_.name, "the post-processor's template uses id " + std::to_string(id) +
                                      ", which is no token of the vocabulary");
        }
      }
    }
    // Longest first, so a special token that extends another wins at the same position.
    for (auto& candidates : specials_by_first_byte_) {
      std::stable_sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
        return spec_.specials[a].text.size() > spec_.specials[b].text.size();
      });
    }
  }

  void encode(std::string_view text, std::vector<int32_t>& out, bool allow_special) const override {
    if (!allow_special || spec_.specials.empty()) {
      encode_ordinary(text, out);
      return;
    }
    size_t start = 0;
    size_t pos = 0;
    while (pos < text.size()) {
      const SpecialToken* found = nullptr;
      for (size_t index : specials_by_first_byte_[static_cast<unsigned char>(text[pos])]) {
        const SpecialToken& special = spec_.specials[index];
        if (text.substr(pos, special.text.size()) == special.text) {
          found = &special;
          break;
        }
      }
      if (found == nullptr) {
        ++pos;
        continue;
      }
      encode_ordinary(text.substr(start, pos - start), out);
      out.push_back(found->id);
      pos += found->text.size();
      start = pos;
    }
    encode_ordinary(text.substr(start), out);
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string bytes;
    for (int32_t id : ids) append_token_bytes(id, bytes);
    if (is_valid_utf8(bytes)) return bytes;
    std::string text;
    sanitize_utf8(bytes, text);
    return text;
  }

  std::string token_bytes(int32_t id) const override {
    std::string bytes;
    append_token_bytes(id, bytes);
    return bytes;
  }

  int64_t vocab_size() const override { return spec_.vocab_size; }
  std::optional<int32_t> eod_id() const override { return spec_.eod; }
  std::optional<int32_t> special_token_id(std::string_view text) const override {
    for (const SpecialToken& special : spec_.specials) {
      if (special.text == text) return special.id;
    }
    return std::nullopt;
  }
  std::string name() const override { return spec_.name; }
  std::string hash() const override { return spec_.hash; }
  std::span<const int32_t> sequence_prefix() const override { return spec_.sequence_prefix; }
  std::span<const int32_t> sequence_suffix() const override { return spec_.sequence_suffix; }

 private:
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
    if (spec_.deepseek_v3_splits) {
      deepseek_v3_pretokenize(text, [&](std::string_view piece) { model_.encode_piece(piece, spec_.whole_piece_lookup, out); });
      return;
    }
    size_t pos = 0;
    while (pos < text.size()) {
      size_t length = next_piece_length(spec_.pattern, text, pos);
      model_.encode_piece(text.substr(pos, length), spec_.whole_piece_lookup, out);
      pos += length;
    }
  }

  void append_token_bytes(int32_t id, std::string& bytes) const {
    if (id >= 0 && id < spec_.vocab_size && special_of_id_[id] >= 0) {
      bytes += spec_.specials[special_of_id_[id]].text;
    } else if (model_.has_id(id)) {
      bytes += model_.bytes_of(id);
    } else if (id < 0 || id >= spec_.vocab_size) {
      throw Error(spec_.name,
                  "token id " + std::to_string(id) + " outside [0, " + std::to_string(spec_.vocab_size) + ")");
    } else {
      throw Error(spec_.name, "token id " + std::to_string(id) + " is not assigned to any token");
    }
  }

  TokenizerSpec spec_;
  BpeModel model_;
  std::vector<int32_t> special_of_id_;
  std::array<std::vector<size_t>, 256> specials_by_first_byte_;  // indices into spec_.specials
};

std::unique_ptr<Tokenizer> make_tokenizer(TokenizerSpec spec, BpeModel model) {
  return std::make_unique<BpeTokenizer>(std::move(spec), std::move(model));
}

void require_option(const std::string& value, const std::string& flag, const std::string& type) {
  if (value.empty()) throw UsageError(flag, type + " needs this file");
}

// ---- GPT2BPETokenizer: encoder.json + vocab.bpe ------------------------------------------------

// Token text -> id, looked up by string_view without a temporary string (every process loads the
// tokenizer, and a vocabulary's 10^5 merges look up three tokens each).
struct TextHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
using TokenIds = std::unordered_map<std::string, int32_t, TextHash, std::equal_to<>>;

// Reads a token -> id object of byte-level strings into `model`; returns the largest id.
int32_t add_byte_level_vocab(const json& vocab, const std::string& path, BpeModel& model, TokenIds& id_of_text) {
  if (!vocab.is_object()) throw Error(path, "the vocabulary is not a JSON object of token -> id");
  int32_t max_id = -1;
  for (const auto& [text, value] : vocab.items()) {
    if (!value.is_number_integer()) throw Error(path, "token " + text + " has no integer id");
    auto id = value.get<int64_t>();
    if (id < 0 || id > INT32_MAX)
      throw Error(path, "token " + text + " has id " + std::to_string(id) + " out of range");
    auto bytes = byte_level_alphabet().decode(text);
    if (!bytes) throw Error(path, "token " + text + " is not in the byte-level alphabet (not a byte-level BPE)");
    model.add_token(static_cast<int32_t>(id), *bytes, path);
    id_of_text.emplace(text, static_cast<int32_t>(id));
    max_id = std::max(max_id, static_cast<int32_t>(id));
  }
  model.index_tokens(path);
  return max_id;
}

// `where()` names the merge in an error (built only then: a vocabulary has 10^5 merges).
// Returns the merged token's id.
template <class Where>
int32_t add_merge_line(std::string_view left, std::string_view right, uint32_t priority, Where where,
                    const TokenIds& id_of_text, BpeModel& model) {
  auto find = [&](std::string_view text) {
    auto it = id_of_text.find(text);
    if (it == id_of_text.end()) throw Error(where(), "merge refers to unknown token " + std::string(text));
    return it->second;
  };
  int32_t left_id = find(left);
  int32_t right_id = find(right);
  thread_local std::string merged;  // reused: no allocation per merge
  merged.assign(left).append(right);
  int32_t merged_id = find(merged);
  model.add_merge(left_id, right_id, priority, merged_id);
  return merged_id;
}

// The tokens of a byte-level vocabulary that its merges never make (neither one byte, a special
// token, nor a merge's result), which BPE can never produce: "" when there is none, else "<N>
// merges, so <M> of the <T> tokens of <vocabulary> are never made (the first: '<text>', id <id>)".
std::string tokens_never_made(const TokenIds& id_of_text,
                              const std::vector<uint8_t>& made_by_merge, uint32_t merge_count,
                              const std::string& vocabulary, const std::function<bool(const std::string&)>& special) {
  int64_t unreachable = 0;
  const std::string* first_text = nullptr;  // the unreachable token of the smallest id
  int32_t first_id = INT32_MAX;
  for (const auto& [text, id] : id_of_text) {
    if (made_by_merge[static_cast<size_t>(id)] || special(text) || byte_level_alphabet().decode(text)->size() == 1) {
      continue;
    }
    ++unreachable;
    if (id < first_id) {
      first_id = id;
      first_text = &text;
    }
  }
  if (unreachable == 0) return "";
  const std::string merges = merge_count == 0 ? "no merges" : std::to_string(merge_count) + " merges";
  return merges + ", so " + std::to_string(unreachable) + " of the " + std::to_string(id_of_text.size()) +
         " tokens of " + vocabulary + " are never made (the first: '" + *first_text + "', id " +
         std::to_string(first_id) + ")";
}

// GPT-2's two files describe one vocabulary: encoder.json holds ids 0..n-1 with no hole, and
// every token is one of the 256 bytes, "<|endoftext|>", or the result of a merge in vocab.bpe
// (GPT-2 has 256 + 50000 + 1). A token that no merge makes can never be produced: vocab.bpe is
// truncated (an empty or cut file) or belongs to another vocabulary.
void check_gpt2_files(const TokenizerOptions& options, const TokenIds& id_of_text,
                      int32_t max_id, const std::vector<uint8_t>& made_by_merge, uint32_t merge_count) {
  const auto token_count = static_cast<int64_t>(id_of_text.size());
  if (token_count != int64_t{max_id} + 1) {
    std::vector<uint8_t> present(static_cast<size_t>(max_id) + 1, 0);
    for (const auto& entry : id_of_text) present[static_cast<size_t>(entry.second)] = 1;
    const auto hole = std::find(present.begin(), present.end(), 0) - present.begin();
    throw Error(options.vocab_file, "ids are not 0.." + std::to_string(token_count - 1) + " without holes: " +
                                        std::to_string(token_count) + " tokens, largest id " + std::to_string(max_id) +
                                        ", no token has id " + std::to_string(hole) + " (truncated or edited?)");
  }
  const std::string never_made = tokens_never_made(id_of_text, made_by_merge, merge_count, options.vocab_file,
                                                   [](const std::string& text) { return text == "<|endoftext|>"; });
  if (never_made.empty()) return;
  throw Error(options.merge_file, never_made + ": the file is truncated or belongs to another vocabulary");
}

std::unique_ptr<Tokenizer> load_gpt2(const TokenizerOptions& options) {
  require_option(options.vocab_file, "--vocab-file", "GPT2BPETokenizer");
  require_option(options.merge_file, "--merge-file", "GPT2BPETokenizer");
  std::string vocab_text = read_input_file(options.vocab_file, "--vocab-file");
  std::string merges_text = read_input_file(options.merge_file, "--merge-file");
  BpeModel model;
  TokenIds id_of_text;
  int32_t max_id =
      add_byte_level_vocab(parse_json(options.vocab_file, vocab_text), options.vocab_file, model, id_of_text);

  std::vector<uint8_t> made_by_merge(static_cast<size_t>(max_id) + 1, 0);
  std::istringstream lines(merges_text);
  std::string line;
  uint32_t priority = 0;
  size_t line_number = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF files, as Python's line split
    if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
    size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      throw Error(options.merge_file, "line " + std::to_string(line_number) + ": not two tokens separated by a space");
    }
    auto where = [&] { return options.merge_file + ": line " + std::to_string(line_number); };
    const int32_t merged = add_merge_line(std::string_view(line).substr(0, space), std::string_view(line).substr(space + 1),
                                          priority++, where, id_of_text, model);
    made_by_merge[static_cast<size_t>(merged)] = 1;
  }
  model.finish(options.vocab_file);
  check_gpt2_files(options, id_of_text, max_id, made_by_merge, priority);
  model.find_self_merging_tokens();

  TokenizerSpec spec;
  spec.name = "GPT2BPETokenizer";
  spec.pattern = PretokenizePattern::gpt2;
  spec.vocab_size = int64_t{max_id} + 1;
  auto eod = id_of_text.find("<|endoftext|>");
  if (eod != id_of_text.end()) {
    spec.eod = eod->second;
    spec.specials.push_back({"<|endoftext|>", eod->second});
  }
  Fnv1a64 hash;
  hash.add(spec.name);
  hash.add(vocab_text);
  hash.add(merges_text);
  spec.hash = hash.hex();
  return make_tokenizer(std::move(spec), std::move(model));
}

// ---- TikTokenizer: tiktoken rank files and Megatron's JSON vocabulary -------------------------

std::optional<PretokenizePattern> tiktoken_pattern_option(const std::string& value) {
  if (value.empty()) return std::nullopt;
  if (value == "v1") return PretokenizePattern::megatron_v1;
  if (value == "v2") return PretokenizePattern::megatron_v2;
  if (value == "gpt2") return PretokenizePattern::gpt2;
  if (value == "cl100k") return PretokenizePattern::cl100k;
  throw UsageError("--tiktoken-pattern", "expected v1, v2, gpt2 or cl100k, got " + value);
}

std::vector<SpecialToken> llama3_special_tokens() {
  std::vector<std::string> names = {"<|begin_of_text|>",
                                    "<|end_of_text|>",
                                    "<|reserved_special_token_0|>",
                                    "<|reserved_special_token_1|>",
                                    "<|reserved_special_token_2|>",
                                    "<|reserved_special_token_3|>",
                                    "<|start_header_id|>",
                                    "<|end_header_id|>",
                                    "<|reserved_special_token_4|>",
                                    "<|eot_id|>"};
  for (int i = 5; i < 251; ++i) names.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  std::vector<SpecialToken> specials;
  for (size_t i = 0; i < names.size(); ++i) specials.push_back({names[i], static_cast<int32_t>(128000 + i)});
  return specials;
}

// The tiktoken encodings mt recognises. A rank file is recognised by its first ranks (a
// fingerprint of ranks 0..kFingerprintRanks-1, computed from the files pinned in
// data/tokenizers/SOURCES.md) and by its rank count; a file that starts like one of them but has
// fewer ranks is a truncated copy, not a custom vocabulary.
constexpr int32_t kFingerprintRanks = 512;

struct KnownRankFile {
  const char* encoding;
  const char* fingerprint;  // Fnv1a64 over the bytes of ranks 0..kFingerprintRanks-1
  int64_t rank_count;
};

constexpr KnownRankFile kKnownRankFiles[] = {
    {"r50k_base", "fnv1a64:0d54ca93212ef7c7", 50256},
    {"cl100k_base", "fnv1a64:55f58da5988686bc", 100256},
    {"llama3", "fnv1a64:55f58da5988686bc", 128000},  // LLaMA-3's first 100256 ranks are cl100k's
};

std::string rank_file_fingerprint(const BpeModel& model) {
  Fnv1a64 hash;
  for (int32_t rank = 0; rank < kFingerprintRanks; ++rank) hash.add(model.bytes_of(rank));
  return hash.hex();
}

// The encoding of a complete rank file ("custom" when it starts like none of the known ones or
// extends one); throws naming the file when it starts like a known encoding but stops short.
std::string recognise_rank_file(const BpeModel& model, int64_t rank_count, const std::string& path) {
  if (rank_count < kFingerprintRanks) return "custom";
  const std::string fingerprint = rank_file_fingerprint(model);
  std::string shorter_than;
  for (const KnownRankFile& known : kKnownRankFiles) {
    if (known.fingerprint != fingerprint) continue;
    if (known.rank_count == rank_count) return known.encoding;
    if (known.rank_count > rank_count) {
      shorter_than += (shorter_than.empty() ? "" : " or ") + std::string(known.encoding) + " (" +
                      std::to_string(known.rank_count) + ")";
    }
  }
  if (shorter_than.empty()) return "custom";
  throw Error(path, "truncated: " + std::to_string(rank_count) + " ranks, but a file starting with these ranks is " +
                        shorter_than);
}

std::unique_ptr<Tokenizer> load_tiktoken_ranks(const TokenizerOptions& options, const std::string& text) {
  const std::string& path = options.tokenizer_model;
  if (const size_t first = text.find_first_not_of(" \t\r\n"); first != std::string::npos && text[first] == '{') {
    throw Error(path, "is JSON, not a tiktoken rank file (`base64 rank` lines); a Hugging Face tokenizer.json "
                      "loads with --tokenizer-type HuggingFaceTokenizer");
  }
  const bool ends_with_newline = !text.empty() && text.back() == '\n';
  const auto line_count = static_cast<size_t>(std::count(text.begin(), text.end(), '\n') + (ends_with_newline ? 0 : 1));
  // Ranks are 0..n-1 for n tokens, so a rank is always below the number of lines; line_of_rank
  // (0: not seen) finds a rank given twice, the mark of a line cut short.
  std::vector<uint32_t> line_of_rank(line_count, 0);
  BpeModel model;
  std::istringstream lines(text);
  std::string line;
  size_t line_number = 0;
  int64_t rank_count = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF files, as Python's line split
    if (line.empty()) continue;
    auto fail = [&](const std::string& why) {
      const bool cut = line_number == line_count && !ends_with_newline;
      throw Error(path + ": line " + std::to_string(line_number),
                  why + (cut ? " (the last line has no newline: the file looks cut mid-line)"
                             : " (a truncated or malformed line)"));
    };
    size_t space = line.find(' ');
    if (space == std::string::npos) fail("expected `base64 rank`, got '" + line.substr(0, 60) + "'");
    auto bytes = base64_decode(std::string_view(line).substr(0, space));
    if (!bytes) fail("bad base64 token '" + line.substr(0, std::min<size_t>(space, 60)) + "'");
    std::string rank_text = line.substr(space + 1);
    char* end = nullptr;
    errno = 0;
    long long rank = std::strtoll(rank_text.c_str(), &end, 10);
    if (rank_text.empty() || *end != '\0' || errno != 0 || rank < 0) fail("bad rank '" + rank_text.substr(0, 20) + "'");
    if (static_cast<size_t>(rank) >= line_count) {
      fail("rank " + rank_text + ", but the file has " + std::to_string(line_count) +
           " lines, so its ranks cannot be 0, 1, 2, ... without holes");
    }
    if (line_of_rank[rank] != 0) {
      fail("rank " + rank_text + " was already given on line " + std::to_string(line_of_rank[rank]));
    }
    line_of_rank[rank] = static_cast<uint32_t>(line_number);
    model.add_token(static_cast<int32_t>(rank), *bytes, path);
    ++rank_count;
  }
  if (rank_count == 0) throw Error(path, "empty: a tiktoken rank file has one `base64 rank` line per token");
  // No rank repeats and every rank is below the line count; ranks 0..rank_count-1 must all be there.
  const auto hole = std::find(line_of_rank.begin(), line_of_rank.begin() + rank_count, 0u) - line_of_rank.begin();
  if (hole < rank_count) {
    throw Error(path, "ranks are not 0.." + std::to_string(rank_count - 1) + " without holes: rank " +
                          std::to_string(hole) + " is missing");
  }
  model.index_tokens(path);
  model.add_merges_from_vocabulary([](int32_t id) { return static_cast<uint32_t>(id); });
  model.finish(path);

  TokenizerSpec spec;
  spec.whole_piece_lookup = true;
  const std::string encoding = recognise_rank_file(model, rank_count, path);
  if (encoding == "r50k_base") {
    spec.pattern = PretokenizePattern::gpt2;
    spec.specials = {{"<|endoftext|>", 50256}};
    spec.eod = 50256;
    spec.vocab_size = 50257;
  } else if (encoding == "cl100k_base") {
    spec.pattern = PretokenizePattern::cl100k;
    spec.specials = {{"<|endoftext|>", 100257},
                     {"<|fim_prefix|>", 100258},
                     {"<|fim_middle|>", 100259},
                     {"<|fim_suffix|>", 100260},
                     {"<|endofprompt|>", 100276}};
    spec.eod = 100257;
    spec.vocab_size = 100277;
  } else if (encoding == "llama3") {
    spec.pattern = PretokenizePattern::cl100k;
    spec.specials = llama3_special_tokens();
    spec.eod = 128001;
    spec.vocab_size = 128256;
  } else {
    spec.pattern = PretokenizePattern::cl100k;
    spec.vocab_size = rank_count;
  }
  if (auto pattern = tiktoken_pattern_option(options.tiktoken_pattern)) spec.pattern = *pattern;
  spec.name = "TikTokenizer:" + encoding;
  Fnv1a64 hash;
  hash.add("TikTokenizer");
  hash.add(text);
  hash.add(pattern_regex(spec.pattern));
  spec.hash = hash.hex();
  return make_tokenizer(std::move(spec), std::move(model));
}

// Megatron's CustomTikTokenizer (megatron/training/tokenizer/tokenizer.py): a JSON list of
// {rank, token_bytes (base64), token_str}, rank i at position i, the first 256 the single bytes;
// special tokens take ids 0 .. num_special - 1 ("<unk>", "<s>", "</s>", then "<SPECIAL_i>"), and
// rank r becomes id r + num_special. eod (and eos) is "</s>" = 2, bos "<s>" = 1.
std::unique_ptr<Tokenizer> load_megatron_tiktoken_json(const TokenizerOptions& options, const std::string& text) {
  const std::string& path = options.tokenizer_model;
  const int num_special = options.tiktoken_num_special_tokens;
  if (num_special < 3) {
    throw UsageError("--tiktoken-num-special-tokens", "Megatron's TikTokenizer needs at least 3 (<unk>, <s>, </s>)");
  }
  json vocab = parse_json(path, text);
  if (!vocab.is_array()) throw Error(path, "expected a JSON list of {rank, token_bytes, token_str}");
  BpeModel model;
  for (size_t i = 0; i < vocab.size(); ++i) {
    const json& entry = vocab[i];
    auto where = path + ": entry " + std::to_string(i);
    if (!entry.is_object() || entry.size() != 3 || !entry.contains("rank") || !entry.contains("token_bytes") ||
        !entry.contains("token_str")) {
      throw Error(where, "expected exactly the keys rank, token_bytes, token_str");
    }
    if (!entry["rank"].is_number_integer() || entry["rank"].get<int64_t>() != static_cast<int64_t>(i)) {
      throw Error(where, "rank is not " + std::to_string(i));
    }
    if (!entry["token_bytes"].is_string()) throw Error(where, "token_bytes is not a string");
    auto bytes = base64_decode(entry["token_bytes"].get<std::string>());
    if (!bytes) throw Error(where, "bad base64 token_bytes");
    if (i < 256 && *bytes != std::string(1, static_cast<char>(i))) throw Error(where, "rank below 256 is not its byte");
    model.add_token(static_cast<int32_t>(i) + num_special, *bytes, path);
  }
  model.index_tokens(path);
  model.add_merges_from_vocabulary([num_special](int32_t id) { return static_cast<uint32_t>(id - num_special); });
  model.finish(path);

  TokenizerSpec spec;
  spec.name = "TikTokenizer:megatron";
  spec.whole_piece_lookup = true;
  spec.pattern = tiktoken_pattern_option(options.tiktoken_pattern).value_or(PretokenizePattern::megatron_v2);
  spec.vocab_size = int64_t{num_special} + static_cast<int64_t>(vocab.size());
  std::vector<std::string> names = {"<unk>", "<s>", "</s>"};
  for (int i = 3; i < num_special; ++i) names.push_back("<SPECIAL_" + std::to_string(i) + ">");
  for (int i = 0; i < num_special; ++i) spec.specials.push_back({names[i], i});
  spec.eod = 2;
  Fnv1a64 hash;
  hash.add("TikTokenizer:megatron");
  hash.add(text);
  hash.add(pattern_regex(spec.pattern));
  hash.add(std::to_string(num_special));
  spec.hash = hash.hex();
  return make_tokenizer(std::move(spec), std::move(model));
}

std::unique_ptr<Tokenizer> load_tiktoken(const TokenizerOptions& options) {
  require_option(options.tokenizer_model, "--tokenizer-model", "TikTokenizer");
  std::string text = read_input_file(options.tokenizer_model, "--tokenizer-model");
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') return load_megatron_tiktoken_json(options, text);
  return load_tiktoken_ranks(options, text);
}

// ---- HuggingFaceTokenizer: tokenizer.json ------------------------------------------------------

const json* member(const json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

bool is_false_or_null(const json& object, const char* key) {
  const json* value = member(object, key);
  return value == nullptr || (value->is_boolean() && !value->get<bool>());
}

bool is_empty_or_null(const json& object, const char* key) {
  const json* value = member(object, key);
  return value == nullptr || (value->is_string() && value->get<std::string>().empty());
}

// A tokenizer.json component's "type" ("" when it has none).
std::string type_of(const json& node) {
  const json* type = member(node, "type");
  return type != nullptr && type->is_string() ? type->get<std::string>() : std::string();
}

// The pattern of a byte-level pre-tokenizer: ByteLevel(use_regex = true) is GPT-2's, or a
// Sequence of Split(Regex, Isolated) and ByteLevel(use_regex = false).
PretokenizePattern hf_pattern(const json& pre_tokenizer, const std::string& path) {
  auto check_byte_level = [&](const json& node, bool expect_regex) {
    if (!is_false_or_null(node, "add_prefix_space")) {
      throw Error(path, "ByteLevel pre-tokenizer with add_prefix_space is not supported");
    }
    const json* use_regex = member(node, "use_regex");
    bool regex = use_regex == nullptr || (use_regex->is_boolean() && use_regex->get<bool>());
    if (regex != expect_regex) throw Error(path, "unsupported ByteLevel use_regex setting in this pre-tokenizer");
  };
  std::string type = type_of(pre_tokenizer);
  if (type == "ByteLevel") {
    check_byte_level(pre_tokenizer, true);
    return PretokenizePattern::gpt2;
  }
  const json* steps = member(pre_tokenizer, "pretokenizers");
  if (type == "Sequence" && steps != nullptr && steps->is_array() && steps->size() == 2 &&
      type_of((*steps)[0]) == "Split" && type_of((*steps)[1]) == "ByteLevel") {
    const json& split = (*steps)[0];
    const json* regex = member(split, "pattern") ? member(*member(split, "pattern"), "Regex") : nullptr;
    const json* behavior = member(split, "behavior");
    if (regex == nullptr || !regex->is_string()) throw Error(path, "Split pre-tokenizer without a Regex pattern");
    if (behavior == nullptr || *behavior != "Isolated" || !is_false_or_null(split, "invert")) {
      throw Error(path, "Split pre-tokenizer must be behavior Isolated, invert false");
    }
    check_byte_level((*steps)[1], false);
    try {
      return pattern_from_regex(regex->get<std::string>());
    } catch (const Error& e) {
      throw Error(path, e.what());
    }
  }
  throw Error(path, "pre-tokenizer is not byte-level (ByteLevel, or Split(Regex) + ByteLevel): " +
                        pre_tokenizer.dump().substr(0, 200));
}

// True for DeepSeek-V3's pre-tokenizer: a Sequence of three Split(Regex, Isolated) with its exact
// regexes, then ByteLevel(use_regex = false); a four-step sequence of that shape with another
// regex is refused naming it.
bool is_deepseek_v3_splits(const json& pre_tokenizer, const std::string& path) {
  const json* steps = member(pre_tokenizer, "pretokenizers");
  if (type_of(pre_tokenizer) != "Sequence" || steps == nullptr || !steps->is_array() || steps->size() != 4) return false;
  const auto& regexes = deepseek_v3_split_regexes();
  for (size_t i = 0; i < regexes.size(); ++i) {
    const json& split = (*steps)[i];
    if (type_of(split) != "Split") return false;
    const json* regex = member(split, "pattern") ? member(*member(split, "pattern"), "Regex") : nullptr;
    const json* behavior = member(split, "behavior");
    if (regex == nullptr || !regex->is_string()) throw Error(path, "Split pre-tokenizer without a Regex pattern");
    if (behavior == nullptr || *behavior != "Isolated" || !is_false_or_null(split, "invert")) {
      throw Error(path, "Split pre-tokenizer must be behavior Isolated, invert false");
    }
    if (regex->get<std::string>() != regexes[i]) {
      throw Error(path, "Split pre-tokenizer " + std::to_string(i + 1) + " of 3 has the regex " + regex->dump() +
                            ", not DeepSeek-V3's " + nlohmann::json(regexes[i]).dump() +
                            " (a sequence of three Splits is supported only as DeepSeek-V3 writes it)");
    }
  }
  const json& byte_level = (*steps)[3];
  const json* use_regex = member(byte_level, "use_regex");
  if (type_of(byte_level) != "ByteLevel" || !is_false_or_null(byte_level, "add_prefix_space") ||
      use_regex == nullptr || *use_regex != false) {
    throw Error(path, "DeepSeek-V3's Split sequence must end with ByteLevel(add_prefix_space false, use_regex false)");
  }
  return true;
}

// The ids a TemplateProcessing post-processor puts around a single sequence: its "single"
// template is a list of SpecialToken pieces (each expands to the "ids" of its entry in
// "special_tokens", in order) and exactly one Sequence "A" (the text's ids).
void add_single_template(const json& processor, const std::string& path, TokenizerSpec& spec) {
  const std::string where = path + ": post-processor TemplateProcessing";
  const json* single = member(processor, "single");
  const json* special_tokens = member(processor, "special_tokens");
  if (single == nullptr || !single->is_array()) throw Error(where, "has no single template");
  bool seen_sequence = false;
  for (const json& piece : *single) {
    if (const json* sequence = member(piece, "Sequence")) {
      const json* id = member(*sequence, "id");
      if (id == nullptr || *id != "A" || seen_sequence) {
        throw Error(where, "the single template must hold sequence A once: " + single->dump().substr(0, 200));
      }
      seen_sequence = true;
      continue;
    }
    const json* special = member(piece, "SpecialToken");
    const json* name = special != nullptr ? member(*special, "id") : nullptr;
    if (name == nullptr || !name->is_string()) {
      throw Error(where, "a piece of the single template is neither a Sequence nor a SpecialToken: " +
                             piece.dump().substr(0, 200));
    }
    const json* entry = special_tokens != nullptr ? member(*special_tokens, name->get<std::string>().c_str()) : nullptr;
    const json* ids = entry != nullptr ? member(*entry, "ids") : nullptr;
    if (ids == nullptr || !ids->is_array()) {
      throw Error(where, "special token " + name->dump() + " has no entry with ids in special_tokens");
    }
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        throw Error(where, "special token " + name->dump() + " has a bad id " + id.dump());
      }
      (seen_sequence ? spec.sequence_suffix : spec.sequence_prefix).push_back(id.get<int32_t>());
    }
  }
  if (!seen_sequence) throw Error(where, "the single template has no sequence A");
}

// The post-processor: none, ByteLevel (it moves offsets, never ids), TemplateProcessing, or a
// Sequence of those with at most one TemplateProcessing (LLaMA-3: ByteLevel then the template).
void add_post_processor(const json& root, const std::string& path, TokenizerSpec& spec) {
  const json* processor = member(root, "post_processor");
  if (processor == nullptr) return;
  std::vector<const json*> steps = {processor};
  if (type_of(*processor) == "Sequence") {
    const json* processors = member(*processor, "processors");
    if (processors == nullptr || !processors->is_array()) throw Error(path, "post-processor Sequence has no processors list");
    steps.clear();
    for (const json& step : *processors) steps.push_back(&step);
  }
  bool have_template = false;
  for (const json* step : steps) {
    const std::string type = type_of(*step);
    if (type == "ByteLevel") continue;
    if (type != "TemplateProcessing") {
      throw Error(path, "post-processor " + (type.empty() ? step->dump().substr(0, 100) : type) +
                            " is not supported (ByteLevel, TemplateProcessing, or a Sequence of them are)");
    }
    if (have_template) throw Error(path, "post-processor Sequence holds more than one TemplateProcessing");
    have_template = true;
    add_single_template(*step, path, spec);
  }
}

// A SentencePiece-style tokenizer.json (text/hf_sentencepiece.h), with the same post-processor and
// hash as the byte-level ones.
std::unique_ptr<Tokenizer> load_hf_sentencepiece(const TokenizerOptions& options, const json& root,
                                                 const std::string& text) {
  TokenizerSpec spec;
  add_post_processor(root, options.tokenizer_model, spec);
  HfSentencePieceFrame frame{std::move(spec.sequence_prefix), std::move(spec.sequence_suffix), "HuggingFaceTokenizer", ""};
  if (!options.include_special_tokens && !(frame.sequence_prefix.empty() && frame.sequence_suffix.empty())) {
    frame.sequence_prefix.clear();
    frame.sequence_suffix.clear();
    frame.name += ":no-special-tokens";
  }
  Fnv1a64 hash;
  hash.add("HuggingFaceTokenizer");
  hash.add(text);
  frame.hash = hash.hex();
  return make_hf_sentencepiece_tokenizer(root, options.tokenizer_model, std::move(frame));
}

std::unique_ptr<Tokenizer> load_huggingface(const TokenizerOptions& options) {
  require_option(options.tokenizer_model, "--tokenizer-model", "HuggingFaceTokenizer");
  const std::string& path = options.tokenizer_model;
  std::string text = read_input_file(path, "--tokenizer-model");
  json root = parse_json(path, text);
  if (is_hf_sentencepiece_json(root)) return load_hf_sentencepiece(options, root, text);
  const json* model_json = member(root, "model");
  if (model_json == nullptr || !model_json->is_object()) throw Error(path, "no model object");
  const json* model_type = member(*model_json, "type");
  if (model_type != nullptr && *model_type != "BPE") {
    throw Error(path, "model type " + model_type->dump() + " is not BPE");
  }
  if (member(root, "normalizer") != nullptr)
    throw Error(path, "normalizers are not supported (byte-level BPE has none)");
  const json* pre_tokenizer = member(root, "pre_tokenizer");
  if (pre_tokenizer == nullptr) throw Error(path, "no pre_tokenizer: not a byte-level BPE");
  const bool deepseek_v3_splits = is_deepseek_v3_splits(*pre_tokenizer, path);
  const PretokenizePattern pattern = deepseek_v3_splits ? PretokenizePattern::gpt2 : hf_pattern(*pre_tokenizer, path);
  if (!is_empty_or_null(*model_json, "continuing_subword_prefix") ||
      !is_empty_or_null(*model_json, "end_of_word_suffix") || !is_false_or_null(*model_json, "byte_fallback") ||
      member(*model_json, "dropout") != nullptr) {
    throw Error(path,
                "BPE options continuing_subword_prefix, end_of_word_suffix, byte_fallback, dropout are not supported");
  }
  const json* vocab = member(*model_json, "vocab");
  const json* merges = member(*model_json, "merges");
  if (vocab == nullptr) throw Error(path, "model has no vocab");
  if (merges == nullptr || !merges->is_array()) throw Error(path, "model has no merges list");

  BpeModel model;
  TokenIds id_of_text;
  int32_t max_id = add_byte_level_vocab(*vocab, path, model, id_of_text);
  std::vector<uint8_t> made_by_merge(static_cast<size_t>(max_id) + 1, 0);
  uint32_t priority = 0;
  for (const json& merge : *merges) {
    auto where = [&] { return path + ": merge " + std::to_string(priority); };
    int32_t merged = 0;
    if (merge.is_string()) {
      const std::string& line = merge.get_ref<const std::string&>();
      size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        throw Error(where(), "not two tokens separated by a space: " + line);
      }
      merged = add_merge_line(std::string_view(line).substr(0, space), std::string_view(line).substr(space + 1),
                              priority, where, id_of_text, model);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      merged = add_merge_line(merge[0].get_ref<const std::string&>(), merge[1].get_ref<const std::string&>(), priority,
                              where, id_of_text, model);
    } else {
      throw Error(where(), "not a \"a b\" string or an [a, b] pair");
    }
    made_by_merge[static_cast<size_t>(merged)] = 1;
    ++priority;
  }
  model.finish(path);
  model.find_self_merging_tokens();

  TokenizerSpec spec;
  spec.name = "HuggingFaceTokenizer";
  spec.pattern = pattern;
  spec.deepseek_v3_splits = deepseek_v3_splits;
  const json* ignore_merges = member(*model_json, "ignore_merges");
  spec.whole_piece_lookup = ignore_merges != nullptr && ignore_merges->is_boolean() && ignore_merges->get<bool>();
  if (const json* added = member(root, "added_tokens")) {
    if (!added->is_array()) throw Error(path, "added_tokens is not a list");
    for (const json& token : *added) {
      const json* id = member(token, "id");
      const json* content = member(token, "content");
      if (id == nullptr || !id->is_number_integer() || content == nullptr || !content->is_string()) {
        throw Error(path, "added token without integer id and string content");
      }
      std::string token_text = content->get<std::string>();
      if (!is_false_or_null(token, "lstrip") || !is_false_or_null(token, "rstrip") ||
          !is_false_or_null(token, "single_word")) {
        throw Error(path, "added token " + token_text + " uses lstrip/rstrip/single_word, which is not supported");
      }
      spec.specials.push_back({token_text, id->get<int32_t>()});
      max_id = std::max(max_id, id->get<int32_t>());
    }
  }
  // A merges list cut short (still valid JSON) leaves tokens no merge makes, as a cut vocab.bpe
  // does (issue 28 W8). With ignore_merges a whole piece is looked up first, which makes them.
  if (!spec.whole_piece_lookup) {
    const std::string never_made =
        tokens_never_made(id_of_text, made_by_merge, priority, "model.vocab", [&](const std::string& text) {
          return std::any_of(spec.specials.begin(), spec.specials.end(), [&](const SpecialToken& s) { return s.text == text; });
        });
    if (!never_made.empty()) {
      throw Error(path, "model.merges: " + never_made + ": the merges list is truncated or belongs to another vocabulary");
    }
  }
  spec.vocab_size = int64_t{max_id} + 1;
  add_post_processor(root, path, spec);
  if (!options.include_special_tokens && !(spec.sequence_prefix.empty() && spec.sequence_suffix.empty())) {
    spec.sequence_prefix.clear();
    spec.sequence_suffix.clear();
    spec.name += ":no-special-tokens";
  }
  for (const char* eod : {"<|endoftext|>", "<|end_of_text|>", "</s>"}) {
    auto it =
        std::find_if(spec.specials.begin(), spec.specials.end(), [&](const SpecialToken& s) { return s.text == eod; });
    if (it != spec.specials.end()) {
      spec.eod = it->id;
      break;
    }
  }
  Fnv1a64 hash;
  hash.add("HuggingFaceTokenizer");  // the files, whether or not the template is applied
  hash.add(text);
  spec.hash = hash.hex();
  return make_tokenizer(std::move(spec), std::move(model));
}

// ---- SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer: a .model file ----------------

std::unique_ptr<Tokenizer> load_sentencepiece(const TokenizerOptions& options) {
  require_option(options.tokenizer_model, "--tokenizer-model", options.type);
  const std::string& path = options.tokenizer_model;
  std::string bytes = read_input_file(path, "--tokenizer-model");
  Fnv1a64 hash;
  hash.add(options.type);
  hash.add(bytes);
  return make_sentencepiece_tokenizer(options.type, path, bytes, hash.hex());
}

}  // namespace

void Tokenizer::encode_sequence(std::string_view text, std::vector<int32_t>& out, bool allow_special) const {
  const auto prefix = sequence_prefix(), suffix = sequence_suffix();
  out.insert(out.end(), prefix.begin(), prefix.end());
  encode(text, out, allow_special);
  out.insert(out.end(), suffix.begin(), suffix.end());
}

std::unique_ptr<Tokenizer> Tokenizer::load(const TokenizerOptions& options) {
  const bool wordpiece = options.type == "BertWordPieceLowerCase" || options.type == "BertWordPieceCase";
  if (!options.include_special_tokens && options.type != "HuggingFaceTokenizer" && !wordpiece) {
    throw UsageError("--tokenizer-hf-no-include-special-tokens",
                     "applies to HuggingFaceTokenizer, BertWordPieceLowerCase and BertWordPieceCase only");
  }
  if (wordpiece) return load_wordpiece(options);
  if (options.type == "GPT2BPETokenizer") return load_gpt2(options);
  if (options.type == "TikTokenizer") return load_tiktoken(options);
  if (options.type == "HuggingFaceTokenizer") return load_huggingface(options);
  if (is_sentencepiece_type(options.type)) return load_sentencepiece(options);
  throw UsageError("--tokenizer-type",
                   "expected GPT2BPETokenizer, TikTokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, "
                   "GPTSentencePieceTokenizer, Llama2Tokenizer, BertWordPieceLowerCase or BertWordPieceCase, got " +
                       (options.type.empty() ? std::string("nothing") : options.type));
}

}  // namespace mt::text
