// BERT's basic tokenizer and the WordPiece model of text/wordpiece.h: per-code-point flags from the
// generated text/wordpiece_tables.inc (a dense byte per code point, built once), greedy
// longest-match-first over two hash maps (word-start pieces, "##" continuation pieces), and the
// vocab.txt reader with its checks.
// The uncased normalizer runs as the reference does, over the cleaned text: NFD (decomposition,
// then canonical ordering of each run of combining marks by combining class, stable), then the
// accent strip and lower-casing per code point. Removed code points do not end a run of marks
// (clean_text drops them first); spaces, CJK padding and starters do.
// Tested in tests/unit/text/test_wordpiece.cpp and tests/unit/text/test_wordpiece_golden.cpp.
#include "text/wordpiece.h"

#include <algorithm>
#include <array>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/input_file.h"
#include "text/unicode.h"

namespace mt::text {

namespace {

#include "text/wordpiece_tables.inc"

enum WordPieceFlag : uint8_t {
  kRemoved = 1,        // clean_text drops it (controls, format, private use, U+0000, U+FFFD)
  kToSpace = 2,        // clean_text makes it ' '
  kChinese = 4,        // a CJK ideograph: a word of its own
  kPunctuation = 8,    // the pre-tokenizer isolates it
  kSplitSpace = 16,    // the pre-tokenizer splits on it
  kUncasedDrop = 32,   // the uncased normalizer strips it (a nonspacing mark after NFD)
  kUncasedMap = 64,    // the uncased normalizer replaces it (kUncasedReplacements)
  kDecomposes = 128,   // NFD decomposes it (kNfdDecompositions, or Hangul)
};

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr char32_t kHangulFirst = 0xAC00, kHangulLast = 0xD7A3;
constexpr size_t kMaxWordCodePoints = 100;  // HF's max_input_chars_per_word
constexpr std::string_view kContinuationPrefix = "##";
constexpr std::array<std::string_view, 5> kRequiredTokens = {"[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"};
constexpr int kCaseExtraIds = 100;  // Megatron-Core's BertWordPieceCase: <extra_id_0> .. <extra_id_99>

const std::vector<uint8_t>& flag_table() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> flags(kMaxCodePoint + 1, 0);
    for (const WordPieceFlagRange& range : kWordPieceFlagRanges) {
      std::fill(flags.begin() + range.first, flags.begin() + range.last + 1, range.flags);
    }
    return flags;
  }();
  return table;
}

const std::vector<uint8_t>& combining_class_table() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> classes(kMaxCodePoint + 1, 0);
    for (const WordPieceFlagRange& range : kCombiningClassRanges) {
      std::fill(classes.begin() + range.first, classes.begin() + range.last + 1, range.flags);
    }
    return classes;
  }();
  return table;
}

template <size_t N>
std::string_view text_of(const CodePointText (&table)[N], char32_t cp) {
  auto it = std::lower_bound(std::begin(table), std::end(table), cp,
                             [](const CodePointText& entry, char32_t value) { return entry.code_point < value; });
  if (it == std::end(table) || it->code_point != cp) return {};
  return it->utf8;
}

// The canonical decomposition of a Hangul syllable (Unicode 3.12).
void append_hangul_jamo(char32_t cp, std::string& out) {
  char32_t index = cp - kHangulFirst;
  append_utf8(out, 0x1100 + index / 588);
  append_utf8(out, 0x1161 + (index % 588) / 28);
  if (index % 28 != 0) append_utf8(out, 0x11A7 + index % 28);
}

}  // namespace

// Collects the normalized code points into words: whitespace ends a word, punctuation is a word.
class BertBasicTokenizer::WordBuilder {
 public:
  WordBuilder(void (*sink)(void*, std::string_view, size_t), void* context) : sink_(sink), context_(context) {}

  void add(char32_t cp, uint8_t flags) {
    if (flags & kSplitSpace) {
      end_word();
    } else if (flags & kPunctuation) {
      end_word();
      append(cp);
      end_word();
    } else {
      append(cp);
    }
  }
  // Adds the code points of normalized UTF-8 text (a replacement from the tables).
  void add_utf8(std::string_view text) {
    const std::vector<uint8_t>& flags = flag_table();
    size_t pos = 0;
    while (pos < text.size()) {
      char32_t cp = decode_utf8(text, pos);
      add(cp, flags[cp]);
    }
  }
  void end_word() {
    if (word_.empty()) return;
    sink_(context_, word_, code_points_);
    word_.clear();
    code_points_ = 0;
  }

