// SentencePiece-style tokenizer.json (text/hf_sentencepiece.h): reading the components, encoding as
// tokenizers' BPE model (merge ranks, byte fallback, unknown fusing) and decoding by the decoder chain.
// Tested in tests/unit/text/test_hf_sentencepiece_golden.cpp and tests/tools/mt-tokenize-hf-sentencepiece.bats.
#include "text/hf_sentencepiece.h"

#include <algorithm>
#include <array>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/sentencepiece_model.h"
#include "text/unicode.h"

namespace mt::text {

namespace {

using nlohmann::json;
constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

const json* member(const json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string type_of(const json& node) {
  const json* type = member(node, "type");
  return type != nullptr && type->is_string() ? type->get<std::string>() : std::string();
}

std::string string_member(const json& node, const char* key, const std::string& where) {
  const json* value = member(node, key);
  if (value == nullptr || !value->is_string()) throw Error(where, std::string("has no string ") + key);
  return value->get<std::string>();
}

bool bool_member(const json& node, const char* key, bool fallback, const std::string& where) {
  const json* value = member(node, key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) throw Error(where, std::string(key) + " is not true or false");
  return value->get<bool>();
}

// A Replace component's String pattern (a Regex pattern is refused by name).
std::string replace_pattern(const json& node, const std::string& where) {
  const json* pattern = member(node, "pattern");
  const json* text = pattern != nullptr ? member(*pattern, "String") : nullptr;
  if (text == nullptr || !text->is_string()) throw Error(where, "Replace is supported with a String pattern only");
  if (text->get<std::string>().empty()) throw Error(where, "Replace with an empty pattern");
  return text->get<std::string>();
}

void replace_all(std::string& text, std::string_view pattern, std::string_view content) {
  if (text.find(pattern) == std::string::npos) return;
  std::string out;
  size_t begin = 0;
  for (size_t at; (at = text.find(pattern, begin)) != std::string::npos; begin = at + pattern.size()) {
    out.append(text, begin, at - begin);
    out += content;
  }
  out.append(text, begin);
  text = std::move(out);
}

// The length of the character at text[0]: its UTF-8 length, 1 for a byte that starts none (mt's
// input is sanitized; such bytes still go through, as bytes).
size_t char_length(std::string_view text) {
  const size_t length = utf8_sequence_length(text, 0);
  return length == 0 ? 1 : length;
}

// ByteFallback's test of a token: "<0x" two hex digits of either case ">" (tokenizers' from_str_radix).
int parse_byte_piece_any_case(std::string_view token) {
  if (token.size() != 6) return -1;
  std::string upper(token);
  for (size_t i = 3; i < 5; ++i) {
    if (upper[i] >= 'a' && upper[i] <= 'f') upper[i] = static_cast<char>(upper[i] - 'a' + 'A');
  }
  return parse_byte_piece(upper);
}

// ---- normalizer and pre-tokenizer --------------------------------------------------------------

struct NormalizerStep {
  enum class Kind { prepend, replace } kind;
  std::string pattern;  // replace
  std::string content;  // prepend: the prefix; replace: the replacement
};

std::vector<NormalizerStep> read_normalizer(const json* node, const std::string& path) {
  std::vector<NormalizerStep> steps;
  if (node == nullptr) return steps;
  std::vector<const json*> parts = {node};
  if (type_of(*node) == "Sequence") {
    const json* list = member(*node, "normalizers");
    if (list == nullptr || !list->is_array()) throw Error(path, "normalizer Sequence has no normalizers list");
    parts.clear();
    for (const json& part : *list) parts.push_back(&part);
  }
  for (const json* part : parts) {
    const std::string type = type_of(*part);
    const std::string where = path + ": normalizer " + type;
    if (type == "Prepend") {
      steps.push_back({NormalizerStep::Kind::prepend, "", string_member(*part, "prepend", where)});
    } else if (type == "Replace") {
      steps.push_back({NormalizerStep::Kind::replace, replace_pattern(*part, where), string_member(*part, "content", where)});
    } else {
      throw Error(path, "normalizer " + (type.empty() ? part->dump().substr(0, 100) : type) +
                            " is not supported (Prepend, Replace, or a Sequence of them are)");
    }
  }
  return steps;
}

enum class PrependScheme { always, first, never };

struct Metaspace {
  std::string replacement = std::string(kSentencePieceSpace);
  PrependScheme prepend_scheme = PrependScheme::always;
  bool split = true;
};

// A Metaspace component (pre-tokenizer or decoder): prepend_scheme, or the older add_prefix_space.
Metaspace read_metaspace(const json& node, const std::string& where) {
  Metaspace metaspace;
  metaspace.replacement = string_member(node, "replacement", where);
  if (metaspace.replacement.empty() || char_length(metaspace.replacement) != metaspace.replacement.size()) {
    throw Error(where, "replacement must be one character");
  }
  if (const json* scheme = member(node, "prepend_scheme")) {
    if (*scheme == "always") {
      metaspace.prepend_scheme = PrependScheme::always;
    } else if (*scheme == "first") {
      metaspace.prepend_scheme = PrependScheme::first;
    } else if (*scheme == "never") {
      metaspace.prepend_scheme = PrependScheme::never;
    } else {
      throw Error(where, "prepend_scheme " + scheme->dump() + " is not always, first or never");
    }
  } else {
    metaspace.prepend_scheme = bool_member(node, "add_prefix_space", true, where) ? PrependScheme::always : PrependScheme::never;
  }
  metaspace.split = bool_member(node, "split", true, where);
  return metaspace;
}

std::optional<Metaspace> read_pre_tokenizer(const json* node, const std::string& path) {
  if (node == nullptr) return std::nullopt;
  const std::string type = type_of(*node);
  if (type != "Metaspace") {
    throw Error(path, "pre-tokenizer " + (type.empty() ? node->dump().substr(0, 100) : type) +
                          " is not supported with a normalizer or byte_fallback (Metaspace is)");
  }
  return read_metaspace(*node, path + ": pre-tokenizer Metaspace");
}

// ---- decoder -----------------------------------------------------------------------------------

struct DecoderStep {
  enum class Kind { replace, byte_fallback, fuse, strip, metaspace } kind;
  std::string pattern, content;  // replace; strip: content
  size_t start = 0, stop = 0;    // strip
  Metaspace metaspace;
};

std::vector<DecoderStep> read_decoder(const json* node, const std::string& path) {
  std::vector<DecoderStep> steps;
  if (node == nullptr) return steps;
  std::vector<const json*> parts = {node};
  if (type_of(*node) == "Sequence") {
    const json* list = member(*node, "decoders");
    if (list == nullptr || !list->is_array()) throw Error(path, "decoder Sequence has no decoders list");
    parts.clear();
    for (const json& part : *list) parts.push_back(&part);
  }
  for (const json* part : parts) {
    const std::string type = type_of(*part);
    const std::string where = path + ": decoder " + type;
    DecoderStep step{};
    if (type == "Replace") {
      step.kind = DecoderStep::Kind::replace;
      step.pattern = replace_pattern(*part, where);
      step.content = string_member(*part, "content", where);
    } else if (type == "ByteFallback") {
      step.kind = DecoderStep::Kind::byte_fallback;
    } else if (type == "Fuse") {
      step.kind = DecoderStep::Kind::fuse;
    } else if (type == "Strip") {
      step.kind = DecoderStep::Kind::strip;
      step.content = string_member(*part, "content", where);
      if (step.content.empty() || char_length(step.content) != step.content.size()) {
        throw Error(where, "content must be one character");
      }
      const json* start = member(*part, "start");
      const json* stop = member(*part, "stop");
      if (start == nullptr || !start->is_number_unsigned() || stop == nullptr || !stop->is_number_unsigned()) {
        throw Error(where, "needs unsigned start and stop");
      }
      step.start = start->get<size_t>();
      step.stop = stop->get<size_t>();
    } else if (type == "Metaspace") {
      step.kind = DecoderStep::Kind::metaspace;
      step.metaspace = read_metaspace(*part, where);
    } else {
      throw Error(path, "decoder " + (type.empty() ? part->dump().substr(0, 100) : type) +
                            " is not supported (Replace, ByteFallback, Fuse, Strip, Metaspace, or a Sequence of them are)");
    }
    steps.push_back(std::move(step));
  }
  return steps;
}

// Each decoder's decode_chain over the list of token strings, as tokenizers' decoders.
void apply_decoder(const DecoderStep& step, std::vector<std::string>& tokens) {
  switch (step.kind) {
    case DecoderStep::Kind::replace:
      for (std::string& token : tokens) replace_all(token, step.pattern, step.content);
      return;
    case DecoderStep::Kind::fuse: {
      std::string fused;
      for (const std::string& token : tokens) fused += token;
      tokens.assign(1, std::move(fused));
      return;
    }
    case DecoderStep::Kind::strip:
      for (std::string& token : tokens) {
        size_t cut = 0;
        for (size_t i = 0; i < step.start && token.substr(cut).starts_with(step.content); ++i) cut += step.content.size();
        size_t end = token.size();
        for (size_t i = 0; i < step.stop && end >= cut + step.content.size() &&
                           std::string_view(token).substr(0, end).ends_with(step.content); ++i) {
          end -= step.content.size();
        }
        token = token.substr(cut, end - cut);
      }
      return;
    case DecoderStep::Kind::metaspace:
      for (size_t i = 0; i < tokens.size(); ++i) {
        const bool drop = i == 0 && step.metaspace.prepend_scheme != PrependScheme::never;
        replace_all(tokens[i], step.metaspace.replacement, drop ? "" : " ");
      }
      return;
    case DecoderStep::Kind::byte_fallback: {
      // A run of <0xNN> tokens: their bytes when valid UTF-8, else one U+FFFD per token.
      std::vector<std::string> out;
      std::string bytes;
      size_t run = 0;
      auto flush = [&] {
        if (run == 0) return;
        if (is_valid_utf8(bytes)) {
          out.push_back(bytes);
        } else {
          for (size_t i = 0; i < run; ++i) out.emplace_back(kReplacementCharacter);
        }
        bytes.clear();
        run = 0;
      };
      for (std::string& token : tokens) {
        const int byte = parse_byte_piece_any_case(token);
        if (byte >= 0) {
          bytes.push_back(static_cast<char>(byte));
          ++run;
          continue;
        }
        flush();
        out.push_back(std::move(token));
      }
      flush();
      tokens = std::move(out);
      return;
    }
  }
}

// ---- the tokenizer -----------------------------------------------------------------------------

struct ViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};

struct AddedToken {
  std::string text;
  int32_t id;
};

class HfSentencePieceTokenizer final : public Tokenizer {
 public:
  HfSentencePieceTokenizer(const json& root, const std::string& path, HfSentencePieceFrame frame);

