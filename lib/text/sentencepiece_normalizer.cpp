// SentencePiece's normalizer: the precompiled charsmap trie, user-defined symbols, whitespace
// rules (text/sentencepiece_normalizer.h).
// Tested in tests/unit/text/test_sentencepiece.cpp and tests/unit/text/test_sentencepiece_golden.cpp.
#include "text/sentencepiece_normalizer.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace mt::text {

namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";         // U+2581, sentencepiece's kSpaceSymbol
constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

bool is_trail_byte(unsigned char byte) { return (byte & 0xC0) == 0x80; }
bool is_valid_codepoint(uint32_t c) { return c < 0xD800 || (c >= 0xE000 && c <= 0x10FFFF); }

}  // namespace

size_t valid_utf8_length(std::string_view text) {
  if (text.empty()) return 0;
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  if (b[0] < 0x80) return 1;
  if (n >= 2 && (b[0] & 0xE0) == 0xC0 && is_trail_byte(b[1])) {
    const uint32_t c = ((b[0] & 0x1Fu) << 6) | (b[1] & 0x3Fu);
    return c >= 0x80 ? 2 : 0;
  }
  if (n >= 3 && (b[0] & 0xF0) == 0xE0 && is_trail_byte(b[1]) && is_trail_byte(b[2])) {
    const uint32_t c = ((b[0] & 0x0Fu) << 12) | ((b[1] & 0x3Fu) << 6) | (b[2] & 0x3Fu);
    return c >= 0x800 && is_valid_codepoint(c) ? 3 : 0;
  }
  if (n >= 4 && (b[0] & 0xF8) == 0xF0 && is_trail_byte(b[1]) && is_trail_byte(b[2]) && is_trail_byte(b[3])) {
    const uint32_t c = ((b[0] & 0x07u) << 18) | ((b[1] & 0x3Fu) << 12) | ((b[2] & 0x3Fu) << 6) | (b[3] & 0x3Fu);
    return c >= 0x10000 && is_valid_codepoint(c) ? 4 : 0;
  }
  return 0;
}

// ---- user-defined symbols ------------------------------------------------------------------------

UserSymbolMatcher::UserSymbolMatcher(const std::vector<std::string>& symbols) {
  for (const std::string& symbol : symbols) {
    if (symbol.empty()) continue;
    by_first_byte_[static_cast<unsigned char>(symbol[0])].push_back(symbol);
    ++count_;
  }
  for (auto& list : by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  }
}

size_t UserSymbolMatcher::match(std::string_view text) const {
  if (count_ == 0 || text.empty()) return 0;
  for (const std::string& symbol : by_first_byte_[static_cast<unsigned char>(text[0])]) {
    if (text.starts_with(symbol)) return symbol.size();
  }
  return 0;
}

// ---- precompiled charsmap ------------------------------------------------------------------------

PrecompiledCharsmap::PrecompiledCharsmap(std::string_view blob, const std::string& path) : path_(path) {
  auto fail = [&](const std::string& why) { throw Error(path, "normalizer_spec precompiled_charsmap " + why); };
  if (blob.size() <= 4) fail("is " + std::to_string(blob.size()) + " bytes, too short to hold a trie");
  uint32_t trie_bytes = 0;
  for (int i = 0; i < 4; ++i) trie_bytes |= uint32_t{static_cast<unsigned char>(blob[i])} << (8 * i);
  if (trie_bytes >= blob.size() - 4 + 1 || trie_bytes == 0 || trie_bytes % 4 != 0) {
    fail("declares a trie of " + std::to_string(trie_bytes) + " bytes in a blob of " + std::to_string(blob.size()));
  }
  units_.resize(trie_bytes / 4);
  for (size_t i = 0; i < units_.size(); ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(blob.data() + 4 + 4 * i);
    units_[i] = uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
  }
  replacements_ = std::string(blob.substr(4 + trie_bytes));
  if (replacements_.empty() || replacements_.back() != '\0') fail("replacement strings do not end in a NUL");
}

