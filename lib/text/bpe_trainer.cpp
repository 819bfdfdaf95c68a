// Byte-level BPE vocabulary training and GPT-2 two-file output (see bpe_trainer.h).
// Tested in tests/unit/text/test_bpe_trainer.cpp.
#include "text/bpe_trainer.h"


#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <queue>
#include <set>
#include <unordered_set>

#include "core/error.h"
#include "core/temporary_file.h"
#include "text/unicode.h"

namespace mt::text {

namespace {

struct ByteTables {
  std::array<char32_t, 256> chars{};  // byte -> bytes_to_unicode character
  std::array<int32_t, 256> ids{};     // byte -> GPT-2 id
  std::vector<uint8_t> order;         // GPT-2 id -> byte
};

const ByteTables& byte_tables() {
  static const ByteTables tables = [] {
    ByteTables t;
    std::vector<bool> printable(256, false);
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    int next = 0;
    for (int b = 0; b < 256; ++b) t.chars[b] = printable[b] ? char32_t(b) : char32_t(256 + next++);
    // GPT-2's encoder.json numbers the bytes in the order of their characters (the printable
    // bytes first, then the remapped ones), which is also how HF numbers its sorted alphabet.
    for (int b = 0; b < 256; ++b) t.order.push_back(uint8_t(b));
    std::sort(t.order.begin(), t.order.end(),
              [&](uint8_t x, uint8_t y) { return t.chars[x] < t.chars[y]; });
    for (int id = 0; id < 256; ++id) t.ids[t.order[id]] = id;
    return t;
  }();
  return tables;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}
int32_t pair_left(uint64_t key) { return int32_t(key >> 32); }
int32_t pair_right(uint64_t key) { return int32_t(key & 0xffffffffu); }

// A candidate merge in the queue; its count may be stale (never below the true count).
struct QueueEntry {
  int64_t count;
  uint64_t pair;
  // std::priority_queue pops the largest: highest count, then smallest (left, right).
  bool operator<(const QueueEntry& other) const {
    if (count != other.count) return count < other.count;
    return pair > other.pair;
  }
};

struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

// The merge state: words as token ids, the count of every adjacent pair weighted by word counts,
// and for each pair the words it was seen in (a superset: entries go stale as words change).
class MergeState {
 public:
  explicit MergeState(std::vector<Word> words) : words_(std::move(words)), last_visit_(words_.size(), -1) {
    for (uint32_t w = 0; w < words_.size(); ++w) {
      const auto& s = words_[w].symbols;
      for (size_t i = 0; i + 1 < s.size(); ++i) add(pair_key(s[i], s[i + 1]), words_[w].count, w);
    }
    for (const auto& [pair, count] : pair_counts_)
      if (count > 0) queue_.push({count, pair});
  }

  // The most frequent pair (ties: smallest ids) if its count reaches min_count.
  bool next(int64_t min_count, uint64_t& pair) {
    while (!queue_.empty()) {
      QueueEntry top = queue_.top();
      queue_.pop();
      auto it = pair_counts_.find(top.pair);
      int64_t current = it == pair_counts_.end() ? 0 : it->second;
      if (current != top.count) {
        if (current > 0) queue_.push({current, top.pair});
        continue;
      }
      if (current < min_count) return false;
      pair = top.pair;
      return true;
    }
    return false;
  }

