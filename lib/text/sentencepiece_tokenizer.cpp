// SentencePiece BPE: the loader's checks, encoding (normalize, BPE by piece scores, byte fallback)
// and decoding (text/sentencepiece_tokenizer.h).
// Tested in tests/unit/text/test_sentencepiece.cpp and tests/unit/text/test_sentencepiece_golden.cpp.
#include "text/sentencepiece_tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "text/sentencepiece_model.h"
#include "text/sentencepiece_normalizer.h"

namespace mt::text {

namespace {

constexpr std::string_view kSpaceSymbol = kSentencePieceSpace;
constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

struct ViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
using PieceIndex = std::unordered_map<std::string_view, int32_t, ViewHash, std::equal_to<>>;

// sentencepiece's OneCharLen: the length a UTF-8 lead byte announces (1 for a stray trail byte),
// at most what is left.
size_t one_char_length(std::string_view text) {
  static constexpr uint8_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  const size_t length = kLengths[static_cast<unsigned char>(text[0]) >> 4];
  return std::min(length, text.size());
}

// Per-thread cache of a word's ids for the last tokenizer a thread used: direct-mapped slots of
// one cache line each, holding words of up to 22 bytes that give up to 8 ids (most words; longer
// ones are encoded each time). One memory access per lookup, where a node-based map takes three.
struct WordSlot {
  uint64_t hash = 0;
  uint8_t length = 0;  // 0: empty
  uint8_t count = 0;
  char word[22];
  int32_t ids[8];
};
static_assert(sizeof(WordSlot) == 64);
struct WordCache {
  static constexpr size_t kSlots = size_t{1} << 15;  // 2 MiB a thread
  uint64_t owner = 0;
  std::vector<WordSlot> slots;
};
constexpr size_t kMaxCachedWordBytes = sizeof(WordSlot::word);
constexpr size_t kMaxCachedWordIds = sizeof(WordSlot::ids) / sizeof(int32_t);
std::atomic<uint64_t> next_cache_owner{1};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& type, const std::string& path, SentencePieceModelProto model,
                         const std::string& hash);

  void encode(std::string_view text, std::vector<int32_t>& out, bool allow_special) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  std::string token_bytes(int32_t id) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(pieces_.size()); }
  std::optional<int32_t> eod_id() const override { return eos_id_; }
  std::optional<int32_t> special_token_id(std::string_view text) const override;
  std::string name() const override { return type_; }
  std::string hash() const override { return hash_; }
  bool encodes_parts_alike() const override { return false; }  // each part would get a dummy prefix

 private:
  struct Symbol {
    uint32_t begin, length;
    int32_t prev, next;
    bool frozen;
  };
  struct Pair {
    float score;
    int32_t left, right;
    uint32_t length;
  };
  struct PairOrder {  // sentencepiece's SymbolPairComparator: higher score first, then leftmost
    bool operator()(const Pair& a, const Pair& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };

  PieceType type_of(int32_t id) const { return pieces_[static_cast<size_t>(id)].type; }
  int32_t piece_to_id(std::string_view piece) const;
  bool check_word_cuts() const;
  void check_model(const std::string& path) const;
  void encode_normalized(std::string_view normalized, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& ids) const;
  void emit_piece(std::string_view piece, std::vector<int32_t>& ids) const;
  void append_collapsing_unknown(std::span<const int32_t> ids, std::vector<int32_t>& out, bool& previous_unknown) const;
  void decode_bytes(std::span<const int32_t> ids, std::string& text) const;

  std::string type_;
  std::string hash_;
  std::vector<SentencePieceEntry> pieces_;
  SentencePieceTrainerSpec trainer_;
  SentencePieceNormalizerSpec normalizer_spec_;
  PieceIndex normal_ids_;    // NORMAL, USER_DEFINED, UNUSED (sentencepiece's pieces_)
  PieceIndex reserved_ids_;  // CONTROL, UNKNOWN, BYTE (sentencepiece's reserved_id_map_)
  std::vector<std::string> user_symbols_;
  std::unique_ptr<UserSymbolMatcher> matcher_;
  std::unique_ptr<SentencePieceNormalizer> normalizer_;
  int32_t unk_id_ = -1;
  std::optional<int32_t> eos_id_;
  std::array<int32_t, 256> byte_ids_{};
  std::vector<int16_t> byte_of_id_;  // -1: not a byte piece
  bool any_unused_ = false;
  bool cut_words_ = false;
  uint64_t cache_owner_ = next_cache_owner.fetch_add(1);
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& type, const std::string& path,
                                               SentencePieceModelProto model, const std::string& hash)
    : type_(type), hash_(hash), pieces_(std::move(model.pieces)), trainer_(model.trainer),
      normalizer_spec_(model.normalizer) {
  if (model.denormalizer.present && !model.denormalizer.precompiled_charsmap.empty()) {
    throw Error(path, "a denormalizer_spec is not supported");
  }
  byte_of_id_.assign(pieces_.size(), -1);
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const SentencePieceEntry& entry = pieces_[i];
    const auto id = static_cast<int32_t>(i);
    const bool normal = entry.type == PieceType::normal || entry.type == PieceType::user_defined ||
                        entry.type == PieceType::unused;
    if (entry.piece.empty()) throw Error(path, "piece " + std::to_string(i) + " is empty");
    if (!(normal ? normal_ids_ : reserved_ids_).emplace(entry.piece, id).second) {
      throw Error(path, "piece " + std::to_string(i) + " \"" + entry.piece + "\" is already defined");
    }
    if (entry.type == PieceType::user_defined) user_symbols_.push_back(entry.piece);
    if (entry.type == PieceType::unused) any_unused_ = true;
    if (entry.type == PieceType::unknown) {
      if (unk_id_ >= 0) throw Error(path, "more than one unknown piece (" + std::to_string(unk_id_) + " and " + std::to_string(i) + ")");
      unk_id_ = id;
    }
    if (entry.type == PieceType::byte) {
      if (!trainer_.byte_fallback) throw Error(path, "byte piece " + entry.piece + " in a model without byte_fallback");
      const int value = parse_byte_piece(entry.piece);
      if (value < 0) {
        throw Error(path, "byte piece " + std::to_string(i) + " \"" + entry.piece + "\" is not <0xNN>");
      }
      byte_of_id_[i] = static_cast<int16_t>(value);
    }
  }
  check_model(path);
  for (int byte = 0; byte < 256; ++byte) byte_ids_[byte] = piece_to_id(byte_piece_name(byte));
  const int32_t eos = piece_to_id(trainer_.eos_piece);
  if (type_of(eos) == PieceType::control) eos_id_ = eos;
  matcher_ = std::make_unique<UserSymbolMatcher>(user_symbols_);
  normalizer_ = std::make_unique<SentencePieceNormalizer>(normalizer_spec_, user_symbols_, path);
  cut_words_ = check_word_cuts();
}

