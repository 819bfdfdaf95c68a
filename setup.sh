#!/usr/bin/env bash
# mt's one set-up script for a fresh Debian 12 machine: installs what is missing (apt-get),
# configures and builds in Release, then runs the demo or the tests.
#   ./setup.sh demo    install, build, run the main job (scripts/demo.sh)
#   ./setup.sh test    install, build, run every suite; ends with "N passed, N failed"
#   ./setup.sh build   install and build only
# Idempotent: a second run installs nothing and rebuilds only what changed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD_DIR="${MT_BUILD_DIR:-$ROOT/build}"
ACTION="${1:-build}"

# Package -> why (README "Dependencies" says the same).
PACKAGES=(
  build-essential cmake ninja-build ccache git pkg-config  # toolchain; ccache keeps rebuilds short
  openmpi-bin libopenmpi-dev                               # MPI communicator and launcher
  libhdf5-openmpi-dev hdf5-tools                           # parallel HDF5: datasets, checkpoints
  libdnnl-dev                                              # oneDNN: CPU GEMM chosen by CPU features
  libcli11-dev nlohmann-json3-dev                          # the one CLI parser; JSON records
  libsimdjson-dev                                          # mt-tokenize's JSONL parser (GB/s)
  libgtest-dev bats bats-support bats-assert jq            # tests
  python3-numpy python3-h5py                               # test oracles read mt's files
)

install_missing() {
  local missing=()
  for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  echo "setup: installing ${missing[*]}" >&2
  local sudo=()
  [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  "${sudo[@]}" apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
}

build() {
  local cmake_args=(-S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release)
  [[ -n "${MT_CMAKE_ARGS:-}" ]] && read -r -a extra <<<"$MT_CMAKE_ARGS" && cmake_args+=("${extra[@]}")
  cmake "${cmake_args[@]}" >&2
  cmake --build "$BUILD_DIR" -j "$(nproc)" >&2
}

# mpirun as root needs both variables; oversubscribed ranks must yield or they spin.
export_mpi_env() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
}

run_tests() {
  export_mpi_env
  export MT_BIN="$BUILD_DIR/bin"
  local log_dir="$BUILD_DIR/test-logs"
  mkdir -p "$log_dir"

  # CTest (unit, mpi, gpu-skipped) and Bats run side by side: they share no files.
  (cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" --timeout 1800) >"$log_dir/ctest.log" 2>&1 &
  local ctest_pid=$!
  local bats_dirs=()
  for dir in tests/tools tests/e2e; do
    compgen -G "$ROOT/$dir/*.bats" >/dev/null && bats_dirs+=("$ROOT/$dir")
  done
  bats --tap "${bats_dirs[@]}" >"$log_dir/bats.log" 2>&1 || true
  wait "$ctest_pid" || true

  cat "$log_dir/ctest.log" "$log_dir/bats.log"

  local total failed skipped
  total=$(sed -n 's/.*tests passed, \([0-9]*\) tests\? failed out of \([0-9]*\).*/\2/p' "$log_dir/ctest.log")
  failed=$(sed -n 's/.*tests passed, \([0-9]*\) tests\? failed out of \([0-9]*\).*/\1/p' "$log_dir/ctest.log")
  skipped=$(grep -c '(Skipped)' "$log_dir/ctest.log" || true)
  if [[ -z "$total" ]]; then total=0 failed=1; fi
  local ctest_passed=$((total - failed - skipped))

  local bats_passed bats_failed bats_skipped
  bats_failed=$(grep -c '^not ok' "$log_dir/bats.log" || true)
  bats_skipped=$(grep -c '^ok .* # skip' "$log_dir/bats.log" || true)
  bats_passed=$(($(grep -c '^ok' "$log_dir/bats.log" || true) - bats_skipped))
  grep -q '^1\.\.' "$log_dir/bats.log" || bats_failed=$((bats_failed + 1))

  echo "ctest: $ctest_passed passed, $failed failed, $skipped skipped"
  echo "bats: $bats_passed passed, $bats_failed failed, $bats_skipped skipped"
  local all_passed=$((ctest_passed + bats_passed)) all_failed=$((failed + bats_failed))
  echo "$all_passed passed, $all_failed failed, $((skipped + bats_skipped)) skipped"
  [[ $all_failed -eq 0 ]]
}

case "$ACTION" in
  build) install_missing; build ;;
  demo) install_missing; build; export_mpi_env; MT_BIN="$BUILD_DIR/bin" "$ROOT/scripts/demo.sh" ;;
  test) install_missing; build; run_tests ;;
  *) echo "usage: $0 [build|demo|test]" >&2; exit 2 ;;
esac
