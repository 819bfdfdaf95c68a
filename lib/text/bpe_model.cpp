// The BPE merge engine (see bpe_model.h). Tested through tests/unit/text/test_tokenizer.cpp.
#include "text/bpe_model.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <span>
#include <utility>

#include "core/error.h"

namespace mt::text {

uint64_t BpeModel::hash_bytes(std::string_view bytes) {
  uint64_t hash = 0x9E3779B97F4A7C15ull ^ bytes.size();
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t chunk;
    std::memcpy(&chunk, bytes.data() + i, 8);
    hash = (hash ^ chunk) * 0xFF51AFD7ED558CCDull;
    hash ^= hash >> 32;
  }
  uint64_t tail = 0;
  for (size_t shift = 0; i < bytes.size(); ++i, shift += 8) {
    tail |= uint64_t{static_cast<unsigned char>(bytes[i])} << shift;
  }
  hash = (hash ^ tail) * 0xC4CEB9FE1A85EC53ull;
  hash ^= hash >> 29;
  return hash;
}

namespace {

// Pieces up to this many bytes merge by rescanning a priority array (cheap for short pieces);
// longer ones use the heap.
constexpr size_t kShortPieceBytes = 40;

uint64_t hash_pair_key(uint64_t key) {
  key ^= key >> 33;
  key *= 0xFF51AFD7ED558CCDull;
  key ^= key >> 33;
  return key;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
}

size_t table_size_for(size_t count) {
  size_t size = 16;
  while (size < count * 2) size <<= 1;
  return size;
}

// Scratch space of the long-piece merge, reused by each thread.
struct MergeScratch {
  std::vector<int32_t> ids;
  std::vector<uint32_t> next;
  std::vector<uint32_t> prev;
  std::vector<uint64_t> heap;
};

// Per-thread cache of piece -> ids for the last few models a thread used: 4-way set-associative
// slots of one cache line each, holding pieces of up to kMaxPieceBytes that merge into up to
// kMaxIds ids. A new piece enters a set first (its last slot is dropped) and a hit moves one place
// up, so frequent pieces stay. 64K slots hold the distinct pieces of a long book.
class PieceCache {
 public:
  static constexpr size_t kMaxPieceBytes = 22;
  static constexpr size_t kMaxIds = 8;
  static constexpr int kWays = 4;

  struct alignas(64) Slot {
    uint64_t hash = 0;
    uint8_t piece_length = 0;  // 0: empty (cached pieces have at least 2 bytes)
    uint8_t id_count = 0;
    char piece[kMaxPieceBytes] = {};
    int32_t ids[kMaxIds] = {};

    bool holds(std::string_view key, uint64_t key_hash) const {
      if (hash != key_hash || piece_length != key.size()) return false;
      size_t i = 0;
      for (; i + 8 <= key.size(); i += 8) {
        uint64_t mine, theirs;
        std::memcpy(&mine, piece + i, 8);
        std::memcpy(&theirs, key.data() + i, 8);
        if (mine != theirs) return false;
      }
      for (; i < key.size(); ++i) {
        if (piece[i] != key[i]) return false;
      }
      return true;
    }
  };
  static_assert(sizeof(Slot) == 64);

  // The slot of `set` holding `piece`, moved one place up, or nullptr.
  static const Slot* lookup(Slot* set, std::string_view piece, uint64_t hash) {
    for (int way = 0; way < kWays; ++way) {
      if (!set[way].holds(piece, hash)) continue;
      if (way == 0) return &set[0];
      std::swap(set[way], set[way - 1]);
      return &set[way - 1];
    }
    return nullptr;
  }

  // Enters `piece` first in `set` when its ids fit.
  static void store(Slot* set, std::string_view piece, uint64_t hash, std::span<const int32_t> ids) {
    if (ids.size() > kMaxIds) return;
    std::copy_backward(set, set + kWays - 1, set + kWays);
    Slot& slot = set[0];
    slot.hash = hash;
    slot.piece_length = static_cast<uint8_t>(piece.size());
    slot.id_count = static_cast<uint8_t>(ids.size());
    std::memcpy(slot.piece, piece.data(), piece.size());
    std::copy(ids.begin(), ids.end(), slot.ids);
  }

  // The calling thread's kWays slots for a piece hashed as `hash` of the model `owner`.
  static Slot* set_for(uint64_t owner, uint64_t hash) {
    thread_local std::array<PieceCache, kModelsPerThread> caches;
    thread_local size_t next_victim = 0;
    PieceCache* cache = nullptr;
    for (auto& candidate : caches) {
      if (candidate.owner_ == owner) cache = &candidate;
    }
    if (cache == nullptr) {
      cache = &caches[next_victim];
      next_victim = (next_victim + 1) % kModelsPerThread;
      cache->owner_ = owner;
      cache->slots_.assign(kSlots, Slot{});
    }
    return &cache->slots_[hash & (kSlots - kWays)];
  }