void SentencePieceTokenizer::check_model(const std::string& path) const {
  static const char* const kModelTypes[] = {"", "UNIGRAM", "BPE", "WORD", "CHAR"};
  if (trainer_.model_type != 2) {
    const int t = trainer_.model_type;
    throw Error(path, std::string("model_type ") + (t >= 1 && t <= 4 ? kModelTypes[t] : std::to_string(t).c_str()) +
                          " is not supported (only BPE)");
  }
  if (!normalizer_spec_.present) throw Error(path, "not a valid SentencePiece model: it has no normalizer_spec (cut short?)");
  if (unk_id_ < 0) throw Error(path, "the model has no unknown piece");
  if (trainer_.treat_whitespace_as_suffix) throw Error(path, "treat_whitespace_as_suffix is not supported");
  if (!normalizer_spec_.normalization_rule_tsv.empty()) {
    throw Error(path, "normalizer_spec normalization_rule_tsv is not supported (a precompiled charsmap is)");
  }
  if (!normalizer_spec_.precompiled_charsmap.empty() && normalizer_spec_.name == "identity") {
    throw Error(path, "normalizer_spec is named identity but carries a charsmap");
  }
}

int32_t SentencePieceTokenizer::piece_to_id(std::string_view piece) const {
  if (auto it = reserved_ids_.find(piece); it != reserved_ids_.end()) return it->second;
  if (auto it = normal_ids_.find(piece); it != normal_ids_.end()) return it->second;
  return unk_id_;
}

// Whether the normalized text may be cut before each U+2581 that follows another character: no
// piece that BPE can make or the matcher can take holds a character followed by U+2581.
bool SentencePieceTokenizer::check_word_cuts() const {
  if (!normalizer_spec_.escape_whitespaces) return false;
  for (const auto& [piece, id] : normal_ids_) {
    for (size_t at = piece.find(kSpaceSymbol, 1); at != std::string_view::npos; at = piece.find(kSpaceSymbol, at + 1)) {
      if (piece.substr(0, at).ends_with(kSpaceSymbol)) continue;
      return false;
    }
  }
  return true;
}

// ---- encoding ----------------------------------------------------------------------------------------

void SentencePieceTokenizer::encode(std::string_view text, std::vector<int32_t>& out, bool allow_special) const {
  if (allow_special) {
    throw UsageError("--allow-special", "does not apply to " + type_ +
                                            ": sentencepiece (and Megatron-Core's wrapper) never turns control-piece text into ids");
  }
  thread_local std::string normalized;
  normalized.clear();
  normalizer_->normalize(text, normalized);
  encode_normalized(normalized, out);
}

