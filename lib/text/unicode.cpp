// Unicode classes, case folding and UTF-8 handling over the generated Unicode 15.0.0 tables
// (unicode_tables.inc, from scripts/gen_unicode_tables.py). Tested in tests/unit/text/test_unicode.cpp.
#include "text/unicode.h"

#include <string_view>

namespace mt::text {

namespace {

#include "text/unicode_tables.inc"

static_assert(std::string_view(kUnicodeTablesVersion) == kUnicodeVersion,
              "unicode_tables.inc was generated from another Unicode version");

constexpr uint8_t kClassMask = 7;
constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr char32_t kReplacementCharacter = 0xFFFD;

bool class_in(char32_t cp, unsigned class_bits) { return (class_bits >> (code_point_class(cp) & kClassMask)) & 1u; }

constexpr unsigned bit(CodePointClass c) { return 1u << c; }

bool is_continuation(unsigned char byte) { return (byte & 0xC0) == 0x80; }

// The valid range of the second byte of a sequence led by `lead` (Unicode table 3-7), or
// {0, 0} for a byte that cannot lead.
struct ByteRange {
  unsigned char low, high;
};
ByteRange second_byte_range(unsigned char lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return {0x80, 0xBF};
  if (lead == 0xE0) return {0xA0, 0xBF};
  if (lead == 0xED) return {0x80, 0x9F};
  if (lead >= 0xE1 && lead <= 0xEF) return {0x80, 0xBF};
  if (lead == 0xF0) return {0x90, 0xBF};
  if (lead >= 0xF1 && lead <= 0xF3) return {0x80, 0xBF};
  if (lead == 0xF4) return {0x80, 0x8F};
  return {0, 0};
}

size_t sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// Length of the well-formed sequence at bytes[pos], or 0 with `prefix` set to the length of its
// maximal valid prefix (at least 1: the byte itself is replaced).
size_t well_formed_length(std::string_view bytes, size_t pos, size_t& prefix) {
  auto lead = static_cast<unsigned char>(bytes[pos]);
  if (lead < 0x80) return 1;
  ByteRange range = second_byte_range(lead);
  prefix = 1;
  if (range.low == 0) return 0;
  size_t length = sequence_length(lead);
  for (size_t i = 1; i < length; ++i) {
    if (pos + i >= bytes.size()) return 0;
    auto byte = static_cast<unsigned char>(bytes[pos + i]);
    bool ok = i == 1 ? (byte >= range.low && byte <= range.high) : is_continuation(byte);
    if (!ok) return 0;
    prefix = i + 1;
  }
  return length;
}

}  // namespace

size_t utf8_sequence_length(std::string_view bytes, size_t pos) {
  size_t prefix = 0;
  return well_formed_length(bytes, pos, prefix);
}

uint8_t code_point_class(char32_t cp) {
  if (cp > kMaxCodePoint) return kOther;
  return kClassBlocks[kClassBlockOfCodePoint[cp >> kClassBlockShift]][cp & ((1u << kClassBlockShift) - 1)];
}

bool is_letter(char32_t cp) { return class_in(cp, bit(kLu) | bit(kLl) | bit(kLt) | bit(kLm) | bit(kLo)); }
bool is_uppercase_like(char32_t cp) { return class_in(cp, bit(kLu) | bit(kLt) | bit(kLm) | bit(kLo) | bit(kMark)); }
bool is_lowercase_like(char32_t cp) { return class_in(cp, bit(kLl) | bit(kLm) | bit(kLo) | bit(kMark)); }
bool is_number(char32_t cp) { return class_in(cp, bit(kNumber)); }
bool is_mark(char32_t cp) { return class_in(cp, bit(kMark)); }
bool is_whitespace(char32_t cp) { return (code_point_class(cp) & kWhiteSpaceBit) != 0; }
bool is_assigned(char32_t cp) { return (code_point_class(cp) & kAssignedBit) != 0; }

char ascii_case_fold(char32_t cp) {
  if (cp >= 'a' && cp <= 'z') return static_cast<char>(cp);
  if (cp >= 'A' && cp <= 'Z') return static_cast<char>(cp - 'A' + 'a');
  for (const auto& fold : kFoldsToAsciiLetter) {
    if (fold.code_point == cp) return fold.ascii_letter;
  }
  return 0;
}

char32_t decode_utf8(std::string_view text, size_t& pos) {
  auto byte = [&](size_t i) { return static_cast<char32_t>(static_cast<unsigned char>(text[pos + i])); };
  char32_t lead = byte(0);
  if (lead < 0x80) {
    pos += 1;
    return lead;
  }
  if (lead < 0xE0) {
    char32_t cp = ((lead & 0x1F) << 6) | (byte(1) & 0x3F);
    pos += 2;
    return cp;
  }
  if (lead < 0xF0) {
    char32_t cp = ((lead & 0x0F) << 12) | ((byte(1) & 0x3F) << 6) | (byte(2) & 0x3F);
    pos += 3;
    return cp;
  }
  char32_t cp = ((lead & 0x07) << 18) | ((byte(1) & 0x3F) << 12) | ((byte(2) & 0x3F) << 6) | (byte(3) & 0x3F);
  pos += 4;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t sanitize_utf8(std::string_view bytes, std::string& out) {
  out.clear();
  out.reserve(bytes.size());
  size_t replaced = 0;
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t prefix = 0;
    size_t length = well_formed_length(bytes, pos, prefix);
    if (length > 0) {
      out.append(bytes.substr(pos, length));
      pos += length;
    } else {
      append_utf8(out, kReplacementCharacter);
      ++replaced;
      pos += prefix;
    }
  }
  return replaced;
}

bool is_valid_utf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (static_cast<unsigned char>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t prefix = 0;
    size_t length = well_formed_length(bytes, pos, prefix);
    if (length == 0) return false;
    pos += length;
  }
  return true;
}

}  // namespace mt::text
