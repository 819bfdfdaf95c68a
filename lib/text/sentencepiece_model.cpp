// Reading the SentencePiece ModelProto from its protobuf wire format (text/sentencepiece_model.h).
// Tested in tests/unit/text/test_sentencepiece.cpp.
#include "text/sentencepiece_model.h"

#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace mt::text {

namespace {

enum WireType : int { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };

// One message's bytes, read field by field. Every error names the file, the message and the
// byte offset in the file.
class WireReader {
 public:
  WireReader(std::string_view bytes, size_t file_offset, const std::string& path, std::string message)
      : bytes_(bytes), file_offset_(file_offset), path_(path), message_(std::move(message)) {}

  bool done() const { return position_ >= bytes_.size(); }

  // The next field's number and wire type.
  std::pair<uint32_t, int> next_tag() {
    const uint64_t tag = read_varint("a field tag");
    const auto number = static_cast<uint32_t>(tag >> 3);
    const int type = static_cast<int>(tag & 7);
    if (number == 0) fail("field number 0 (not a protobuf message)");
    if (type != varint && type != fixed64 && type != length_delimited && type != fixed32) {
      fail("field " + std::to_string(number) + " has wire type " + std::to_string(type) +
           " (groups or an invalid type: not a SentencePiece model)");
    }
    field_ = number;
    return {number, type};
  }

  uint64_t read_varint(const char* what = nullptr) {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (position_ >= bytes_.size()) fail(std::string("cut short inside ") + (what ? what : field_name()));
      const auto byte = static_cast<unsigned char>(bytes_[position_++]);
      value |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    fail(std::string("a varint longer than 10 bytes in ") + (what ? what : field_name()));
  }

  std::string_view read_bytes() {
    const uint64_t length = read_varint();
    if (length > bytes_.size() - position_) {
      fail("cut short: " + field_name() + " holds " + std::to_string(length) + " bytes, " +
           std::to_string(bytes_.size() - position_) + " remain");
    }
    std::string_view value = bytes_.substr(position_, length);
    position_ += length;
    return value;
  }

  // A bool or string field whose wire type `type` must be the one its kind has.
  bool read_bool(int type) {
    expect(type, varint);
    return read_varint() != 0;
  }
  std::string read_string(int type) {
    expect(type, length_delimited);
    return std::string(read_bytes());
  }

  float read_float() {
    if (bytes_.size() - position_ < 4) fail("cut short inside " + field_name());
    uint32_t word = 0;
    for (int i = 0; i < 4; ++i) word |= uint32_t{static_cast<unsigned char>(bytes_[position_ + i])} << (8 * i);
    position_ += 4;
    float value;
    std::memcpy(&value, &word, sizeof value);
    return value;
  }

  void skip(int type) {
    if (type == varint) {
      read_varint();
    } else if (type == length_delimited) {
      read_bytes();
    } else {
      const size_t width = type == fixed64 ? 8 : 4;
      if (bytes_.size() - position_ < width) fail("cut short inside " + field_name());
      position_ += width;
    }
  }

  // Reads a field of the expected wire type or fails naming it.
  void expect(int type, int wanted) {
    if (type != wanted) fail(field_name() + " has wire type " + std::to_string(type) + ", expected " + std::to_string(wanted));
  }

  // A reader over a nested message just read with read_bytes().
  WireReader nested(std::string_view bytes, std::string message) const {
    return WireReader(bytes, file_offset_ + static_cast<size_t>(bytes.data() - bytes_.data()), path_, std::move(message));
  }

  [[noreturn]] void fail(const std::string& why) const {
    throw Error(path_, "not a valid SentencePiece model: " + message_ + ": " + why + " (at byte " +
                           std::to_string(file_offset_ + position_) + ")");
  }

 private:
  std::string field_name() const { return "field " + std::to_string(field_); }