 private:
  void append(char32_t cp) {
    if (cp < 0x80) {
      word_.push_back(static_cast<char>(cp));
    } else {
      append_utf8(word_, cp);
    }
    ++code_points_;
  }

  void (*sink_)(void*, std::string_view, size_t);
  void* context_;
  std::string word_;
  size_t code_points_ = 0;
};

// The uncased normalizer after clean_text: NFD with canonical ordering, then accent strip and
// lower-casing, feeding the word builder.
class BertBasicTokenizer::UncasedStage {
 public:
  explicit UncasedStage(WordBuilder& builder) : builder_(builder), classes_(combining_class_table()) {}

  // One code point of the cleaned text (not removed, not whitespace).
  void add(char32_t cp, uint8_t flags) {
    if (!(flags & kDecomposes)) {
      add_decomposed(cp);
    } else if (cp >= kHangulFirst && cp <= kHangulLast) {
      std::string jamo;
      append_hangul_jamo(cp, jamo);
      add_decomposed_utf8(jamo);
    } else {
      add_decomposed_utf8(text_of(kNfdDecompositions, cp));
    }
  }
  // Ends a run of combining marks (before a space or the end of the text).
  void flush() {
    if (marks_.empty()) return;
    std::stable_sort(marks_.begin(), marks_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& mark : marks_) emit(mark.second);
    marks_.clear();
  }

 private:
  void add_decomposed_utf8(std::string_view text) {
    size_t pos = 0;
    while (pos < text.size()) add_decomposed(decode_utf8(text, pos));
  }
  void add_decomposed(char32_t cp) {
    const uint8_t combining_class = classes_[cp];
    if (combining_class != 0) {
      marks_.emplace_back(combining_class, cp);
      return;
    }
    flush();
    emit(cp);
  }
  void emit(char32_t cp) {
    const uint8_t flags = flag_table()[cp];
    if (cp >= 'A' && cp <= 'Z') {
      builder_.add(cp + ('a' - 'A'), 0);
    } else if (flags & kUncasedDrop) {
      // an accent the uncased normalizer strips
    } else if (flags & kUncasedMap) {
      builder_.add_utf8(text_of(kUncasedReplacements, cp));
    } else {
      builder_.add(cp, flags);
    }
  }

  WordBuilder& builder_;
  const std::vector<uint8_t>& classes_;
  std::vector<std::pair<uint8_t, char32_t>> marks_;  // (combining class, code point) of the current run
};

void BertBasicTokenizer::normalize_next(std::string_view text, size_t& pos, WordBuilder& builder,
                                        UncasedStage* uncased) const {
  const std::vector<uint8_t>& table = flag_table();
  char32_t cp;
  if (static_cast<unsigned char>(text[pos]) < 0x80) {
    cp = static_cast<unsigned char>(text[pos++]);
  } else if (utf8_sequence_length(text, pos) == 0) {
    ++pos;  // an ill-formed byte: U+FFFD, which clean_text removes
    return;
  } else {
    cp = decode_utf8(text, pos);
  }
  const uint8_t flags = table[cp];
  if (flags & kRemoved) return;
  const bool space = (flags & kToSpace) != 0, chinese = (flags & kChinese) != 0;
  if (space || chinese) {
    if (uncased != nullptr) uncased->flush();
    builder.end_word();
    if (space) return;
  }
  if (uncased != nullptr) {
    uncased->add(cp, flags);
  } else {
    builder.add(cp, flags);
  }
  if (chinese) {
    if (uncased != nullptr) uncased->flush();
    builder.end_word();
  }
}

void BertBasicTokenizer::for_each_word(std::string_view text, void (*sink)(void*, std::string_view, size_t),
                                       void* context) const {
  WordBuilder builder(sink, context);
  std::optional<UncasedStage> uncased;
  if (lower_case_) uncased.emplace(builder);
  UncasedStage* stage = uncased ? &*uncased : nullptr;
  size_t pos = 0;
  while (pos < text.size()) normalize_next(text, pos, builder, stage);
  if (stage != nullptr) stage->flush();
  builder.end_word();
}