  void encode(std::string_view text, std::vector<int32_t>& out, bool allow_special) const override;
  std::span<const int32_t> sequence_prefix() const override { return frame_.sequence_prefix; }
  std::span<const int32_t> sequence_suffix() const override { return frame_.sequence_suffix; }
  std::string decode(std::span<const int32_t> ids) const override;
  std::string token_bytes(int32_t id) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  std::optional<int32_t> eod_id() const override { return eod_; }
  std::optional<int32_t> special_token_id(std::string_view text) const override;
  std::string name() const override { return frame_.name; }
  std::string hash() const override { return frame_.hash; }
  bool encodes_parts_alike() const override { return false; }  // a part's start may get a "▁"

 private:
  struct Merge {
    uint32_t rank;
    int32_t merged;
  };
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t length;  // 0: merged into its left neighbour
  };
  struct Candidate {
    uint32_t rank;
    int32_t position;
    int32_t merged;
  };
  struct CandidateOrder {  // tokenizers' Merge ordering: lowest rank first, then leftmost
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.position > b.position);
    }
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  void read_model(const json& model, const std::string& path);
  void read_merges(const json& merges, const std::string& path);
  void read_added_tokens(const json& root, const std::string& path);
  void encode_part(std::string_view part, bool at_text_start, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_part(std::string_view word, std::vector<int32_t>& out) const;
  void initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const;
  bool can_cut_before_space_symbol() const;
  void merge_symbols(std::vector<Symbol>& symbols) const;
  std::optional<Merge> find_merge(int32_t left, int32_t right) const;

  HfSentencePieceFrame frame_;
  std::vector<std::string> tokens_;                     // by id (model vocab, then added tokens)
  std::unordered_map<std::string, int32_t, ViewHash, std::equal_to<>> vocab_;  // the model's vocab
  std::array<int32_t, 256> byte_ids_{};  // the <0xNN> tokens' ids, -1 where absent
  bool cut_words_ = false;               // see can_cut_before_replacement
  std::unordered_map<uint64_t, Merge> merges_;
  std::vector<AddedToken> added_;                       // longest first
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::vector<NormalizerStep> normalizer_;
  std::optional<Metaspace> metaspace_;
  std::vector<DecoderStep> decoder_;
  std::optional<int32_t> eod_;
};

HfSentencePieceTokenizer::HfSentencePieceTokenizer(const json& root, const std::string& path, HfSentencePieceFrame frame)
    : frame_(std::move(frame)) {
  const json* model = member(root, "model");
  if (model == nullptr || !model->is_object()) throw Error(path, "no model object");
  read_model(*model, path);
  read_added_tokens(root, path);
  normalizer_ = read_normalizer(member(root, "normalizer"), path);
  metaspace_ = read_pre_tokenizer(member(root, "pre_tokenizer"), path);
  decoder_ = read_decoder(member(root, "decoder"), path);
  for (int byte = 0; byte < 256; ++byte) {
    auto it = vocab_.find(byte_piece_name(byte));
    byte_ids_[byte] = it == vocab_.end() ? -1 : it->second;
  }
  cut_words_ = can_cut_before_space_symbol();
  for (const char* eod : {"<|endoftext|>", "<|end_of_text|>", "</s>"}) {  // the byte-level files' rule
    if ((eod_ = special_token_id(eod))) break;
  }
}

void HfSentencePieceTokenizer::read_model(const json& model, const std::string& path) {
  const json* type = member(model, "type");
  if (type != nullptr && *type != "BPE") throw Error(path, "model type " + type->dump() + " is not BPE");
  const std::string where = path + ": model";
  if (member(model, "dropout") != nullptr) throw Error(where, "BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* value = member(model, key);
    if (value != nullptr && !(value->is_string() && value->get<std::string>().empty())) {
      throw Error(where, std::string(key) + " is not supported");
    }
  }
  fuse_unk_ = bool_member(model, "fuse_unk", false, where);
  byte_fallback_ = bool_member(model, "byte_fallback", false, where);
  ignore_merges_ = bool_member(model, "ignore_merges", false, where);
  const json* vocab = member(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) throw Error(where, "has no vocab object");
  for (const auto& [text, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX / 2) {
      throw Error(where, "vocab entry \"" + text + "\" has a bad id " + id.dump());
    }
    const auto index = id.get<int32_t>();
    if (tokens_.size() <= static_cast<size_t>(index)) tokens_.resize(static_cast<size_t>(index) + 1);
    if (!tokens_[index].empty()) throw Error(where, "vocab id " + std::to_string(index) + " is given twice");
    if (text.empty()) throw Error(where, "vocab holds an empty token");
    tokens_[index] = text;
    vocab_.emplace(text, index);
  }
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (tokens_[id].empty()) throw Error(where, "vocab has no token with id " + std::to_string(id));
  }
  if (const json* unk = member(model, "unk_token")) {
    if (!unk->is_string() || !vocab_.contains(unk->get<std::string>())) {
      throw Error(where, "unk_token " + unk->dump() + " is not in the vocab");
    }
    unk_id_ = vocab_.at(unk->get<std::string>());
  }
  const json* merges = member(model, "merges");
  if (merges == nullptr || !merges->is_array()) throw Error(where, "has no merges list");
  read_merges(*merges, path);
}