 private:
  static constexpr size_t kModelsPerThread = 4;
  static constexpr size_t kSlots = size_t{1} << 16;
  uint64_t owner_ = 0;
  std::vector<Slot> slots_;
};

std::atomic<uint64_t> next_cache_owner{1};

}  // namespace

BpeModel::BpeModel() : cache_owner_(next_cache_owner.fetch_add(1)) {}

void BpeModel::add_token(int32_t id, std::string_view bytes, const std::string& source) {
  if (id < 0) throw Error(source, "negative token id " + std::to_string(id));
  if (static_cast<size_t>(id) >= tokens_.size()) {
    tokens_.resize(static_cast<size_t>(id) + 1);
    present_.resize(static_cast<size_t>(id) + 1, 0);
  }
  if (present_[id]) throw Error(source, "token id " + std::to_string(id) + " appears twice");
  tokens_[id] = std::string(bytes);
  present_[id] = 1;
}

void BpeModel::index_tokens(const std::string& source) {
  size_t count = 0;
  for (uint8_t present : present_) count += present;
  token_slots_.assign(table_size_for(count), TokenSlot{});
  token_mask_ = token_slots_.size() - 1;
  for (int32_t id = 0; id < id_count(); ++id) {
    if (!present_[id]) continue;
    const std::string& bytes = tokens_[id];
    uint64_t hash = hash_bytes(bytes);
    if (auto existing = find_hashed(bytes, hash)) {
      throw Error(source, "ids " + std::to_string(*existing) + " and " + std::to_string(id) + " have the same bytes");
    }
    uint64_t slot = hash & token_mask_;
    while (token_slots_[slot].id >= 0) slot = (slot + 1) & token_mask_;
    TokenSlot& entry = token_slots_[slot];
    entry.hash = hash;
    entry.id = id;
    entry.length = static_cast<uint8_t>(std::min<size_t>(bytes.size(), 255));
    std::memcpy(entry.key, bytes.data(), std::min(bytes.size(), kInlineKeyBytes));
  }
}

std::optional<int32_t> BpeModel::find_hashed(std::string_view bytes, uint64_t hash) const {
  if (token_slots_.empty()) return std::nullopt;
  const auto length = static_cast<uint8_t>(std::min<size_t>(bytes.size(), 255));
  uint64_t slot = hash & token_mask_;
  while (true) {
    const TokenSlot& entry = token_slots_[slot];
    if (entry.id < 0) return std::nullopt;
    if (entry.hash == hash && entry.length == length) {
      bool equal = bytes.size() <= kInlineKeyBytes ? std::memcmp(entry.key, bytes.data(), bytes.size()) == 0
                                                   : tokens_[entry.id] == bytes;
      if (equal) return entry.id;
    }
    slot = (slot + 1) & token_mask_;
  }
}

void BpeModel::add_merge(int32_t left, int32_t right, uint32_t priority, int32_t merged) {
  pending_pairs_.push_back(Pair{pair_key(left, right), priority, merged});
}

void BpeModel::finish(const std::string& source) {
  for (int byte = 0; byte < 256; ++byte) {
    auto id = find(std::string_view(reinterpret_cast<const char*>(&byte), 1));
    if (!id) throw Error(source, "no token for the single byte " + std::to_string(byte));
    byte_ids_[byte] = *id;
  }
  build_pair_index();
}

void BpeModel::find_self_merging_tokens() {
  std::vector<uint8_t> merges_to_itself(tokens_.size(), 0);
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < id_count(); ++id) {
    if (!present_[id] || tokens_[id].empty()) continue;
    ids.clear();
    merge(tokens_[id], ids);
    merges_to_itself[id] = ids.size() == 1 && ids[0] == id;
  }
  merges_to_itself_ = std::move(merges_to_itself);
}

void BpeModel::build_pair_index() {
  pair_slots_.assign(table_size_for(pending_pairs_.size()), Pair{});
  pair_mask_ = pair_slots_.size() - 1;
  for (const Pair& pair : pending_pairs_) {
    uint64_t slot = hash_pair_key(pair.key) & pair_mask_;
    while (pair_slots_[slot].key != kEmptyKey && pair_slots_[slot].key != pair.key) slot = (slot + 1) & pair_mask_;
    pair_slots_[slot] = pair;
  }
  pending_pairs_.clear();
  pending_pairs_.shrink_to_fit();
}

const BpeModel::Pair* BpeModel::find_pair(int32_t left, int32_t right) const {
  uint64_t key = pair_key(left, right);
  uint64_t slot = hash_pair_key(key) & pair_mask_;
  while (true) {
    const Pair& pair = pair_slots_[slot];
    if (pair.key == key) return &pair;
    if (pair.key == kEmptyKey) return nullptr;
    slot = (slot + 1) & pair_mask_;
  }
}

uint32_t BpeModel::pair_priority(int32_t left, int32_t right, int32_t& merged) const {
  const Pair* pair = find_pair(left, right);
  if (pair == nullptr) return kNoMerge;
  merged = pair->merged;
  return pair->priority;
}