void SentencePieceTokenizer::encode_normalized(std::string_view normalized, std::vector<int32_t>& out) const {
  if (normalized.empty()) return;
  bool previous_unknown = false;
  thread_local std::vector<int32_t> word_ids;
  if (!cut_words_) {
    word_ids.clear();
    encode_word(normalized, word_ids);
    append_collapsing_unknown(word_ids, out, previous_unknown);
    return;
  }
  thread_local WordCache cache;
  if (cache.owner != cache_owner_) {
    cache.slots.assign(WordCache::kSlots, WordSlot{});
    cache.owner = cache_owner_;
  }
  size_t begin = 0;
  while (begin < normalized.size()) {
    // The next cut: a U+2581 after a character that is not one.
    size_t end = begin;
    while (end < normalized.size() && normalized.substr(end).starts_with(kSpaceSymbol)) end += kSpaceSymbol.size();
    end = normalized.find(kSpaceSymbol, end);
    if (end == std::string_view::npos) end = normalized.size();
    const std::string_view word = normalized.substr(begin, end - begin);
    begin = end;
    if (word.size() > kMaxCachedWordBytes) {
      word_ids.clear();
      encode_word(word, word_ids);
      append_collapsing_unknown(word_ids, out, previous_unknown);
      continue;
    }
    const uint64_t hash = std::hash<std::string_view>{}(word);
    WordSlot& slot = cache.slots[hash & (WordCache::kSlots - 1)];
    if (slot.hash == hash && slot.length == word.size() && std::memcmp(slot.word, word.data(), word.size()) == 0) {
      append_collapsing_unknown(std::span<const int32_t>(slot.ids, slot.count), out, previous_unknown);
      continue;
    }
    word_ids.clear();
    encode_word(word, word_ids);
    if (word_ids.size() <= kMaxCachedWordIds) {
      slot.hash = hash;
      slot.length = static_cast<uint8_t>(word.size());
      slot.count = static_cast<uint8_t>(word_ids.size());
      std::memcpy(slot.word, word.data(), word.size());
      std::copy(word_ids.begin(), word_ids.end(), slot.ids);
    }
    append_collapsing_unknown(word_ids, out, previous_unknown);
  }
}

// Without byte fallback sentencepiece gives a run of unknown pieces one id.
void SentencePieceTokenizer::append_collapsing_unknown(std::span<const int32_t> ids, std::vector<int32_t>& out,
                                                       bool& previous_unknown) const {
  if (trainer_.byte_fallback) {
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  for (int32_t id : ids) {
    const bool unknown = type_of(id) == PieceType::unknown;
    if (!(unknown && previous_unknown)) out.push_back(id);
    previous_unknown = unknown;
  }
}

// sentencepiece's bpe::Model::Encode over one part of the normalized text, then each final piece's
// ids (emit_piece).
void SentencePieceTokenizer::encode_word(std::string_view word, std::vector<int32_t>& ids) const {
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Pair> heap;
  symbols.clear();
  heap.clear();
  for (size_t at = 0; at < word.size();) {
    size_t length = matcher_->match(word.substr(at));
    const bool frozen = length > 0;
    if (!frozen) length = one_char_length(word.substr(at));
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(at), static_cast<uint32_t>(length), index - 1,
                       at + length < word.size() ? index + 1 : -1, frozen});
    at += length;
  }
  std::vector<std::pair<std::string_view, std::pair<std::string_view, std::string_view>>> unused_splits;
  auto piece_of = [&](const Symbol& s) { return word.substr(s.begin, s.length); };
  auto add_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0 || symbols[left].frozen || symbols[right].frozen) return;
    const std::string_view piece = word.substr(symbols[left].begin, symbols[left].length + symbols[right].length);
    auto it = normal_ids_.find(piece);
    if (it == normal_ids_.end()) return;
    heap.push_back({pieces_[it->second].score, left, right, static_cast<uint32_t>(piece.size())});
    std::push_heap(heap.begin(), heap.end(), PairOrder{});
    if (type_of(it->second) == PieceType::unused) {
      unused_splits.push_back({piece, {piece_of(symbols[left]), piece_of(symbols[right])}});
    }
  };
  for (size_t i = 1; i < symbols.size(); ++i) add_pair(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), PairOrder{});
    const Pair top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    if (left.length == 0 || right.length == 0 || left.length + right.length != top.length) continue;
    left.length += right.length;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    right.length = 0;
    add_pair(left.prev, top.left);
    add_pair(top.left, left.next);
  }
  // UNUSED pieces are split back into the pair that made them (sentencepiece's resegment).
  auto resegment = [&](auto& self, std::string_view piece) -> void {
    const int32_t id = piece_to_id(piece);
    if (any_unused_ && type_of(id) == PieceType::unused) {
      for (auto it = unused_splits.rbegin(); it != unused_splits.rend(); ++it) {
        if (it->first == piece) {
          self(self, it->second.first);
          self(self, it->second.second);
          return;
        }
      }
    }
    emit_piece(piece, ids);
  };
  for (int32_t index = symbols.empty() ? -1 : 0; index >= 0; index = symbols[index].next) {
    resegment(resegment, piece_of(symbols[index]));
  }
}