void HfSentencePieceTokenizer::read_merges(const json& merges, const std::string& path) {
  uint32_t rank = 0;
  for (const json& merge : merges) {
    const std::string where = path + ": merge " + std::to_string(rank);
    std::string left, right;
    if (merge.is_string()) {
      const std::string& line = merge.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        throw Error(where, "not two tokens separated by a space: " + line);
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      throw Error(where, "not a \"a b\" string or an [a, b] pair");
    }
    auto id_of = [&](const std::string& token) {
      auto it = vocab_.find(token);
      if (it == vocab_.end()) throw Error(where, "token \"" + token + "\" is not in the vocab");
      return it->second;
    };
    const int32_t left_id = id_of(left), right_id = id_of(right), merged = id_of(left + right);
    merges_[pair_key(left_id, right_id)] = {rank, merged};  // a repeated pair: the later line, as tokenizers
    ++rank;
  }
}

void HfSentencePieceTokenizer::read_added_tokens(const json& root, const std::string& path) {
  const json* added = member(root, "added_tokens");
  if (added == nullptr) return;
  if (!added->is_array()) throw Error(path, "added_tokens is not a list");
  for (const json& token : *added) {
    const json* id = member(token, "id");
    const json* content = member(token, "content");
    if (id == nullptr || !id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() > INT32_MAX / 2 ||
        content == nullptr || !content->is_string() || content->get<std::string>().empty()) {
      throw Error(path, "added token without a valid id and non-empty string content");
    }
    const std::string text = content->get<std::string>();
    const std::string where = path + ": added token " + text;
    for (const char* key : {"lstrip", "rstrip", "single_word", "normalized"}) {
      if (bool_member(token, key, false, where)) throw Error(where, std::string("uses ") + key + ", which is not supported");
    }
    const auto index = id->get<int32_t>();
    if (tokens_.size() <= static_cast<size_t>(index)) tokens_.resize(static_cast<size_t>(index) + 1);
    if (!tokens_[index].empty() && tokens_[index] != text) {
      throw Error(where, "has id " + std::to_string(index) + ", which the vocab gives to \"" + tokens_[index] + "\"");
    }
    tokens_[index] = text;
    added_.push_back({text, index});
  }
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (tokens_[id].empty()) throw Error(path, "no token has id " + std::to_string(id));
  }
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.text.size() > b.text.size(); });
}

