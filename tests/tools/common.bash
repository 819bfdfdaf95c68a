# Shared set-up for the Bats suites: finds the built tools and loads bats-support/bats-assert.
# MT_BIN may point at another build's bin/ directory; its test helpers (mt_equivalence_check) are
# in the tests/ directory beside it (MT_TEST_BIN).
MT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$MT_ROOT/build/bin}"
MT_TEST_BIN="${MT_TEST_BIN:-$MT_BIN/../tests}"
MT_TOOLS=(mt-tokenize mt-shard mt-train mt-ckpt mt-mfu mt-memreport mt-plot)
export PATH="$MT_BIN:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_rmaps_base_oversubscribe=1

mt_load_libs() {
  bats_load_library bats-support
  bats_load_library bats-assert
}

# Runs a command with stdout and stderr captured separately: $status, $out, $err.
run_split() {
  local out_file err_file
  out_file="$(mktemp)" err_file="$(mktemp)"
  # `&& ||` keeps a failing command from tripping Bats' ERR trap: the status is the result.
  "$@" >"$out_file" 2>"$err_file" && status=0 || status=$?
  out="$(cat "$out_file")" err="$(cat "$err_file")"
  rm -f "$out_file" "$err_file"
}

# `mpirun_n N CMD...`: CMD on N oversubscribed ranks, stopped after 5 minutes.
mpirun_n() {
  local ranks="$1"
  shift
  timeout 300 mpirun -np "$ranks" --oversubscribe "$@"
}

# Number of lines in a string (0 for empty).
line_count() { if [[ -z "$1" ]]; then echo 0; else printf '%s\n' "$1" | wc -l; fi; }

# Skips the test for want of an optional oracle (`skip_without_oracle REASON`), except under
# MT_REQUIRE_ORACLES=1 (setup.sh test installs every oracle), where the missing oracle fails it.
skip_without_oracle() {
  if [[ "${MT_REQUIRE_ORACLES:-}" == 1 ]]; then
    fail "$1 (MT_REQUIRE_ORACLES=1: a missing oracle is a failure)"
    return 1
  fi
  skip "$1"
}
