// Cases of the memory, stream, stream-order (host functions, events), copy, fill and zero entries
// and of the conversions (see op_cases.h): allocations aligned and zero-filled, releases that
// leave other blocks alone, ops in stream order, host functions between the work before and after
// them, events that order and time stream work, copies of odd byte counts and pitched rows,
// conversions bit for bit against kernels/common/half.h, and unsupported conversions refused by
// name.
#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "case_helpers.h"
#include "kernels/common/half.h"
#include "op_cases.h"
#include "reference.h"

namespace mt::harness {
namespace {

using backend::CopyKind;

void add_allocation_cases(std::vector<OpCase>& cases) {
  cases.push_back({.op = OpId::allocate,
                   .mode = CaseMode::property,
                   .name = "64-byte aligned and zero-filled at 1 B, 4000 B and 1 MiB + 3 B",
                   .body = [](CaseContext& c) {
                     for (int64_t bytes : {int64_t{1}, int64_t{4000}, (int64_t{1} << 20) + 3}) {
                       const DeviceArray<uint8_t> block = c.allocated<uint8_t>(bytes);
                       c.expect(reinterpret_cast<uintptr_t>(block.data) % 64 == 0,
                                std::to_string(bytes) + " B not 64-byte aligned");
                       const std::vector<uint8_t> values = c.download(block, "block");
                       c.expect(std::all_of(values.begin(), values.end(), [](uint8_t v) { return v == 0; }),
                                std::to_string(bytes) + " B not zero-filled");
                     }
                   }});
  cases.push_back({.op = OpId::release,
                   .mode = CaseMode::property,
                   .name = "releasing a block leaves the others' values; a new block is zero-filled again",
                   .body = [](CaseContext& c) {
                     const backend::Ops& ops = c.ops();
                     const auto first = random_floats(1000, 1), last = random_floats(1000, 2);
                     const DeviceArray<float> a = c.upload(first);
                     const int64_t bytes = 1000 * sizeof(float);
                     void* middle = ops.allocate(bytes, backend::MemoryCategory::grads);
                     std::vector<float> junk(1000, 5.0f);
                     ops.copy(middle, junk.data(), bytes, CopyKind::host_to_device, c.stream());
                     const DeviceArray<float> b = c.upload(last);
                     ops.synchronize(c.stream());
                     ops.release(middle, bytes, backend::MemoryCategory::grads);
                     const DeviceArray<float> again = c.allocated<float>(1000);
                     c.expect_equal("first block", c.download(a, "a"), first);
                     c.expect_equal("last block", c.download(b, "b"), last);
                     c.expect_equal("block allocated after a release", c.download(again, "again"),
                                    std::vector<float>(1000, 0.0f));
                   }});
  cases.push_back({.op = OpId::default_stream,
                   .mode = CaseMode::property,
                   .name = "one default stream; fill, zero and a device copy issued on it run in order",
                   .body = [](CaseContext& c) {
                     const backend::Ops& ops = c.ops();
                     c.expect(ops.default_stream().handle == c.stream().handle, "default_stream changed");
                     const int64_t n = 100003;
                     const DeviceArray<float> x = c.filled(n, -1.0f), y = c.filled(n, -2.0f);
                     ops.fill(x.data, n, 1.5f, c.stream());
                     ops.zero(x.data, n / 2 * int64_t{sizeof(float)}, c.stream());
                     ops.copy(y.data, x.data, n * int64_t{sizeof(float)}, CopyKind::device_to_device, c.stream());
                     ops.fill(x.data, n, 9.0f, c.stream());
                     std::vector<float> expected(n, 1.5f);
                     std::fill(expected.begin(), expected.begin() + n / 2, 0.0f);
                     c.expect_equal("y", c.download(y, "y"), expected);
                   }});
  cases.push_back({.op = OpId::synchronize,
                   .mode = CaseMode::property,
                   .name = "returns after the fills and the copy into host memory issued before it",
                   .body = [](CaseContext& c) {
                     const backend::Ops& ops = c.ops();
                     const int64_t n = (int64_t{1} << 18) + 5;
                     const DeviceArray<float> x = c.allocated<float>(n);
                     ops.fill(x.data, n, 0.25f, c.stream());
                     ops.fill(x.data + 7, 3, -4.0f, c.stream());
                     std::vector<float> host(n, kNaN);
                     ops.copy(host.data(), x.data, n * int64_t{sizeof(float)}, CopyKind::device_to_host, c.stream());
                     ops.synchronize(c.stream());
                     std::vector<float> expected(n, 0.25f);
                     std::fill_n(expected.begin() + 7, 3, -4.0f);
                     c.expect_equal("host copy", host, expected);
                   }});
}

void add_copy_cases(std::vector<OpCase>& cases) {
  cases.push_back({.op = OpId::copy,
                   .mode = CaseMode::forward,
                   .name = "host to device, device to device, device to host, 13 and 35 x 4 bytes",
                   .body = [](CaseContext& c) {
                     const backend::Ops& ops = c.ops();
                     const auto source = random_floats(5 * 7, 17);
                     const DeviceArray<float> a = c.upload(source), b = c.filled<float>(35, kNaN);
                     ops.copy(b.data, a.data, 35 * sizeof(float), CopyKind::device_to_device, c.stream());
                     c.expect_bits_equal("device to device", c.download(b, "b"), source);
                     std::vector<uint8_t> bytes(16);
                     for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 1);
                     const DeviceArray<uint8_t> from = c.upload(bytes), to = c.filled<uint8_t>(16, 0xee);
                     ops.copy(to.data, from.data, 13, CopyKind::device_to_device, c.stream());
                     std::vector<uint8_t> expected = bytes;
                     std::fill(expected.begin() + 13, expected.end(), 0xee);
                     c.expect_equal("13 bytes", c.download(to, "to"), expected);
                   }});
  cases.push_back(
      {.op = OpId::copy_2d,
       .mode = CaseMode::forward,
       .name = "5 rows of 3 floats from pitch 7 to pitch 4, every copy kind; outside the width untouched",
       .body = [](CaseContext& c) {
         const backend::Ops& ops = c.ops();
         const auto source = random_floats(5 * 7, 17);
         std::vector<float> expected(5 * 4, -1.0f);
         for (int r = 0; r < 5; ++r)
           for (int col = 0; col < 3; ++col) expected[r * 4 + col] = source[r * 7 + col];
         const int64_t from_pitch = 7 * sizeof(float), to_pitch = 4 * sizeof(float), width = 3 * sizeof(float);
         const DeviceArray<float> src = c.upload(source), dst = c.filled(20, -1.0f);
         ops.copy_2d(dst.data, to_pitch, src.data, from_pitch, width, 5, CopyKind::device_to_device, c.stream());
         c.expect_equal("device to device", c.download(dst, "d2d"), expected);
         const DeviceArray<float> uploaded = c.filled(20, -1.0f);
         ops.copy_2d(uploaded.data, to_pitch, source.data(), from_pitch, width, 5, CopyKind::host_to_device,
                     c.stream());
         c.expect_equal("host to device", c.download(uploaded, "h2d"), expected);
         std::vector<float> host(20, -1.0f);
         ops.copy_2d(host.data(), to_pitch, src.data, from_pitch, width, 5, CopyKind::device_to_host, c.stream());
         ops.synchronize(c.stream());
         c.expect_equal("device to host", host, expected);
       }});
  cases.push_back({.op = OpId::fill,
                   .mode = CaseMode::forward,
                   .name = "the first 100000 of 100003 floats; the rest untouched",
                   .body = [](CaseContext& c) {
                     const DeviceArray<float> x = c.filled(100003, 2.0f);
                     c.ops().fill(x.data, 100000, 0.75f, c.stream());
                     std::vector<float> expected(100003, 0.75f);
                     std::fill(expected.begin() + 100000, expected.end(), 2.0f);
                     c.expect_equal("x", c.download(x, "x"), expected);
                   }});
  cases.push_back({.op = OpId::zero,
                   .mode = CaseMode::forward,
                   .name = "8 bytes at byte 4 of 20; the rest untouched",
                   .body = [](CaseContext& c) {
                     const DeviceArray<float> x = c.filled(5, 0.75f);
                     c.ops().zero(x.data + 1, 2 * sizeof(float), c.stream());
                     c.expect_equal("x", c.download(x, "x"), std::vector<float>{0.75f, 0.0f, 0.0f, 0.75f, 0.75f});
                   }});
}

// 1031 floats of random bit patterns (NaNs, infinities, subnormals among them) led by specials.
std::vector<float> conversion_inputs() {
  std::mt19937 rng(13);
  std::vector<float> values(1031);
  for (float& v : values) v = std::bit_cast<float>(static_cast<uint32_t>(rng()));
  const float specials[] = {0.0f, -0.0f, 1.0f, 65504.0f, 65520.0f, 1e-8f, -3e-39f, kInf, kNaN};
  std::copy(std::begin(specials), std::end(specials), values.begin());
  return values;
}

std::vector<uint32_t> bits_of(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = std::bit_cast<uint32_t>(values[i]);
  return bits;
}

// f32 -> 16-bit bits -> f32 through the convert entry, both directions bit for bit against the
// scalar conversions of kernels/common/half.h.
void check_conversion(CaseContext& c, DType half_type, uint16_t (*to_bits)(float), float (*from_bits)(uint16_t)) {
  const auto values = conversion_inputs();
  const int64_t n = static_cast<int64_t>(values.size());
  const DeviceArray<float> in = c.upload(values), back = c.filled(n, kNaN);
  const DeviceArray<uint16_t> bits = c.filled<uint16_t>(n, 0);
  c.ops().convert(in.data, DType::f32, bits.data, half_type, n, c.stream());
  c.ops().convert(bits.data, half_type, back.data, DType::f32, n, c.stream());
  std::vector<uint16_t> expected_bits(n);
  std::vector<float> expected_back(n);
  for (int64_t i = 0; i < n; ++i) expected_back[i] = from_bits(expected_bits[i] = to_bits(values[i]));
  c.expect_equal("f32 -> bits", c.download(bits, "bits"), expected_bits);
  c.expect_equal("bits -> f32 (as bits)", bits_of(c.download(back, "back")), bits_of(expected_back));
}

void check_round_through(CaseContext& c, DType through, float (*rounded)(float)) {
  const auto values = conversion_inputs();
  const int64_t n = static_cast<int64_t>(values.size());
  const DeviceArray<float> in = c.upload(values), out = c.filled(n, kNaN);
  c.ops().round_through(in.data, out.data, n, through, c.stream());
  std::vector<float> expected(n);
  for (int64_t i = 0; i < n; ++i) expected[i] = rounded(values[i]);
  c.expect_equal("rounded (as bits)", bits_of(c.download(out, "out")), bits_of(expected));
}

float fp16_round(float value) { return kernels::fp16_bits_to_fp32(kernels::fp32_to_fp16_bits(value)); }
float bf16_round(float value) { return kernels::round_to_bf16(value); }

// What a host function saw: the host copy the stream wrote before it, copied when it ran, and how
// many times it ran.
struct HostFunctionProbe {
  const std::vector<float>* before = nullptr;
  std::vector<float> seen;
  int calls = 0;
};

void copy_what_the_stream_wrote(void* argument) {
  auto* probe = static_cast<HostFunctionProbe*>(argument);
  probe->seen = *probe->before;
  ++probe->calls;
}

void add_stream_order_cases(std::vector<OpCase>& cases) {
  cases.push_back({.op = OpId::launch_host_function,
                   .mode = CaseMode::property,
                   .name = "runs once, after the copy to the host issued before it and before the fill issued after it",
                   .body = [](CaseContext& c) {
                     const backend::Ops& ops = c.ops();
                     const int64_t n = (int64_t{1} << 16) + 3;
                     const DeviceArray<float> x = c.filled(n, 1.0f);
                     std::vector<float> before(n, kNaN), after(n, kNaN);
                     HostFunctionProbe probe{&before, {}, 0};
                     ops.copy(before.data(), x.data, n * int64_t{sizeof(float)}, CopyKind::device_to_host, c.stream());
                     ops.launch_host_function(c.stream(), copy_what_the_stream_wrote, &probe);
                     ops.fill(x.data, n, 2.0f, c.stream());
                     ops.copy(after.data(), x.data, n * int64_t{sizeof(float)}, CopyKind::device_to_host, c.stream());
                     ops.synchronize(c.stream());
                     c.expect(probe.calls == 1, "ran " + std::to_string(probe.calls) + " times");
                     c.expect_equal("what the host function saw", probe.seen, std::vector<float>(n, 1.0f));
                     c.expect_equal("after it", after, std::vector<float>(n, 2.0f));
                   }});
  const auto event_case = [&](OpId op, const char* name) {
    cases.push_back({.op = op,
                     .mode = CaseMode::property,
                     .name = name,
                     .body = [](CaseContext& c) {
                       const backend::Ops& ops = c.ops();
                       const int64_t n = (int64_t{1} << 20) + 1;
                       const DeviceArray<float> x = c.allocated<float>(n);
                       const backend::Event start = ops.create_event(), end = ops.create_event();
                       std::vector<float> host(n, kNaN);
                       ops.record_event(start, c.stream());
                       ops.fill(x.data, n, 0.5f, c.stream());
                       ops.copy(host.data(), x.data, n * int64_t{sizeof(float)}, CopyKind::device_to_host, c.stream());
                       ops.record_event(end, c.stream());
                       ops.synchronize_event(end);
                       c.expect_equal("host copy after synchronize_event", host, std::vector<float>(n, 0.5f));
                       const double seconds = ops.elapsed_seconds(start, end);
                       c.expect(std::isfinite(seconds) && seconds >= 0, "elapsed " + std::to_string(seconds) + " s");
                       const backend::Event unrecorded = ops.create_event();
                       bool refused = false;
                       try {
                         ops.elapsed_seconds(unrecorded, end);
                       } catch (const std::logic_error&) {
                         refused = true;
                       }
                       c.expect(refused, "elapsed_seconds from an event never recorded did not throw std::logic_error");
                       ops.destroy_event(unrecorded);
                       ops.destroy_event(start);
                       ops.destroy_event(end);
                       ops.synchronize(c.stream());
                     }});
  };
  event_case(OpId::create_event, "two events around a fill and a copy to the host: created, recorded, waited, timed, freed");
  event_case(OpId::destroy_event, "events freed after use, the stream still usable");
  event_case(OpId::record_event, "an event recorded after a copy to the host marks its completion");
  event_case(OpId::synchronize_event, "the host copy before the event is complete once synchronize_event returns");
  event_case(OpId::elapsed_seconds, "finite, non-negative seconds between two recorded events; an unrecorded one refused");
}

}  // namespace