// Whether BPE over a word gives the same ids as BPE over its parts cut before each run of U+2581
// that follows another character: it does when no merge can join a character to a following
// U+2581, i.e. no token holds U+2581 after anything but U+2581 (SentencePiece's pieces never do),
// U+2581 is a token (so it also ends a run of unknown characters), and ignore_merges does not look
// the whole word up. A speed-up only: merges in different parts never meet.
bool HfSentencePieceTokenizer::can_cut_before_space_symbol() const {
  if (ignore_merges_ || !vocab_.contains(kSentencePieceSpace)) return false;
  for (const auto& [token, id] : vocab_) {
    const std::string_view text = token;
    for (size_t at = text.find(kSentencePieceSpace, 1); at != std::string_view::npos;
         at = text.find(kSentencePieceSpace, at + 1)) {
      if (!text.substr(0, at).ends_with(kSentencePieceSpace)) return false;
    }
  }
  return true;
}

std::optional<int32_t> HfSentencePieceTokenizer::special_token_id(std::string_view text) const {
  for (const AddedToken& token : added_) {
    if (token.text == text) return token.id;
  }
  return std::nullopt;
}

// ---- encoding ----------------------------------------------------------------------------------------

void HfSentencePieceTokenizer::encode(std::string_view text, std::vector<int32_t>& out, bool allow_special) const {
  if (!allow_special || added_.empty()) {
    encode_part(text, true, out);
    return;
  }
  // tokenizers' added-vocabulary split: the leftmost match, the longest there.
  size_t begin = 0;
  for (size_t at = 0; at < text.size();) {
    const AddedToken* found = nullptr;
    for (const AddedToken& token : added_) {
      if (text.substr(at).starts_with(token.text)) {
        found = &token;
        break;
      }
    }
    if (found == nullptr) {
      ++at;
      continue;
    }
    encode_part(text.substr(begin, at - begin), begin == 0, out);
    out.push_back(found->id);
    at += found->text.size();
    begin = at;
  }
  encode_part(text.substr(begin), begin == 0, out);
}

