// The SentencePiece model file (`tokenizer.model`, `spm_train`'s `.model`): a serialized protobuf
// ModelProto (sentencepiece_model.proto), read by our own reader of the protobuf wire format. Why
// not Debian's libprotobuf: the schema we need is four small messages whose fields we name below;
// generated code would add protoc and a library to the build for ~150 lines of varint parsing, and
// would accept the same files. Unknown fields are skipped as protobuf does (newer trainers add
// fields); a file that is not valid wire format, is cut short, or lacks what a BPE model needs is
// an mt::Error naming the file and what is wrong.
// Tested in tests/unit/text/test_sentencepiece.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mt::text {

// ModelProto.SentencePiece.Type
enum class PieceType : int { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

struct SentencePieceEntry {
  std::string piece;
  float score = 0.0f;
  PieceType type = PieceType::normal;
};

// NormalizerSpec (proto defaults where the field is absent).
struct SentencePieceNormalizerSpec {
  bool present = false;
  std::string name;
  std::string precompiled_charsmap;  // empty: identity
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
  std::string normalization_rule_tsv;
};

// The TrainerSpec fields that change encoding or decoding (proto defaults where absent).
struct SentencePieceTrainerSpec {
  int model_type = 1;  // UNIGRAM = 1, BPE = 2, WORD = 3, CHAR = 4
  bool byte_fallback = false;
  bool treat_whitespace_as_suffix = false;
  bool has_unk_surface = false;
  std::string unk_surface = " \xE2\x81\x87 ";  // " ⁇ ", sentencepiece's kDefaultUnknownSymbol
  std::string unk_piece = "<unk>", bos_piece = "<s>", eos_piece = "</s>", pad_piece = "<pad>";
};

struct SentencePieceModelProto {
  std::vector<SentencePieceEntry> pieces;
  SentencePieceTrainerSpec trainer;
  SentencePieceNormalizerSpec normalizer;
  SentencePieceNormalizerSpec denormalizer;
};

// U+2581, the character that stands for a space in pieces (shared with text/hf_sentencepiece.h).
inline constexpr std::string_view kSentencePieceSpace = "\xE2\x96\x81";
// A byte piece's name, "<0xNN>" with NN in upper-case hex (byte_fallback's pieces).
std::string byte_piece_name(int byte);
// The byte a piece of that form names, or -1 for any other piece.
int parse_byte_piece(std::string_view piece);

// Parses the bytes of a .model file; `path` names it in errors.
SentencePieceModelProto parse_sentencepiece_model(std::string_view bytes, const std::string& path);

}  // namespace mt::text
