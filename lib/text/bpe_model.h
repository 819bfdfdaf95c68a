// The merge engine shared by every byte-level BPE tokenizer of text/tokenizer.h: a vocabulary of
// byte strings, the id of each single byte, and a pair table (left id, right id) -> (priority,
// merged id). tiktoken's rule (merge the adjacent pair whose concatenation has the lowest rank)
// is the pair table with priority = the merged token's rank; GPT-2 / Hugging Face merges are the
// pair table with priority = the line of the merge. Both take the lowest priority, leftmost on
// ties: a linear scan for short pieces, a heap over a linked list (stale entries skipped) for
// long ones, so a pathological piece costs O(n log n). Internal to lib/text; tested through
// tests/unit/text/test_tokenizer.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mt::text {

class BpeModel {
 public:
  BpeModel();
  // Adds a token; ids may leave holes. Throws mt::Error (naming `source`) for a duplicate id.
  void add_token(int32_t id, std::string_view bytes, const std::string& source);
  // Once every token is added: builds the byte-string index that find() and
  // add_merges_from_vocabulary need; throws mt::Error naming `source` for a duplicate byte string.
  void index_tokens(const std::string& source);
  // Declares the merge of `left` and `right` (existing ids) into `merged` with `priority`
  // (lower merges first). A pair declared again takes the later declaration, as the references'
  // dictionaries built from a merges list do.
  void add_merge(int32_t left, int32_t right, uint32_t priority, int32_t merged);
  // tiktoken's rule: for every token, every split into two tokens becomes a merge whose priority
  // is the token's rank (`priority_of_id(id)`).
  template <class PriorityOfId>
  void add_merges_from_vocabulary(PriorityOfId priority_of_id);
  // After index_tokens and the merges: checks that every single byte is a token and builds the
  // pair table; throws mt::Error naming `source` otherwise.
  void finish(const std::string& source);

  // For merge-list models: finds the tokens whose own bytes merge back into themselves, so a
  // piece that is such a token can skip merging with the same result (a shortcut, not tiktoken's
  // rule: a token that merges into something else still merges).
  void find_self_merging_tokens();

  std::optional<int32_t> find(std::string_view bytes) const { return find_hashed(bytes, hash_bytes(bytes)); }
  bool has_id(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < tokens_.size() && present_[id]; }
  std::string_view bytes_of(int32_t id) const { return tokens_[id]; }
  int32_t id_count() const { return static_cast<int32_t>(tokens_.size()); }

  // Appends the ids of one pre-tokenized piece. With whole_piece_lookup a piece that is itself a
  // token becomes that token without merging (tiktoken; Hugging Face ignore_merges). The ids of
  // pieces up to 22 bytes are kept in a per-thread cache (4 MiB for each of the last four models
  // a thread used), so concurrent calls are safe: nothing shared is written.
  void encode_piece(std::string_view piece, bool whole_piece_lookup, std::vector<int32_t>& out) const;

 private:
  struct Pair {
    uint64_t key = kEmptyKey;
    uint32_t priority = 0;
    int32_t merged = -1;
  };
  static constexpr uint64_t kEmptyKey = ~uint64_t{0};
  static constexpr uint32_t kNoMerge = ~uint32_t{0};

  // A slot of the token index: the key's hash, and its bytes inline when short (one cache line
  // read per lookup for most tokens); longer keys are compared with tokens_[id].
  struct alignas(32) TokenSlot {
    uint64_t hash = 0;
    int32_t id = -1;     // -1: empty
    uint8_t length = 0;  // min(key length, 255)
    char key[19] = {};
  };
  static constexpr size_t kInlineKeyBytes = sizeof(TokenSlot::key);

  static uint64_t hash_bytes(std::string_view bytes);
  std::optional<int32_t> find_hashed(std::string_view bytes, uint64_t hash) const;
  const Pair* find_pair(int32_t left, int32_t right) const;
  uint32_t pair_priority(int32_t left, int32_t right, int32_t& merged) const;
  // Appends the ids the merge rule gives for `piece` (no cache, no whole-piece lookup).
  void merge(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_short(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_long(std::string_view piece, std::vector<int32_t>& out) const;
  void build_pair_index();

  std::vector<std::string> tokens_;  // by id
  std::vector<uint8_t> present_;
  std::vector<uint8_t> merges_to_itself_;  // by id; empty until find_self_merging_tokens
  std::vector<TokenSlot> token_slots_;     // open addressing over token bytes
  uint64_t token_mask_ = 0;
  std::vector<Pair> pending_pairs_;
  std::vector<Pair> pair_slots_;  // open addressing over (left, right)
  uint64_t pair_mask_ = 0;
  int32_t byte_ids_[256] = {};
  uint64_t cache_owner_;  // tells this model's entries in the per-thread cache from others'
};

template <class PriorityOfId>
void BpeModel::add_merges_from_vocabulary(PriorityOfId priority_of_id) {
  for (int32_t id = 0; id < id_count(); ++id) {
    if (!present_[id]) continue;
    std::string_view bytes = bytes_of(id);
    for (size_t split = 1; split < bytes.size(); ++split) {
      auto left = find(bytes.substr(0, split));
      if (!left) continue;
      auto right = find(bytes.substr(split));
      if (!right) continue;
      add_merge(*left, *right, priority_of_id(id), id);
    }
  }
}

}  // namespace mt::text