// One part of the text between added tokens: normalizer, Metaspace, then BPE on each word.
void HfSentencePieceTokenizer::encode_part(std::string_view part, bool at_text_start, std::vector<int32_t>& out) const {
  if (part.empty()) return;
  std::string normalized(part);
  for (const NormalizerStep& step : normalizer_) {
    if (step.kind == NormalizerStep::Kind::prepend) {
      if (!normalized.empty()) normalized.insert(0, step.content);
    } else {
      replace_all(normalized, step.pattern, step.content);
    }
  }
  if (!metaspace_) {
    encode_word(normalized, out);
    return;
  }
  const std::string& replacement = metaspace_->replacement;
  replace_all(normalized, " ", replacement);
  const bool prepend = metaspace_->prepend_scheme == PrependScheme::always ||
                       (metaspace_->prepend_scheme == PrependScheme::first && at_text_start);
  if (prepend && !normalized.empty() && !normalized.starts_with(replacement)) normalized.insert(0, replacement);
  if (!metaspace_->split) {
    encode_word(normalized, out);
    return;
  }
  // MergedWithNext: each replacement starts a word.
  const std::string_view text = normalized;
  size_t begin = 0;
  for (size_t at = text.find(replacement, 1); at != std::string_view::npos; at = text.find(replacement, at + 1)) {
    encode_word(text.substr(begin, at - begin), out);
    begin = at;
  }
  encode_word(text.substr(begin), out);
}

void HfSentencePieceTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (!cut_words_) {
    merge_part(word, out);
    return;
  }
  for (size_t begin = 0; begin < word.size();) {
    size_t end = begin;
    while (word.substr(end).starts_with(kSentencePieceSpace)) end += kSentencePieceSpace.size();
    end = std::min(word.find(kSentencePieceSpace, end), word.size());
    merge_part(word.substr(begin, end - begin), out);
    begin = end;
  }
}

void HfSentencePieceTokenizer::merge_part(std::string_view word, std::vector<int32_t>& out) const {
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  initial_symbols(word, symbols);
  merge_symbols(symbols);
  for (const Symbol& symbol : symbols) {
    if (symbol.length > 0) out.push_back(symbol.id);
  }
}

// tokenizers' BPE::merge_word before merging: each character its token, else (byte_fallback) its
// bytes' <0xNN> tokens when all exist, else the unknown token (a run of them one with fuse_unk).
void HfSentencePieceTokenizer::initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const {
  auto add = [&](int32_t id, uint32_t length) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, length});
  };
  int32_t pending_unknown = -1;  // the unknown id not yet added, and the bytes it covers
  uint32_t pending_length = 0;
  for (size_t at = 0; at < word.size();) {
    const size_t length = std::min(char_length(word.substr(at)), word.size() - at);
    const std::string_view character = word.substr(at, length);
    at += length;
    if (auto it = vocab_.find(character); it != vocab_.end()) {
      if (pending_unknown >= 0) add(pending_unknown, pending_length);
      pending_unknown = -1;
      add(it->second, static_cast<uint32_t>(length));
      continue;
    }
    if (byte_fallback_ && std::all_of(character.begin(), character.end(),
                                      [&](char byte) { return byte_ids_[static_cast<unsigned char>(byte)] >= 0; })) {
      for (char byte : character) add(byte_ids_[static_cast<unsigned char>(byte)], 1);
      continue;
    }
    if (!unk_id_) {
      throw Error("encode", "character \"" + std::string(character) + "\" is not in the vocab and the model has no unk_token");
    }
    if (pending_unknown >= 0 && fuse_unk_) {
      pending_length += static_cast<uint32_t>(length);
    } else {
      if (pending_unknown >= 0) add(pending_unknown, pending_length);
      pending_unknown = *unk_id_;
      pending_length = static_cast<uint32_t>(length);
    }
  }
  if (pending_unknown >= 0) add(pending_unknown, pending_length);
  if (!symbols.empty()) symbols.back().next = -1;
}