  // Replaces every occurrence of `pair` (left to right, non-overlapping) by `token`.
  void apply(uint64_t pair, int32_t token) {
    ++step_;
    auto where = where_.find(pair);
    std::vector<uint32_t> words;
    if (where != where_.end()) {
      words = std::move(where->second);
      where_.erase(where);
    }
    const int32_t a = pair_left(pair), b = pair_right(pair);
    touched_.clear();
    for (uint32_t w : words) {
      if (last_visit_[w] == step_) continue;
      last_visit_[w] = step_;
      auto& s = words_[w].symbols;
      const int64_t count = words_[w].count;
      scratch_.clear();
      size_t i = 0;
      bool changed = false;
      while (i < s.size()) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          if (!scratch_.empty()) {
            add(pair_key(scratch_.back(), a), -count, w);
            add(pair_key(scratch_.back(), token), count, w);
          }
          if (i + 2 < s.size()) {
            add(pair_key(b, s[i + 2]), -count, w);
            add(pair_key(token, s[i + 2]), count, w);
          }
          scratch_.push_back(token);
          i += 2;
          changed = true;
        } else {
          scratch_.push_back(s[i]);
          ++i;
        }
      }
      if (changed) s.swap(scratch_);
    }
    pair_counts_.erase(pair);
    std::sort(touched_.begin(), touched_.end());
    touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
    for (uint64_t p : touched_) {
      auto it = pair_counts_.find(p);
      if (it != pair_counts_.end() && it->second > 0) queue_.push({it->second, p});
    }
  }

 private:
  void add(uint64_t pair, int64_t delta, uint32_t w) {
    auto it = pair_counts_.try_emplace(pair, 0).first;
    it->second += delta;
    if (delta > 0) {
      auto& list = where_[pair];
      if (list.empty() || list.back() != w) list.push_back(w);
      touched_.push_back(pair);
    } else if (it->second == 0) {
      pair_counts_.erase(it);
    }
  }

  std::vector<Word> words_;
  std::vector<int64_t> last_visit_;
  std::unordered_map<uint64_t, int64_t> pair_counts_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where_;
  std::priority_queue<QueueEntry> queue_;
  std::vector<uint64_t> touched_;
  std::vector<int32_t> scratch_;
  int64_t step_ = 0;
};

void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  out += '"';
}

void write_file(const std::string& path, const std::string& contents) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw Error(path, std::strerror(errno));
  bool ok = std::fwrite(contents.data(), 1, contents.size(), f) == contents.size();
  int saved = errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    saved = errno;
  }
  if (!ok) {
    std::remove(path.c_str());
    throw Error(path, std::strerror(saved));
  }
}

}  // namespace

void validate(const BpeTrainerOptions& options) {
  const int64_t minimum = 256 + int64_t(options.special_tokens.size());
  if (options.vocab_size < minimum)
    throw UsageError("vocab_size", std::to_string(options.vocab_size) + " is below " + std::to_string(minimum) +
                                       " (256 byte tokens + " + std::to_string(options.special_tokens.size()) +
                                       " special tokens)");
  if (options.vocab_size > std::numeric_limits<int32_t>::max())
    throw UsageError("vocab_size", std::to_string(options.vocab_size) + " does not fit 32-bit token ids");
  if (options.min_frequency < 1)
    throw UsageError("min_frequency", std::to_string(options.min_frequency) + " is below 1");
  std::set<std::string_view> seen;
  for (const auto& special : options.special_tokens) {
    if (special.empty()) throw UsageError("special_tokens", "a special token is empty");
    if (!seen.insert(special).second) throw UsageError("special_tokens", "'" + special + "' is given twice");
  }
}

BpeTrainer::BpeTrainer(BpeTrainerOptions options) : options_(std::move(options)) { validate(options_); }

void BpeTrainer::add_piece(std::string_view piece, int64_t count) {
  if (piece.empty() || count <= 0) return;
  auto it = counts_.find(piece);
  if (it == counts_.end()) it = counts_.emplace(std::string(piece), 0).first;
  it->second += count;
  total_pieces_ += count;
}

void BpeTrainer::add_text(std::string_view text) {
  std::string sanitized;
  if (!is_valid_utf8(text)) {
    sanitize_utf8(text, sanitized);
    text = sanitized;
  }
  pretokenize(options_.pattern, text, [&](std::string_view piece) { add_piece(piece); });
}

void BpeTrainer::merge(const BpeTrainer& other) {
  if (other.options_.pattern != options_.pattern)
    throw UsageError("pattern", "cannot merge counts pre-tokenized with different patterns");
  for (const auto& [piece, count] : other.counts_) add_piece(piece, count);
}

