// Hand-written scanners for the pre-tokenizer regexes of text/pretokenize.h. Each scanner tries
// the regex's alternatives in order at the current position and returns the length of the first
// that matches, resolving the backtracking of each alternative in closed form (see the comments).
//
// \s is the Unicode White_Space property. That is what the Rust regex crate (tiktoken, through
// fancy-regex) uses, and Oniguruma's Unicode \s (Hugging Face tokenizers) is U+0009-000D, U+0085
// and the categories Zs, Zl, Zp: the same set in Unicode 15.0. Python's `re` (not used by any
// reference here) would add U+001C-001F. The case-insensitive contractions of cl100k use simple
// case folding, as the regex crate's (?i): 'ſ (U+017F) matches 's.
// Tested in tests/unit/text/test_pretokenize.cpp.
#include "text/pretokenize.h"

#include <array>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "text/unicode.h"

namespace mt::text {

namespace {

constexpr std::string_view kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kCl100kRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kMegatronV1Regex =
    R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
constexpr std::string_view kMegatronV2Regex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Class sets as bit masks over the class byte's low 3 bits (text/unicode.h).
constexpr unsigned kLetterSet = (1u << kLu) | (1u << kLl) | (1u << kLt) | (1u << kLm) | (1u << kLo);
constexpr unsigned kUpperLikeSet = (1u << kLu) | (1u << kLt) | (1u << kLm) | (1u << kLo) | (1u << kMark);
constexpr unsigned kLowerLikeSet = (1u << kLl) | (1u << kLm) | (1u << kLo) | (1u << kMark);
constexpr unsigned kLowerOnlySet = 1u << kLl;

constexpr std::array<uint8_t, 128> make_ascii_classes() {
  std::array<uint8_t, 128> classes{};
  for (int c = 0; c < 128; ++c) {
    uint8_t value = kOther;
    if (c >= 'a' && c <= 'z') value = kLl;
    if (c >= 'A' && c <= 'Z') value = kLu;
    if (c >= '0' && c <= '9') value = kNumber;
    if ((c >= 0x09 && c <= 0x0D) || c == ' ') value = kOther | kWhiteSpaceBit;
    classes[c] = static_cast<uint8_t>(value | kAssignedBit);
  }
  return classes;
}
constexpr std::array<uint8_t, 128> kAsciiClasses = make_ascii_classes();

bool is_ascii_letter(unsigned char b) { return static_cast<unsigned>((b | 0x20) - 'a') <= unsigned{'z' - 'a'}; }

// One code point: its class byte, its first byte and its length in bytes.
struct CodePoint {
  uint8_t cls;
  unsigned char first;
  uint8_t length;

  bool in(unsigned set) const { return (set >> (cls & 7)) & 1u; }
  bool letter() const { return in(kLetterSet); }
  bool number() const { return (cls & 7) == kNumber; }
  bool space() const { return (cls & kWhiteSpaceBit) != 0; }
  bool newline() const { return first == '\r' || first == '\n'; }
  // [^\s\p{L}\p{N}]
  bool other() const { return !space() && !letter() && !number(); }
  // [^\r\n\p{L}\p{N}]
  bool not_newline_letter_number() const { return !newline() && !letter() && !number(); }
};

class Scanner {
 public:
  explicit Scanner(std::string_view text) : text_(text), size_(text.size()) {}

  // The code point at pos; a byte that does not start a well-formed sequence (the text should be
  // valid UTF-8, but nothing may read out of bounds when it is not) is a one-byte `other`.
  CodePoint at(size_t pos) const {
    auto first = static_cast<unsigned char>(text_[pos]);
    if (first < 0x80) return {kAsciiClasses[first], first, 1};
    if (utf8_sequence_length(text_, pos) == 0) return {kOther, first, 1};
    size_t next = pos;
    char32_t cp = decode_utf8(text_, next);
    return {code_point_class(cp), first, static_cast<uint8_t>(next - pos)};
  }

  template <class Pred>
  size_t run(size_t pos, Pred pred) const {
    while (pos < size_) {
      CodePoint c = at(pos);
      if (!pred(c)) break;
      pos += c.length;
    }
    return pos;
  }
  // \p{L}+ from pos (the end of the run), with ASCII bytes tested inline.
  size_t letters(size_t pos) const {
    while (pos < size_) {
      auto b = static_cast<unsigned char>(text_[pos]);
      if (b < 0x80) {
        if (!is_ascii_letter(b)) return pos;
        ++pos;
        continue;
      }
      CodePoint c = at(pos);
      if (!c.letter()) return pos;
      pos += c.length;
    }
    return pos;
  }
  size_t numbers(size_t pos) const {
    return run(pos, [](CodePoint c) { return c.number(); });
  }
  size_t others(size_t pos) const {
    return run(pos, [](CodePoint c) { return c.other(); });
  }

