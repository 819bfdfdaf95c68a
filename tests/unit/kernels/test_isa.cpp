// CPU ISA detection and the MT_CPU_ISA override.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>

#include "kernels/cpu/isa.h"

using namespace mt::kernels;

TEST(Isa, NamesRoundTrip) {
  for (CpuIsa isa : {CpuIsa::x86_64_v2, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512_bf16}) {
    CpuIsa parsed;
    ASSERT_TRUE(parse_isa(isa_name(isa), parsed));
    EXPECT_EQ(parsed, isa);
  }
  CpuIsa parsed;
  EXPECT_FALSE(parse_isa("sse9", parsed));
}

TEST(Isa, LoweringWorksAndRaisingAboveTheCpuThrows) {
  const CpuIsa best = detected_isa();
  set_active_isa(CpuIsa::x86_64_v2);
  EXPECT_EQ(active_isa(), CpuIsa::x86_64_v2);
  set_active_isa(best);
  EXPECT_EQ(active_isa(), best);
  if (best != CpuIsa::avx512_bf16) {
    EXPECT_THROW(set_active_isa(CpuIsa::avx512_bf16), std::invalid_argument);
    EXPECT_EQ(active_isa(), best);
  }
}