// A final piece's id; an unknown piece as its bytes' <0xNN> ids with byte fallback.
void SentencePieceTokenizer::emit_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  const int32_t id = piece_to_id(piece);
  if (type_of(id) == PieceType::unknown && trainer_.byte_fallback) {
    for (char byte : piece) ids.push_back(byte_ids_[static_cast<unsigned char>(byte)]);
    return;
  }
  ids.push_back(id);
}

// ---- decoding ----------------------------------------------------------------------------------------

// A run of byte pieces: their bytes as UTF-8, each byte that does not start a valid character
// U+FFFD (sentencepiece's ProcessBytePieces).
void SentencePieceTokenizer::decode_bytes(std::span<const int32_t> ids, std::string& text) const {
  std::string bytes;
  for (int32_t id : ids) bytes.push_back(static_cast<char>(byte_of_id_[static_cast<size_t>(id)]));
  for (size_t at = 0; at < bytes.size();) {
    const size_t length = valid_utf8_length(std::string_view(bytes).substr(at));
    if (length == 0) {
      text += kReplacementCharacter;
      ++at;
    } else {
      text.append(bytes, at, length);
      at += length;
    }
  }
}

std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw Error("decode", "id " + std::to_string(id) + " is outside [0, " + std::to_string(vocab_size()) + ")");
    }
  }
  std::string text;
  const bool strip_first_space = normalizer_spec_.add_dummy_prefix || normalizer_spec_.remove_extra_whitespaces;
  bool expect_first_space = true;  // sentencepiece's is_bos_ws
  bool first_space_seen = false;   // bos_ws_seen
  size_t byte_start = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (byte_of_id_[static_cast<size_t>(id)] >= 0) continue;
    decode_bytes(ids.subspan(byte_start, i - byte_start), text);
    byte_start = i + 1;
    if (first_space_seen || !text.empty()) expect_first_space = false;
    first_space_seen = false;
    const PieceType type = type_of(id);
    if (type == PieceType::control) continue;
    if (type == PieceType::unknown) {
      text += trainer_.unk_surface;
      continue;
    }
    std::string_view piece = pieces_[static_cast<size_t>(id)].piece;
    if (expect_first_space && strip_first_space && piece.starts_with(kSpaceSymbol)) {
      piece.remove_prefix(kSpaceSymbol.size());
      first_space_seen = !normalizer_spec_.remove_extra_whitespaces;
    }
    for (size_t at = 0; at < piece.size();) {
      if (piece.substr(at).starts_with(kSpaceSymbol)) {
        text += ' ';
        at += kSpaceSymbol.size();
      } else {
        text += piece[at++];
      }
    }
  }
  decode_bytes(ids.subspan(byte_start), text);
  return text;
}

std::string SentencePieceTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) throw Error("token_bytes", "id " + std::to_string(id) + " is out of range");
  if (byte_of_id_[static_cast<size_t>(id)] >= 0) return std::string(1, static_cast<char>(byte_of_id_[static_cast<size_t>(id)]));
  const SentencePieceEntry& entry = pieces_[static_cast<size_t>(id)];
  if (entry.type == PieceType::control || entry.type == PieceType::unknown) return entry.piece;
  std::string text;
  for (size_t at = 0; at < entry.piece.size();) {
    if (std::string_view(entry.piece).substr(at).starts_with(kSpaceSymbol)) {
      text += ' ';
      at += kSpaceSymbol.size();
    } else {
      text += entry.piece[at++];
    }
  }
  return text;
}

std::optional<int32_t> SentencePieceTokenizer::special_token_id(std::string_view text) const {
  auto it = reserved_ids_.find(text);
  if (it == reserved_ids_.end() || type_of(it->second) != PieceType::control) return std::nullopt;
  return it->second;
}

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& type, const std::string& path,
                                                        std::string_view bytes, const std::string& hash) {
  return std::make_unique<SentencePieceTokenizer>(type, path, parse_sentencepiece_model(bytes, path), hash);
}

bool is_sentencepiece_type(std::string_view type) {
  return type == "SentencePieceTokenizer" || type == "GPTSentencePieceTokenizer" || type == "Llama2Tokenizer";
}

}  // namespace mt::text