std::optional<HfSentencePieceTokenizer::Merge> HfSentencePieceTokenizer::find_merge(int32_t left, int32_t right) const {
  auto it = merges_.find(pair_key(left, right));
  if (it == merges_.end()) return std::nullopt;
  return it->second;
}

// tokenizers' Word::merge_all: the lowest-ranked pair first (leftmost on ties), stale entries skipped.
void HfSentencePieceTokenizer::merge_symbols(std::vector<Symbol>& symbols) const {
  thread_local std::vector<Candidate> queue;
  queue.clear();
  auto push = [&](int32_t position) {
    const int32_t next = symbols[position].next;
    if (next < 0) return;
    if (auto merge = find_merge(symbols[position].id, symbols[next].id)) {
      queue.push_back({merge->rank, position, merge->merged});
      std::push_heap(queue.begin(), queue.end(), CandidateOrder{});
    }
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) push(static_cast<int32_t>(i));
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), CandidateOrder{});
    const Candidate top = queue.back();
    queue.pop_back();
    Symbol& left = symbols[top.position];
    if (left.length == 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const auto merge = find_merge(left.id, right.id);
    if (!merge || merge->merged != top.merged) continue;
    left.id = top.merged;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.position;
    if (left.prev >= 0) push(left.prev);
    push(top.position);
  }
}

// ---- decoding ----------------------------------------------------------------------------------------

std::string HfSentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw Error("decode", "id " + std::to_string(id) + " is outside [0, " + std::to_string(vocab_size()) + ")");
    }
    tokens.push_back(tokens_[static_cast<size_t>(id)]);
  }
  for (const DecoderStep& step : decoder_) apply_decoder(step, tokens);
  std::string text;
  for (const std::string& token : tokens) text += token;
  return text;
}

std::string HfSentencePieceTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) throw Error("token_bytes", "id " + std::to_string(id) + " is out of range");
  const std::string& token = tokens_[static_cast<size_t>(id)];
  if (special_token_id(token) == id) return token;
  if (const int byte = parse_byte_piece(token); byte_fallback_ && byte >= 0) return std::string(1, static_cast<char>(byte));
  std::string text = token;
  replace_all(text, metaspace_ ? std::string_view(metaspace_->replacement) : kSentencePieceSpace, " ");
  return text;
}

}  // namespace

bool is_hf_sentencepiece_json(const json& root) {
  const json* model = member(root, "model");
  if (model == nullptr || !(type_of(*model).empty() || type_of(*model) == "BPE")) return false;
  const json* byte_fallback = member(*model, "byte_fallback");
  const json* pre_tokenizer = member(root, "pre_tokenizer");
  return pre_tokenizer == nullptr || type_of(*pre_tokenizer) == "Metaspace" ||
         (byte_fallback != nullptr && byte_fallback->is_boolean() && byte_fallback->get<bool>());
}

std::unique_ptr<Tokenizer> make_hf_sentencepiece_tokenizer(const json& root, const std::string& path,
                                                           HfSentencePieceFrame frame) {
  return std::make_unique<HfSentencePieceTokenizer>(root, path, std::move(frame));
}

}  // namespace mt::text