void BpeModel::encode_piece(std::string_view piece, bool whole_piece_lookup, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const uint64_t hash = hash_bytes(piece);
  PieceCache::Slot* set = nullptr;
  if (piece.size() <= PieceCache::kMaxPieceBytes) {
    set = PieceCache::set_for(cache_owner_, hash);
    if (const PieceCache::Slot* hit = PieceCache::lookup(set, piece, hash)) {
      if (hit->id_count == 1) {
        out.push_back(hit->ids[0]);
      } else {
        out.insert(out.end(), hit->ids, hit->ids + hit->id_count);
      }
      return;
    }
  }
  const size_t first = out.size();
  std::optional<int32_t> whole;
  if (whole_piece_lookup || !merges_to_itself_.empty()) {
    whole = find_hashed(piece, hash);
    if (whole && !whole_piece_lookup && !merges_to_itself_[*whole]) whole.reset();
  }
  if (whole) {
    out.push_back(*whole);
  } else {
    merge(piece, out);
  }
  if (set != nullptr) PieceCache::store(set, piece, hash, std::span<const int32_t>(out).subspan(first));
}

void BpeModel::merge(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
  } else if (piece.size() <= kShortPieceBytes) {
    merge_short(piece, out);
  } else {
    merge_long(piece, out);
  }
}

void BpeModel::merge_short(std::string_view piece, std::vector<int32_t>& out) const {
  int32_t ids[kShortPieceBytes];
  int32_t merged[kShortPieceBytes];
  uint32_t priorities[kShortPieceBytes];
  size_t count = piece.size();
  for (size_t i = 0; i < count; ++i) ids[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
  for (size_t i = 0; i + 1 < count; ++i) priorities[i] = pair_priority(ids[i], ids[i + 1], merged[i]);
  while (count > 1) {
    size_t best = 0;
    uint32_t best_priority = kNoMerge;
    for (size_t i = 0; i + 1 < count; ++i) {
      if (priorities[i] < best_priority) {
        best_priority = priorities[i];
        best = i;
      }
    }
    if (best_priority == kNoMerge) break;
    ids[best] = merged[best];
    for (size_t i = best + 1; i + 1 < count; ++i) {
      ids[i] = ids[i + 1];
      priorities[i] = priorities[i + 1];
      merged[i] = merged[i + 1];
    }
    --count;
    if (best > 0) priorities[best - 1] = pair_priority(ids[best - 1], ids[best], merged[best - 1]);
    if (best + 1 < count) priorities[best] = pair_priority(ids[best], ids[best + 1], merged[best]);
  }
  out.insert(out.end(), ids, ids + count);
}

// Heap entries are (priority << 32 | position of the left symbol): popping the smallest takes
// the lowest priority, leftmost on ties. An entry is stale when its left symbol was merged away,
// has no right neighbour any more, or the pair there no longer has that priority.
void BpeModel::merge_long(std::string_view piece, std::vector<int32_t>& out) const {
  thread_local MergeScratch scratch;
  constexpr uint32_t kNone = ~uint32_t{0};
  const size_t count = piece.size();
  auto& ids = scratch.ids;
  auto& next = scratch.next;
  auto& prev = scratch.prev;
  auto& heap = scratch.heap;
  ids.resize(count);
  next.resize(count);
  prev.resize(count);
  heap.clear();
  for (size_t i = 0; i < count; ++i) {
    ids[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
    next[i] = i + 1 < count ? static_cast<uint32_t>(i + 1) : kNone;
    prev[i] = i > 0 ? static_cast<uint32_t>(i - 1) : kNone;
  }
  auto push = [&](uint32_t left) {
    uint32_t right = next[left];
    if (right == kNone) return;
    int32_t merged_id;
    uint32_t priority = pair_priority(ids[left], ids[right], merged_id);
    if (priority == kNoMerge) return;
    heap.push_back((uint64_t{priority} << 32) | left);
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (size_t i = 0; i + 1 < count; ++i) {
    int32_t merged_id;
    uint32_t priority = pair_priority(ids[i], ids[i + 1], merged_id);
    if (priority != kNoMerge) heap.push_back((uint64_t{priority} << 32) | i);
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    uint64_t entry = heap.back();
    heap.pop_back();
    auto left = static_cast<uint32_t>(entry & 0xFFFFFFFFu);
    auto priority = static_cast<uint32_t>(entry >> 32);
    if (ids[left] < 0) continue;
    uint32_t right = next[left];
    if (right == kNone) continue;
    int32_t merged_id;
    if (pair_priority(ids[left], ids[right], merged_id) != priority) continue;
    ids[left] = merged_id;
    ids[right] = -1;
    next[left] = next[right];
    if (next[right] != kNone) prev[next[right]] = left;
    if (prev[left] != kNone) push(prev[left]);
    push(left);
  }
  for (uint32_t i = 0; i != kNone; i = next[i]) out.push_back(ids[i]);
}

}  // namespace mt::text