namespace {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
using TokenIds = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

uint64_t fnv1a64(std::string_view bytes, uint64_t state = 0xCBF29CE484222325ull) {
  for (unsigned char byte : bytes) {
    state ^= byte;
    state *= 0x100000001B3ull;
  }
  return state;
}

std::string hex_hash(uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text = "fnv1a64:";
  for (int shift = 60; shift >= 0; shift -= 4) text.push_back(kDigits[(value >> shift) & 0xF]);
  return text;
}

// The tokens of a vocab.txt, one per line (id = line - 1), checked.
std::vector<std::string> read_vocab_file(const std::string& path) {
  const std::string text = read_input_file(path, "--vocab-file");
  std::vector<std::string> tokens;
  std::unordered_map<std::string_view, size_t> line_of_token;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view token(text.data() + pos, end - pos);
    if (!token.empty() && token.back() == '\r') token.remove_suffix(1);
    const size_t line = tokens.size() + 1;
    auto where = [&] { return path + ": line " + std::to_string(line); };
    if (!is_valid_utf8(token)) throw Error(where(), "is not valid UTF-8");
    if (token.empty()) throw Error(where(), "is empty (vocab.txt holds one token per line)");
    size_t first = 0, last = token.size();
    const bool leading_space = is_whitespace(decode_utf8(token, first));
    bool trailing_space = false;
    for (size_t at = 0; at < last;) trailing_space = is_whitespace(decode_utf8(token, at));
    if (leading_space || trailing_space) throw Error(where(), "has a token with surrounding whitespace");
    auto [it, inserted] = line_of_token.emplace(token, line);
    if (!inserted) {
      throw Error(where(), "repeats the token \"" + std::string(token) + "\" of line " + std::to_string(it->second));
    }
    tokens.emplace_back(token);
    pos = end + 1;
  }
  if (tokens.empty()) throw Error(path, "holds no tokens");
  for (std::string_view required : kRequiredTokens) {
    if (!line_of_token.contains(required)) throw Error(path, "has no " + std::string(required) + " token (BERT needs it)");
  }
  return tokens;
}

class WordPieceTokenizer final : public Tokenizer {
 public:
  WordPieceTokenizer(const TokenizerOptions& options, bool lower_case, std::vector<std::string> tokens)
      : basic_(lower_case), tokens_(std::move(tokens)) {
    name_ = options.type;
    for (size_t id = 0; id < tokens_.size(); ++id) {
      std::string_view token = tokens_[id];
      piece_ids_.emplace(token, static_cast<int32_t>(id));
      if (token.starts_with(kContinuationPrefix) && token.size() > kContinuationPrefix.size()) {
        continuation_ids_.emplace(token.substr(kContinuationPrefix.size()), static_cast<int32_t>(id));
      }
      max_piece_bytes_ = std::max(max_piece_bytes_, token.size());
    }
    for (std::string_view special : kRequiredTokens) add_special(std::string(special));
    if (!lower_case) {
      for (int i = 0; i < kCaseExtraIds; ++i) add_special("<extra_id_" + std::to_string(i) + ">");
    }
    unk_id_ = piece_ids_.at("[UNK]");
    sep_id_ = piece_ids_.at("[SEP]");
    if (options.include_special_tokens) {
      prefix_ = {piece_ids_.at("[CLS]")};
      suffix_ = {sep_id_};
    } else {
      name_ += ":no-special-tokens";
    }
    std::stable_sort(specials_.begin(), specials_.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }

  void set_hash(std::string hash) { hash_ = std::move(hash); }

  void encode(std::string_view text, std::vector<int32_t>& out, bool allow_special) const override {
    if (!allow_special) {
      encode_ordinary(text, out);
      return;
    }
    size_t start = 0;
    for (size_t pos = 0; pos < text.size();) {
      auto found = std::find_if(specials_.begin(), specials_.end(),
                                [&](const auto& special) { return text.substr(pos).starts_with(special.first); });
      if (found == specials_.end()) {
        ++pos;
        continue;
      }
      encode_ordinary(text.substr(start, pos - start), out);
      out.push_back(found->second);
      pos += found->first.size();
      start = pos;
    }
    encode_ordinary(text.substr(start), out);
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string text;
    for (size_t i = 0; i < ids.size(); ++i) {
      std::string_view token = tokens_.at(checked(ids[i]));
      std::string piece;
      if (i == 0) {
        piece = token;
      } else if (token.starts_with(kContinuationPrefix)) {
        piece = token.substr(kContinuationPrefix.size());
      } else {
        piece = " ";
        piece += token;
      }
      text += cleanup(std::move(piece));
    }
    return text;
  }

  std::string token_bytes(int32_t id) const override { return tokens_.at(checked(id)); }
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  std::optional<int32_t> eod_id() const override { return sep_id_; }
  std::optional<int32_t> special_token_id(std::string_view text) const override {
    for (const auto& [special, id] : specials_) {
      if (special == text) return id;
    }
    return std::nullopt;
  }
  std::string name() const override { return name_; }
  std::string hash() const override { return hash_; }
  std::span<const int32_t> sequence_prefix() const override { return prefix_; }
  std::span<const int32_t> sequence_suffix() const override { return suffix_; }

 private:
  void add_special(const std::string& text) {
    auto it = piece_ids_.find(text);
    int32_t id = static_cast<int32_t>(tokens_.size());
    if (it == piece_ids_.end()) {
      tokens_.push_back(text);  // an added token: no piece of words, only special
    } else {
      id = it->second;
    }
    specials_.emplace_back(text, id);
  }

  size_t checked(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= tokens_.size()) {
      throw Error(name_, "token id " + std::to_string(id) + " outside [0, " + std::to_string(tokens_.size()) + ")");
    }
    return static_cast<size_t>(id);
  }