BpeVocabulary BpeTrainer::train(const std::function<void(int64_t, int64_t)>& progress) const {
  const ByteTables& tables = byte_tables();
  BpeVocabulary vocab;
  for (uint8_t b : tables.order) vocab.tokens.emplace_back(1, char(b));

  std::vector<Word> words;
  words.reserve(counts_.size());
  for (const auto& [piece, count] : counts_) {
    Word word{{}, count};
    word.symbols.reserve(piece.size());
    for (unsigned char c : piece) word.symbols.push_back(tables.ids[c]);
    words.push_back(std::move(word));
  }
  MergeState state(std::move(words));

  std::unordered_map<std::string, int32_t> ids;
  for (int32_t id = 0; id < 256; ++id) ids.emplace(vocab.tokens[id], id);
  std::unordered_set<uint64_t> merged;
  const int64_t learned_target = options_.vocab_size - int64_t(options_.special_tokens.size());
  uint64_t pair = 0;
  while (int64_t(vocab.tokens.size()) < learned_target) {
    if (!state.next(options_.min_frequency, pair)) {
      vocab.exhausted = true;
      break;
    }
    const std::string& left = vocab.tokens[pair_left(pair)];
    const std::string& right = vocab.tokens[pair_right(pair)];
    std::string joined = left + right;
    auto [it, is_new] = ids.try_emplace(joined, int32_t(vocab.tokens.size()));
    if (merged.insert(pair).second) vocab.merges.emplace_back(left, right);
    if (is_new) vocab.tokens.push_back(std::move(joined));
    state.apply(pair, it->second);
    if (progress && is_new && vocab.tokens.size() % 1000 == 0) progress(int64_t(vocab.tokens.size()), options_.vocab_size);
  }

  std::unordered_set<std::string> texts;
  for (const auto& token : vocab.tokens) texts.insert(gpt2_token_text(token));
  for (const auto& special : options_.special_tokens) {
    if (texts.count(special))
      throw UsageError("special_tokens", "'" + special + "' is also the text of a byte or learned token");
    vocab.tokens.push_back(special);
  }
  vocab.num_special_tokens = int64_t(options_.special_tokens.size());
  if (progress) progress(int64_t(vocab.tokens.size()), options_.vocab_size);
  return vocab;
}

char32_t gpt2_byte_char(uint8_t b) { return byte_tables().chars[b]; }

const std::vector<uint8_t>& byte_token_order() { return byte_tables().order; }

std::string gpt2_token_text(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) append_utf8(out, gpt2_byte_char(c));
  return out;
}

void write_gpt2_files(const BpeVocabulary& vocab, const std::string& encoder_json_path,
                      const std::string& vocab_bpe_path) {
  if (vocab.num_special_tokens < 0 || size_t(vocab.num_special_tokens) > vocab.tokens.size() ||
      vocab.tokens.size() - size_t(vocab.num_special_tokens) < 256)
    throw Error(encoder_json_path, "the vocabulary lacks its 256 byte tokens or special tokens");
  const size_t first_special = vocab.tokens.size() - size_t(vocab.num_special_tokens);
  std::string encoder = "{";
  for (size_t id = 0; id < vocab.tokens.size(); ++id) {
    if (id) encoder += ", ";
    append_json_string(encoder, id < first_special ? gpt2_token_text(vocab.tokens[id]) : vocab.tokens[id]);
    encoder += ": ";
    encoder += std::to_string(id);
  }
  encoder += "}";
  std::string merges = "#version: 0.2\n";
  for (const auto& [left, right] : vocab.merges) {
    merges += gpt2_token_text(left);
    merges += ' ';
    merges += gpt2_token_text(right);
    merges += '\n';
  }
  TemporaryFile encoder_tmp(encoder_json_path), merges_tmp(vocab_bpe_path);  // removed if anything fails
  write_file(encoder_tmp.path(), encoder);
  write_file(merges_tmp.path(), merges);
  encoder_tmp.commit();
  merges_tmp.commit();
}

}  // namespace mt::text
