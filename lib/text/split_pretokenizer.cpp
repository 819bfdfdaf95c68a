// Scanners for DeepSeek-V3's three Split regexes (text/split_pretokenizer.h) and the Split
// sequence: each level finds the regex's leftmost matches in its piece, and hands the matches and
// the gaps between them, in order, to the next level. Each piece is a whole string to the regex
// (the end of the piece is the end of text for (?!\S)), as tokenizers splits pieces apart.
// Tested in tests/unit/text/test_split_pretokenizer.cpp and tests/unit/text/test_deepseek_golden.cpp.
#include "text/split_pretokenizer.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "text/unicode.h"

namespace mt::text {

namespace {

#include "text/punct_symbol_tables.inc"

constexpr std::array<std::string_view, 3> kDeepSeekV3Regexes = {
    R"(\p{N}{1,3})",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
};

enum Class : uint8_t { kLetter = 1, kMark = 2, kNumber = 4, kSpace = 8, kPunct = 16, kSymbol = 32 };

// One class byte per code point, built once.
const std::vector<uint8_t>& class_table() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> classes(0x110000, 0);
    for (char32_t cp = 0; cp < 0x110000; ++cp) {
      uint8_t value = 0;
      if (is_letter(cp)) value |= kLetter;
      if (is_mark(cp)) value |= kMark;
      if (is_number(cp)) value |= kNumber;
      if (is_whitespace(cp)) value |= kSpace;
      classes[cp] = value;
    }
    for (const CodePointRange& range : kPunctuationRanges) {
      for (char32_t cp = range.first; cp <= range.last; ++cp) classes[cp] |= kPunct;
    }
    for (const CodePointRange& range : kSymbolRanges) {
      for (char32_t cp = range.first; cp <= range.last; ++cp) classes[cp] |= kSymbol;
    }
    return classes;
  }();
  return table;
}

// A code point of a piece: its value (0x110000 for a byte outside well-formed UTF-8), class and length.
struct CodePoint {
  char32_t value;
  uint8_t cls;
  size_t length;
};

class Piece {
 public:
  explicit Piece(std::string_view text) : text_(text), classes_(class_table()) {}

  size_t size() const { return text_.size(); }
  CodePoint at(size_t pos) const {
    const auto byte = static_cast<unsigned char>(text_[pos]);
    if (byte < 0x80) return {byte, classes_[byte], 1};
    const size_t length = utf8_sequence_length(text_, pos);
    if (length == 0) return {0x110000, 0, 1};
    size_t next = pos;
    const char32_t cp = decode_utf8(text_, next);
    return {cp, classes_[cp], length};
  }
  // The end of the run of code points from pos whose class meets `in`, at most `limit` of them.
  template <class In>
  size_t run(size_t pos, In in, size_t limit = SIZE_MAX) const {
    for (size_t count = 0; pos < text_.size() && count < limit; ++count) {
      const CodePoint cp = at(pos);
      if (!in(cp)) break;
      pos += cp.length;
    }
    return pos;
  }

 private:
  std::string_view text_;
  const std::vector<uint8_t>& classes_;
};

bool is_newline(const CodePoint& cp) { return cp.value == '\r' || cp.value == '\n'; }
bool is_ascii_letter(const CodePoint& cp) { return (cp.value | 0x20) >= 'a' && (cp.value | 0x20) <= 'z'; }
bool is_ascii_punct(const CodePoint& cp) {
  return cp.value < 0x80 && cp.value > ' ' && cp.value != 0x7F && !is_ascii_letter(cp) &&
         !(cp.value >= '0' && cp.value <= '9');
}
bool is_letter_or_mark(const CodePoint& cp) { return (cp.cls & (kLetter | kMark)) != 0; }
bool is_punct_or_symbol(const CodePoint& cp) { return (cp.cls & (kPunct | kSymbol)) != 0; }
bool is_space(const CodePoint& cp) { return (cp.cls & kSpace) != 0; }

