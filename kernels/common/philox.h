// Philox4x32-10 counter-based RNG (Salmon et al., SC'11), header-only for host and device, plus
// the key derivation DESIGN.md section 3 uses: every global tensor element draws from
// (seed, tensor name, global index), so every parallel layout starts from the same model.
// Known-answer vectors from Random123 in tests/unit/kernels/test_philox.cpp.
#pragma once

#include <cstdint>

#include "kernels/common/host_device.h"

namespace mt::kernels {

struct Philox4x32Counter {
  uint32_t v[4];
};
struct Philox4x32Key {
  uint32_t v[2];
};

MT_HOST_DEVICE void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}

MT_HOST_DEVICE Philox4x32Counter philox4x32_10(Philox4x32Counter counter, Philox4x32Key key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kMul0, counter.v[0], hi0, lo0);
    philox_mulhilo(kMul1, counter.v[2], hi1, lo1);
    counter = Philox4x32Counter{{hi1 ^ counter.v[1] ^ key.v[0], lo1, hi0 ^ counter.v[3] ^ key.v[1], lo0}};
    key.v[0] += kWeyl0;
    key.v[1] += kWeyl1;
  }
  return counter;
}

// FNV-1a over a name: the stream id of a tensor or dropout site (stable across builds and hosts).
constexpr uint64_t stream_id(const char* name) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (; *name; ++name) hash = (hash ^ static_cast<unsigned char>(*name)) * 0x100000001b3ull;
  return hash;
}

// 24 random bits -> uniform float in [0, 1).
MT_HOST_DEVICE float uint_to_unit_float(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

// Four uniform 32-bit words for element block `block` of stream `stream` under `seed`.
// Counter = (block lo, block hi, stream lo, stream hi); key = (seed lo, seed hi).
MT_HOST_DEVICE Philox4x32Counter philox_block(uint64_t seed, uint64_t stream, uint64_t block) {
  return philox4x32_10(
      Philox4x32Counter{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                         static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)}},
      Philox4x32Key{{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}});
}

// Uniform [0, 1) for element (row, col) of a keyed site, e.g. a dropout mask: a pure function of
// (seed, stream, iteration, global row id, global column). One Philox call serves 4 columns.
// Counter = (col/4, row lo, row hi, iteration); key = seed xor stream.
MT_HOST_DEVICE float keyed_uniform(uint64_t seed, uint64_t stream, uint64_t iteration, int64_t row, int64_t col) {
  const uint64_t key = seed ^ stream;
  const uint64_t urow = static_cast<uint64_t>(row);
  const Philox4x32Counter bits = philox4x32_10(
      Philox4x32Counter{{static_cast<uint32_t>(static_cast<uint64_t>(col) >> 2), static_cast<uint32_t>(urow),
                         static_cast<uint32_t>(urow >> 32), static_cast<uint32_t>(iteration)}},
      Philox4x32Key{{static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)}});
  return uint_to_unit_float(bits.v[col & 3]);
}

}  // namespace mt::kernels
