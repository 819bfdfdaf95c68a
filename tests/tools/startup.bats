#!/usr/bin/env bats
# What every tool process pays before its work (tests/bench/bench_startup.sh measures it): only
# mt-train links the CUDA libraries (lib/CMakeLists.txt's mt_cuda, lib/backend/cuda_link.h), every
# other tool starts without cudart, cuBLAS, cuBLASLt and NCCL (mt-mfu's and mt-memreport's
# --device cuda needs no CUDA table: their own suites run it); and mt-tokenize, which runs no
# OpenMP region, does not re-execute itself for OMP_WAIT_POLICY (tools/common/tool_main.cpp) while
# the other tools still do.

setup() {
  load common
  mt_load_libs
}

# The CUDA and NCCL libraries `ldd` lists for a binary, one a line.
cuda_libraries() { ldd "$MT_BIN/$1" | grep -oE 'lib(cudart|cublas|cublasLt|nccl)\.so[^ ]*' || true; }

@test "only mt-train links the CUDA libraries" {
  if mt-train --version | grep -q 'cuda=on'; then
    run cuda_libraries mt-train
    assert_output --partial libcudart.so
    assert_output --partial libnccl.so
  fi
  for tool in "${MT_TOOLS[@]}"; do
    [[ "$tool" == mt-train ]] && continue
    run cuda_libraries "$tool"
    assert_output ""
    run "$tool" --version  # the build's flags, the same for every tool
    assert_success
  done
}

# How many times libgomp was loaded while a tool printed its help, OMP_WAIT_POLICY unset: libgomp
# prints its settings at each load under OMP_DISPLAY_ENV, so a re-executed tool prints them twice.
openmp_loads() { env -u OMP_WAIT_POLICY OMP_DISPLAY_ENV=true "$MT_BIN/$1" --help 2>&1 >/dev/null |
  grep -c 'OPENMP DISPLAY ENVIRONMENT BEGIN'; }

@test "mt-tokenize starts once; a tool that runs OpenMP re-executes itself with a passive wait policy" {
  run openmp_loads mt-tokenize
  assert_output 1
  run openmp_loads mt-shard
  assert_output 2
}