  // 's|'t|'re|'ve|'m|'ll|'d at pos (text[pos] == '\''), case-sensitive or under simple case
  // folding; 0 when none matches.
  size_t contraction(size_t pos, bool fold) const {
    size_t p = pos + 1;
    char first = letter_at(p, fold);
    if (first == 's' || first == 't' || first == 'm' || first == 'd') return p - pos;
    if (first == 'r' || first == 'v' || first == 'l') {
      char second = letter_at(p, fold);
      if ((first == 'l' && second == 'l') || (first != 'l' && second == 'e')) return p - pos;
    }
    return 0;
  }

  // \s+(?!\S)|\s+ at a white-space code point: the whole run at the end of the text; before a
  // non-space, the run minus its last code point (the lookahead backtracks one step), or the one
  // code point when the run has only one.
  size_t space_tail(size_t pos) const {
    size_t end = pos;
    size_t last = pos;
    while (end < size_) {
      CodePoint c = at(end);
      if (!c.space()) break;
      last = end;
      end += c.length;
    }
    if (end == size_ || last == pos) return end - pos;
    return last - pos;
  }

  // \s*[\r\n]+ (and \s*[\r\n]) at a white-space code point: \s* backtracks to the last \r or \n
  // of the run; 0 when the run has none.
  size_t spaces_to_last_newline(size_t pos) const {
    size_t end = pos;
    size_t after_newline = 0;
    while (end < size_) {
      CodePoint c = at(end);
      if (!c.space()) break;
      end += c.length;
      if (c.newline()) after_newline = end;
    }
    return after_newline == 0 ? 0 : after_newline - pos;
  }

  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ from `start`: the end of the match
  // or 0. The greedy upper-like run ends at u; if u holds a lower-case letter the match takes the
  // lower-like run from there, else the star backtracks to its last lower-like code point (which
  // then matches the plus alone, as the code point after it is upper-only).
  size_t upper_then_lower(size_t start) const {
    size_t end = start;
    size_t after_lower_like = 0;
    while (end < size_) {
      CodePoint c = at(end);
      if (!c.in(kUpperLikeSet)) break;
      end += c.length;
      if (c.in(kLowerLikeSet)) after_lower_like = end;
    }
    if (end < size_ && at(end).in(kLowerOnlySet)) {
      return run(end, [](CodePoint c) { return c.in(kLowerLikeSet); });
    }
    return after_lower_like;
  }

  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]* from `start`: end or 0.
  size_t upper_plus_lower(size_t start) const {
    size_t end = run(start, [](CodePoint c) { return c.in(kUpperLikeSet); });
    if (end == start) return 0;
    return run(end, [](CodePoint c) { return c.in(kLowerLikeSet); });
  }

  size_t size() const { return size_; }
  unsigned char byte(size_t pos) const { return static_cast<unsigned char>(text_[pos]); }

 private:
  // The ASCII letter at pos (lower-cased under folding) and advances pos past it, or 0.
  char letter_at(size_t& pos, bool fold) const {
    if (pos >= size_) return 0;
    auto first = static_cast<unsigned char>(text_[pos]);
    if (first < 0x80) {
      ++pos;
      if (!fold) return static_cast<char>(first);
      return ascii_case_fold(first);
    }
    if (!fold || utf8_sequence_length(text_, pos) == 0) return 0;
    size_t next = pos;
    char letter = ascii_case_fold(decode_utf8(text_, next));
    if (letter != 0) pos = next;
    return letter;
  }