  std::string_view bytes_;
  size_t position_ = 0;
  size_t file_offset_;
  const std::string& path_;
  std::string message_;
  uint32_t field_ = 0;
};

SentencePieceEntry parse_piece(WireReader reader) {
  SentencePieceEntry entry;
  bool has_piece = false;
  while (!reader.done()) {
    auto [number, type] = reader.next_tag();
    if (number == 1) {
      reader.expect(type, length_delimited);
      entry.piece = std::string(reader.read_bytes());
      has_piece = true;
    } else if (number == 2) {
      reader.expect(type, fixed32);
      entry.score = reader.read_float();
    } else if (number == 3) {
      reader.expect(type, varint);
      const uint64_t value = reader.read_varint();
      if (value < 1 || value > 6) reader.fail("piece type " + std::to_string(value) + " is not one of 1..6");
      entry.type = static_cast<PieceType>(value);
    } else {
      reader.skip(type);
    }
  }
  if (!has_piece) reader.fail("a piece without its text");
  return entry;
}

SentencePieceTrainerSpec parse_trainer_spec(WireReader reader) {
  SentencePieceTrainerSpec spec;
  while (!reader.done()) {
    const auto [number, wire_type] = reader.next_tag();
    const int type = wire_type;  // a plain variable: clang before 16 cannot capture a structured binding
    auto flag = [&] { return reader.read_bool(type); };
    auto text = [&] { return reader.read_string(type); };
    switch (number) {
      case 3:
        reader.expect(type, varint);
        spec.model_type = static_cast<int>(reader.read_varint());
        break;
      case 35: spec.byte_fallback = flag(); break;
      case 24: spec.treat_whitespace_as_suffix = flag(); break;
      case 44:
        spec.unk_surface = text();
        spec.has_unk_surface = true;
        break;
      case 45: spec.unk_piece = text(); break;
      case 46: spec.bos_piece = text(); break;
      case 47: spec.eos_piece = text(); break;
      case 48: spec.pad_piece = text(); break;
      default: reader.skip(type);
    }
  }
  return spec;
}

SentencePieceNormalizerSpec parse_normalizer_spec(WireReader reader) {
  SentencePieceNormalizerSpec spec;
  spec.present = true;
  while (!reader.done()) {
    const auto [number, wire_type] = reader.next_tag();
    const int type = wire_type;  // a plain variable: clang before 16 cannot capture a structured binding
    auto flag = [&] { return reader.read_bool(type); };
    auto text = [&] { return reader.read_string(type); };
    switch (number) {
      case 1: spec.name = text(); break;
      case 2: spec.precompiled_charsmap = text(); break;
      case 3: spec.add_dummy_prefix = flag(); break;
      case 4: spec.remove_extra_whitespaces = flag(); break;
      case 5: spec.escape_whitespaces = flag(); break;
      case 6: spec.normalization_rule_tsv = text(); break;
      default: reader.skip(type);
    }
  }
  return spec;
}

}  // namespace

SentencePieceModelProto parse_sentencepiece_model(std::string_view bytes, const std::string& path) {
  if (bytes.empty()) throw Error(path, "not a valid SentencePiece model: the file is empty");
  SentencePieceModelProto model;
  WireReader reader(bytes, 0, path, "ModelProto");
  while (!reader.done()) {
    auto [number, type] = reader.next_tag();
    if (number >= 1 && number <= 5 && number != 4) reader.expect(type, length_delimited);
    switch (number) {
      case 1:
        model.pieces.push_back(parse_piece(reader.nested(reader.read_bytes(), "piece " + std::to_string(model.pieces.size()))));
        break;
      case 2: model.trainer = parse_trainer_spec(reader.nested(reader.read_bytes(), "trainer_spec")); break;
      case 3: model.normalizer = parse_normalizer_spec(reader.nested(reader.read_bytes(), "normalizer_spec")); break;
      case 5: model.denormalizer = parse_normalizer_spec(reader.nested(reader.read_bytes(), "denormalizer_spec")); break;
      default: reader.skip(type);
    }
  }
  if (model.pieces.empty()) throw Error(path, "not a valid SentencePiece model: it has no pieces");
  return model;
}

std::string byte_piece_name(int byte) {
  char buffer[8];
  std::snprintf(buffer, sizeof buffer, "<0x%02X>", byte);
  return buffer;
}

int parse_byte_piece(std::string_view piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return -1;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

}  // namespace mt::text
