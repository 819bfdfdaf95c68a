// Philox4x32-10 against the Random123 known-answer vectors, and the element-key derivation.
#include <gtest/gtest.h>

#include "kernels/common/philox.h"

using namespace mt::kernels;

namespace {
void expect_kat(Philox4x32Counter counter, Philox4x32Key key, Philox4x32Counter expected) {
  const Philox4x32Counter out = philox4x32_10(counter, key);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out.v[i], expected.v[i]) << "word " << i;
}
}  // namespace

TEST(Philox, Random123KnownAnswers) {
  expect_kat({{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  expect_kat({{~0u, ~0u, ~0u, ~0u}}, {{~0u, ~0u}}, {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  expect_kat({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, {{0xa4093822u, 0x299f31d0u}},
             {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
}

TEST(Philox, StreamsAndBlocksAreIndependent) {
  const auto a = philox_block(1234, stream_id("layers.0.attention.qkv.weight"), 0);
  const auto b = philox_block(1234, stream_id("layers.1.attention.qkv.weight"), 0);
  const auto c = philox_block(1234, stream_id("layers.0.attention.qkv.weight"), 1);
  const auto d = philox_block(1235, stream_id("layers.0.attention.qkv.weight"), 0);
  EXPECT_NE(a.v[0], b.v[0]);
  EXPECT_NE(a.v[0], c.v[0]);
  EXPECT_NE(a.v[0], d.v[0]);
  const auto again = philox_block(1234, stream_id("layers.0.attention.qkv.weight"), 0);
  EXPECT_EQ(a.v[3], again.v[3]);
  static_assert(stream_id("") == 0xcbf29ce484222325ull);
  static_assert(stream_id("a") == 0xaf63dc4c8601ec8cull);  // FNV-1a 64 reference value
}

TEST(Philox, UnitFloatRange) {
  EXPECT_EQ(uint_to_unit_float(0), 0.0f);
  EXPECT_LT(uint_to_unit_float(0xffffffffu), 1.0f);
  EXPECT_GT(uint_to_unit_float(0xffffffffu), 0.9999f);
}