// Regex 1 at pos: \p{N}{1,3}; 0 when it does not match.
size_t match_numbers(const Piece& piece, size_t pos) {
  return piece.run(pos, [](const CodePoint& cp) { return (cp.cls & kNumber) != 0; }, 3) - pos;
}

// Regex 2 at pos: [U+4E00-9FA5 U+3040-309F U+30A0-30FF]+.
size_t match_kana_han(const Piece& piece, size_t pos) {
  return piece.run(pos, [](const CodePoint& cp) {
           return (cp.value >= 0x4E00 && cp.value <= 0x9FA5) || (cp.value >= 0x3040 && cp.value <= 0x30FF);
         }) - pos;
}

// Regex 3 at pos, alternative by alternative.
size_t match_words(const Piece& piece, size_t pos) {
  const CodePoint first = piece.at(pos);
  const size_t after = pos + first.length;
  // [ASCII punctuation][A-Za-z]+
  if (is_ascii_punct(first) && after < piece.size() && is_ascii_letter(piece.at(after))) {
    return piece.run(after, is_ascii_letter) - pos;
  }
  // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ : with the optional character if letters or marks follow
  // it, else without it (then the first code point itself must be a letter or mark).
  if (!is_newline(first) && !(first.cls & (kLetter | kPunct | kSymbol)) && after < piece.size() &&
      is_letter_or_mark(piece.at(after))) {
    return piece.run(after, is_letter_or_mark) - pos;
  }
  if (is_letter_or_mark(first)) return piece.run(pos, is_letter_or_mark) - pos;
  //  ?[\p{P}\p{S}]+[\r\n]*
  size_t start = pos;
  if (first.value == ' ' && after < piece.size() && is_punct_or_symbol(piece.at(after))) start = after;
  if (is_punct_or_symbol(piece.at(start))) {
    return piece.run(piece.run(start, is_punct_or_symbol), is_newline) - pos;
  }
  if (!is_space(first)) return 0;
  const size_t space_end = piece.run(pos, is_space);
  // \s*[\r\n]+ : up to just after the run's last CR or LF.
  size_t last_newline = SIZE_MAX;
  for (size_t at = pos; at < space_end;) {
    const CodePoint cp = piece.at(at);
    if (is_newline(cp)) last_newline = at;
    at += cp.length;
  }
  if (last_newline != SIZE_MAX) return last_newline + 1 - pos;
  // \s+(?!\S) : the run, less its last code point when a non-space follows; then \s+.
  if (space_end == piece.size()) return space_end - pos;
  size_t last_start = pos;
  for (size_t at = pos; at < space_end; at += piece.at(at).length) last_start = at;
  return last_start > pos ? last_start - pos : space_end - pos;
}

using Matcher = size_t (*)(const Piece&, size_t);
constexpr std::array<Matcher, 3> kMatchers = {match_numbers, match_kana_han, match_words};

struct Sink {
  void (*fn)(void*, std::string_view);
  void* context;
};

// Isolated split of `text` by regex `level`: matches and gaps, in order, to the next level.
void split(std::string_view text, size_t level, const Sink& sink) {
  if (text.empty()) return;
  if (level == kMatchers.size()) {
    sink.fn(sink.context, text);
    return;
  }
  const Piece piece(text);
  size_t gap = 0, pos = 0;
  while (pos < text.size()) {
    const size_t length = kMatchers[level](piece, pos);
    if (length == 0) {
      pos += piece.at(pos).length;
      continue;
    }
    split(text.substr(gap, pos - gap), level + 1, sink);
    split(text.substr(pos, length), level + 1, sink);
    pos += length;
    gap = pos;
  }
  split(text.substr(gap), level + 1, sink);
}

}  // namespace

const std::array<std::string_view, 3>& deepseek_v3_split_regexes() { return kDeepSeekV3Regexes; }

void deepseek_v3_pretokenize_into(std::string_view text, void (*sink)(void*, std::string_view), void* context) {
  split(text, 0, Sink{sink, context});
}

}  // namespace mt::text
