// safetensors (io/safetensors.h): F32 round-trips bit for bit, BF16/F16 round to nearest even and
// widen back exactly; the file is the specification's (8-byte little-endian header size, JSON
// header padded to 8 bytes, data_offsets back to back); damaged files are refused naming what is
// wrong (truncated buffer, a hole between tensors, an unknown dtype, a header size past the end).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../error_text.h"
#include "../temp_dir.h"
#include "core/error.h"
#include "io/safetensors.h"

using namespace mt;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// A file with a hand-made header over `buffer`.
std::string hand_made(const std::string& header, const std::string& buffer) {
  std::string bytes;
  for (int b = 0; b < 8; ++b) bytes.push_back(static_cast<char>((header.size() >> (8 * b)) & 0xff));
  return bytes + header + buffer;
}

}  // namespace

TEST(Safetensors, RoundTripsAndFollowsTheSpecification) {
  mt::testing::TempDir dir;
  const std::string path = (dir.path() / "m.safetensors").string();
  const std::vector<float> values = {1.0f, -2.5f, 3.14159265f, 1e-3f, 65504.0f, -0.0f};
  io::SafetensorsWriter writer;
  writer.add("a.weight", DType::f32, {2, 3}, values);
  writer.add("b", DType::bf16, {6}, values);
  writer.add("c", DType::f16, {3, 2}, values);
  const int64_t bytes = writer.write(path, {{"format", "pt"}});

  const std::string file = read_bytes(path);
  ASSERT_EQ(static_cast<int64_t>(file.size()), bytes);
  uint64_t header_size = 0;
  for (int b = 7; b >= 0; --b) header_size = header_size << 8 | static_cast<unsigned char>(file[b]);
  EXPECT_EQ(header_size % 8, 0u);
  const auto header = nlohmann::json::parse(file.substr(8, header_size));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["a.weight"]["dtype"], "F32");
  EXPECT_EQ(header["a.weight"]["shape"], nlohmann::json::array({2, 3}));
  EXPECT_EQ(header["a.weight"]["data_offsets"], nlohmann::json::array({0, 24}));
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json::array({24, 36}));
  EXPECT_EQ(header["c"]["data_offsets"], nlohmann::json::array({36, 48}));
  EXPECT_EQ(file.size(), 8 + header_size + 48);
  // 1.0f little-endian at the start of the buffer; bf16 1.0 is 0x3f80, fp16 1.0 is 0x3c00.
  const std::string buffer = file.substr(8 + header_size);
  EXPECT_EQ(buffer.substr(0, 4), std::string("\x00\x00\x80\x3f", 4));
  EXPECT_EQ(buffer.substr(24, 2), std::string("\x80\x3f", 2));
  EXPECT_EQ(buffer.substr(36, 2), std::string("\x00\x3c", 2));

  const io::SafetensorsReader reader(path);
  EXPECT_EQ(reader.metadata().at("format"), "pt");
  ASSERT_EQ(reader.entries().size(), 3u);
  const std::vector<float> a = reader.read("a.weight");
  EXPECT_EQ(std::memcmp(a.data(), values.data(), values.size() * sizeof(float)), 0);
  const std::vector<float> b = reader.read("b"), c = reader.read("c");
  EXPECT_EQ(b[2], 3.140625f);       // bf16: 8 mantissa bits
  EXPECT_EQ(c[2], 3.140625f);       // fp16: 3.1406 is 0x4248
  EXPECT_EQ(c[3], 0.0010004043579101562f);
  EXPECT_EQ(c[4], 65504.0f);
  EXPECT_TRUE(std::signbit(b[5]) && std::signbit(c[5]));
  EXPECT_THROW(reader.read("missing"), Error);
}

TEST(Safetensors, RefusesDamagedFiles) {
  mt::testing::TempDir dir;
  const std::string path = (dir.path() / "bad.safetensors").string();
  const std::string good = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  auto refused = [&](const std::string& bytes, const std::string& expected) {
    write_bytes(path, bytes);
    const std::string message = mt::testing::error_text([&] { io::SafetensorsReader reader(path); });
    EXPECT_NE(message.find(expected), std::string::npos) << "expected '" << expected << "' in '" << message << "'";
  };
  write_bytes(path, hand_made(good, std::string(8, '\0')));
  EXPECT_EQ(mt::testing::error_text([&] { io::SafetensorsReader reader(path); }), "");
  refused(hand_made(good, std::string(4, '\0')), "the tensors end at byte");
  refused(hand_made(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", std::string(12, '\0')),
          "bytes 0 to 4 of the buffer belong to no tensor (the next is x)");
  refused(hand_made(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                    std::string(8, '\0')),
          "tensor y: starts at byte 4, inside the tensor before it (which ends at byte 8): overlapping tensors");
  refused(hand_made(good, std::string(12, '\0')), "the tensors end at byte");
  refused(hand_made(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
          "do not hold its shape and dtype");
  refused(hand_made(R"({"x":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')),
          "dtype I64 is not read by mt");
  refused(hand_made("{not json", ""), "header is not JSON");
  refused(std::string("\xff\xff\xff\x00\x00\x00\x00\x00", 8) + "{}", "does not fit the file");
  refused("abc", "shorter than the 8-byte header size");
}