void add_memory_cases(std::vector<OpCase>& cases) {
  add_allocation_cases(cases);
  add_stream_order_cases(cases);
  add_copy_cases(cases);
}

void add_conversion_cases(std::vector<OpCase>& cases) {
  cases.push_back({.op = OpId::convert,
                   .dtype = DType::bf16,
                   .mode = CaseMode::forward,
                   .name = "f32 <-> bf16 bits of 1031 random bit patterns and specials",
                   .body = [](CaseContext& c) {
                     check_conversion(c, DType::bf16, kernels::fp32_to_bf16_bits, kernels::bf16_bits_to_fp32);
                   }});
  cases.push_back({.op = OpId::convert,
                   .dtype = DType::f16,
                   .mode = CaseMode::forward,
                   .name = "f32 <-> f16 bits of 1031 random bit patterns and specials",
                   .body = [](CaseContext& c) {
                     check_conversion(c, DType::f16, kernels::fp32_to_fp16_bits, kernels::fp16_bits_to_fp32);
                   }});
  cases.push_back({.op = OpId::round_through,
                   .dtype = DType::bf16,
                   .mode = CaseMode::forward,
                   .name = "f32 through bf16, 1031 random bit patterns and specials",
                   .body = [](CaseContext& c) { check_round_through(c, DType::bf16, bf16_round); }});
  cases.push_back({.op = OpId::round_through,
                   .dtype = DType::f16,
                   .mode = CaseMode::forward,
                   .name = "f32 through f16, 1031 random bit patterns and specials",
                   .body = [](CaseContext& c) { check_round_through(c, DType::f16, fp16_round); }});
  cases.push_back({.op = OpId::convert,
                   .dtype = DType::i32,
                   .mode = CaseMode::refusal,
                   .name = "f32 -> int32 is refused by name",
                   .body = [](CaseContext& c) {
                     const DeviceArray<float> in = c.filled(4, 1.0f), out = c.filled(4, 0.0f);
                     expect_refusal(c, "convert", dtype_name(DType::i32),
                                    [&] { c.ops().convert(in.data, DType::f32, out.data, DType::i32, 4, c.stream()); });
                   }});
  cases.push_back({.op = OpId::round_through,
                   .dtype = DType::f32,
                   .mode = CaseMode::refusal,
                   .name = "rounding through f32 is refused by name",
                   .body = [](CaseContext& c) {
                     const DeviceArray<float> in = c.filled(4, 1.0f), out = c.filled(4, 0.0f);
                     expect_refusal(c, "round_through", dtype_name(DType::f32),
                                    [&] { c.ops().round_through(in.data, out.data, 4, DType::f32, c.stream()); });
                   }});
}

}  // namespace mt::harness