// darts-clone's DoubleArray::commonPrefixSearch, keeping the deepest match. A unit holds a label
// (bits 0-7, and bit 31 for a leaf's value), has_leaf (bit 8), and an offset (bits 10-31, shifted
// left by 8 when bit 9 is set); a leaf unit's value is its low 31 bits.
std::pair<size_t, std::string_view> PrecompiledCharsmap::longest_match(std::string_view text) const {
  if (units_.empty()) return {0, {}};
  auto offset = [](uint32_t unit) { return (unit >> 10) << ((unit & (1u << 9)) >> 6); };
  size_t matched = 0;
  uint32_t value = 0;
  uint32_t node = offset(units_[0]);
  for (size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    node ^= byte;
    if (node >= units_.size()) break;
    const uint32_t unit = units_[node];
    if ((unit & ((1u << 31) | 0xFFu)) != byte) break;
    node ^= offset(unit);
    if (node >= units_.size()) break;
    if ((unit >> 8) & 1u) {
      matched = i + 1;
      value = units_[node] & 0x7FFFFFFFu;
    }
  }
  if (matched == 0) return {0, {}};
  if (value >= replacements_.size()) {
    throw Error(path_, "normalizer_spec precompiled_charsmap: a rule points past the replacement strings");
  }
  return {matched, std::string_view(replacements_.data() + value)};
}

// ---- the normalizer --------------------------------------------------------------------------------

SentencePieceNormalizer::SentencePieceNormalizer(const SentencePieceNormalizerSpec& spec,
                                                 const std::vector<std::string>& user_symbols, const std::string& path)
    : spec_(spec), user_symbols_(user_symbols) {
  if (!spec.precompiled_charsmap.empty()) charsmap_ = PrecompiledCharsmap(spec.precompiled_charsmap, path);
}

// sentencepiece's Normalizer::NormalizePrefix: a user-defined symbol as it is, else the longest
// charsmap rule, else one character (a malformed byte: U+FFFD for that byte).
std::pair<size_t, std::string_view> SentencePieceNormalizer::normalize_prefix(std::string_view text) const {
  if (static_cast<unsigned char>(text[0]) < 0x80 && charsmap_.empty() && user_symbols_.empty()) {
    return {1, text.substr(0, 1)};  // the identity rule on ASCII
  }
  if (size_t length = user_symbols_.match(text); length > 0) return {length, text.substr(0, length)};
  if (auto [length, replacement] = charsmap_.longest_match(text); length > 0) return {length, replacement};
  const size_t length = valid_utf8_length(text);
  if (length == 0) return {1, kReplacementCharacter};
  return {length, text.substr(0, length)};
}

void SentencePieceNormalizer::normalize(std::string_view text, std::string& out) const {
  const size_t start = out.size();
  if (spec_.remove_extra_whitespaces) {
    while (!text.empty()) {
      auto [consumed, replacement] = normalize_prefix(text);
      if (replacement != " ") break;
      text.remove_prefix(consumed);
    }
  }
  if (text.empty()) return;
  const std::string_view space = spec_.escape_whitespaces ? kSpaceSymbol : std::string_view(" ");
  if (spec_.add_dummy_prefix) out += space;
  bool previous_was_space = spec_.remove_extra_whitespaces;
  while (!text.empty()) {
    auto [consumed, piece] = normalize_prefix(text);
    if (previous_was_space) {
      while (!piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
    }
    if (!piece.empty()) {
      for (char c : piece) {
        if (c == ' ' && spec_.escape_whitespaces) {
          out += kSpaceSymbol;
        } else {
          out += c;
        }
      }
      previous_was_space = piece.back() == ' ';
    }
    text.remove_prefix(consumed);
    if (!spec_.remove_extra_whitespaces) previous_was_space = false;
  }
  if (spec_.remove_extra_whitespaces) {
    while (out.size() - start >= space.size() && std::string_view(out).substr(out.size() - space.size()) == space) {
      out.resize(out.size() - space.size());
    }
  }
}

}  // namespace mt::text