  // HF's WordPiece decoder cleanup, applied to each token with its leading space.
  static std::string cleanup(std::string text) {
    static constexpr std::array<std::pair<std::string_view, std::string_view>, 11> kRules = {{
        {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
        {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
    }};
    for (const auto& [from, to] : kRules) {
      if (text.find(from) == std::string::npos) continue;
      std::string replaced;
      size_t pos = 0;
      for (size_t hit; (hit = text.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
        replaced.append(text, pos, hit - pos);
        replaced += to;
      }
      replaced.append(text, pos);
      text = std::move(replaced);
    }
    return text;
  }

  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
    basic_.split(text, [&](std::string_view word, size_t code_points) { encode_word(word, code_points, out); });
  }

  // Greedy longest-match-first; the whole word is [UNK] when it is too long or a position has no
  // piece.
  void encode_word(std::string_view word, size_t code_points, std::vector<int32_t>& out) const {
    if (code_points > kMaxWordCodePoints) {
      out.push_back(unk_id_);
      return;
    }
    const size_t first_out = out.size();
    size_t start = 0;
    while (start < word.size()) {
      const TokenIds& ids = start == 0 ? piece_ids_ : continuation_ids_;
      size_t end = std::min(word.size(), start + max_piece_bytes_);
      int32_t found = -1;
      for (; end > start; --end) {
        if (end < word.size() && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80) continue;
        auto it = ids.find(word.substr(start, end - start));
        if (it != ids.end()) {
          found = it->second;
          break;
        }
      }
      if (found < 0) {
        out.resize(first_out);
        out.push_back(unk_id_);
        return;
      }
      out.push_back(found);
      start = end;
    }
  }

  BertBasicTokenizer basic_;
  std::vector<std::string> tokens_;  // by id: the vocabulary, then added special tokens
  TokenIds piece_ids_, continuation_ids_;
  size_t max_piece_bytes_ = 0;
  std::vector<std::pair<std::string, int32_t>> specials_;  // longest first
  int32_t unk_id_ = 0, sep_id_ = 0;
  std::vector<int32_t> prefix_, suffix_;
  std::string name_, hash_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_wordpiece(const TokenizerOptions& options) {
  const bool lower_case = options.type == "BertWordPieceLowerCase";
  if (!lower_case && options.type != "BertWordPieceCase") {
    throw UsageError("--tokenizer-type", "expected BertWordPieceLowerCase or BertWordPieceCase, got " + options.type);
  }
  if (options.vocab_file.empty()) throw UsageError("--vocab-file", options.type + " needs this file (vocab.txt)");
  if (!options.merge_file.empty()) throw UsageError("--merge-file", options.type + " takes no merge file");
  if (!options.tokenizer_model.empty()) throw UsageError("--tokenizer-model", options.type + " takes --vocab-file");
  std::vector<std::string> tokens = read_vocab_file(options.vocab_file);
  uint64_t state = fnv1a64(options.type);
  for (const std::string& token : tokens) state = fnv1a64(token + "\n", state);
  auto tokenizer = std::make_unique<WordPieceTokenizer>(options, lower_case, std::move(tokens));
  tokenizer->set_hash(hex_hash(state));
  return tokenizer;
}

}  // namespace mt::text