  std::string_view text_;
  size_t size_;
};

// The commonest pieces, " word" and "word" in ASCII, are a letter run in every pattern but
// Megatron's v2 (after a space or not: in cl100k and v1 a space is a non-letter prefix); 0 for
// anything else, which the full scanner handles.
size_t ascii_word(const Scanner& s, size_t pos) {
  unsigned char b = s.byte(pos);
  if (is_ascii_letter(b)) return s.letters(pos + 1) - pos;
  if (b == ' ' && pos + 1 < s.size() && is_ascii_letter(s.byte(pos + 1))) return s.letters(pos + 2) - pos;
  return 0;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t gpt2_piece(const Scanner& s, size_t pos) {
  if (size_t length = ascii_word(s, pos)) return length;
  if (s.byte(pos) == '\'') {
    if (size_t length = s.contraction(pos, false)) return length;
  }
  CodePoint c = s.at(pos);
  size_t start = pos;
  if (s.byte(pos) == ' ' && pos + 1 < s.size()) {
    CodePoint next = s.at(pos + 1);
    if (next.letter()) return s.letters(pos + 1) - start;
    if (next.number()) return s.numbers(pos + 1) - start;
    if (next.other()) return s.others(pos + 1) - start;
  }
  if (c.letter()) return s.letters(pos) - start;
  if (c.number()) return s.numbers(pos) - start;
  if (c.other()) return s.others(pos) - start;
  return s.space_tail(pos);
}

// Shared by cl100k and Megatron's v1: [^\r\n\p{L}\p{N}]?\p{L}+ (the optional code point is never
// a letter, so giving it back never helps: the possessive ?+ of v1 changes nothing).
size_t prefixed_letters(const Scanner& s, size_t pos, CodePoint c) {
  if (c.letter()) return s.letters(pos) - pos;
  if (c.not_newline_letter_number() && pos + c.length < s.size() && s.at(pos + c.length).letter()) {
    return s.letters(pos + c.length) - pos;
  }
  return 0;
}

// ` ?[^\s\p{L}\p{N}]+` followed by a run of `tail` bytes; 0 when it does not match.
template <class TailPred>
size_t prefixed_others(const Scanner& s, size_t pos, CodePoint c, TailPred tail) {
  size_t end = 0;
  if (s.byte(pos) == ' ' && pos + 1 < s.size() && s.at(pos + 1).other()) {
    end = s.others(pos + 1);
  } else if (c.other()) {
    end = s.others(pos);
  } else {
    return 0;
  }
  while (end < s.size() && tail(s.byte(end))) ++end;
  return end - pos;
}

bool is_cr_or_lf(unsigned char b) { return b == '\r' || b == '\n'; }
bool is_cr_lf_or_slash(unsigned char b) { return b == '\r' || b == '\n' || b == '/'; }

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t cl100k_piece(const Scanner& s, size_t pos) {
  if (size_t length = ascii_word(s, pos)) return length;
  if (s.byte(pos) == '\'') {
    if (size_t length = s.contraction(pos, true)) return length;
  }
  CodePoint c = s.at(pos);
  if (size_t length = prefixed_letters(s, pos, c)) return length;
  if (c.number()) {
    size_t end = pos;
    for (int i = 0; i < 3 && end < s.size(); ++i) {
      CodePoint d = s.at(end);
      if (!d.number()) break;
      end += d.length;
    }
    return end - pos;
  }
  if (size_t length = prefixed_others(s, pos, c, is_cr_or_lf)) return length;
  if (size_t length = s.spaces_to_last_newline(pos)) return length;
  return s.space_tail(pos);
}

// [^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+
// (the possessive ++ gives nothing back that [\r\n]* could use: \r and \n are spaces)
size_t megatron_v1_piece(const Scanner& s, size_t pos) {
  if (size_t length = ascii_word(s, pos)) return length;
  CodePoint c = s.at(pos);
  if (size_t length = prefixed_letters(s, pos, c)) return length;
  if (c.number()) return c.length;
  if (size_t length = prefixed_others(s, pos, c, is_cr_or_lf)) return length;
  if (size_t length = s.spaces_to_last_newline(pos)) return length;
  return s.space_tail(pos);
}

// [^\r\n\p{L}\p{N}]?[U]*[L]+|[^\r\n\p{L}\p{N}]?[U]+[L]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], L = [\p{Ll}\p{Lm}\p{Lo}\p{M}]. Marks are outside \p{L},
// so a mark can be the optional prefix and, given back, start U or L itself: each of the first
// two alternatives is tried with the prefix, then without.
size_t megatron_v2_piece(const Scanner& s, size_t pos) {
  CodePoint c = s.at(pos);
  bool prefix = c.not_newline_letter_number() && pos + c.length < s.size();
  if (prefix) {
    if (size_t end = s.upper_then_lower(pos + c.length)) return end - pos;
  }
  if (size_t end = s.upper_then_lower(pos)) return end - pos;
  if (prefix) {
    if (size_t end = s.upper_plus_lower(pos + c.length)) return end - pos;
  }
  if (size_t end = s.upper_plus_lower(pos)) return end - pos;
  if (c.number()) return c.length;
  if (size_t length = prefixed_others(s, pos, c, is_cr_lf_or_slash)) return length;
  if (size_t length = s.spaces_to_last_newline(pos)) return length;
  return s.space_tail(pos);
}

}  // namespace

PretokenizePattern pattern_from_regex(std::string_view regex) {
  for (auto pattern : {PretokenizePattern::gpt2, PretokenizePattern::cl100k, PretokenizePattern::megatron_v1,
                       PretokenizePattern::megatron_v2}) {
    if (regex == pattern_regex(pattern)) return pattern;
  }
  throw Error("pre-tokenizer regex",
              "not one of the supported patterns (gpt2, cl100k, Megatron v1/v2): " + std::string(regex));
}

std::string_view pattern_regex(PretokenizePattern pattern) {
  switch (pattern) {
    case PretokenizePattern::gpt2: return kGpt2Regex;
    case PretokenizePattern::cl100k: return kCl100kRegex;
    case PretokenizePattern::megatron_v1: return kMegatronV1Regex;
    case PretokenizePattern::megatron_v2: return kMegatronV2Regex;
  }
  throw Error("pre-tokenizer pattern", "unknown value");
}

size_t next_piece_length(PretokenizePattern pattern, std::string_view text, size_t pos) {
  Scanner scanner(text);
  switch (pattern) {
    case PretokenizePattern::gpt2: return gpt2_piece(scanner, pos);
    case PretokenizePattern::cl100k: return cl100k_piece(scanner, pos);
    case PretokenizePattern::megatron_v1: return megatron_v1_piece(scanner, pos);
    case PretokenizePattern::megatron_v2: return megatron_v2_piece(scanner, pos);
  }
  throw Error("pre-tokenizer pattern", "unknown value");
}

}  // namespace mt::text
