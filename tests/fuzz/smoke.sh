#!/usr/bin/env bash
# One fuzz smoke run (CTest label fuzz, tests/fuzz/CMakeLists.txt): the libFuzzer binary FUZZER
# for SECONDS from its seeds and kept crash inputs (read only: new inputs go to a temporary
# corpus), seed MT_FUZZ_SEED (default 1, so a run repeats; libFuzzer prints it), 25 s per input at
# most (a slow input under a loaded CI machine is not a finding; a hang is). A finding fails the test and names the input it saved, to be kept under the target's crashes/.
# Usage: smoke.sh FUZZER SECONDS SEEDS_DIR CRASHES_DIR
set -uo pipefail
fuzzer="$1" seconds="$2" seeds="$3" crashes="$4"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/artifacts"
status=0
"$fuzzer" -max_total_time="$seconds" -seed="${MT_FUZZ_SEED:-1}" -timeout=25 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus" "$seeds" "$crashes" 2>&1 | tail -40 || status=$?
for artifact in "$work"/artifacts/*; do
  [[ -e $artifact ]] || continue
  kept="${TMPDIR:-/tmp}/$(basename "$fuzzer")-$(basename "$artifact")"
  cp "$artifact" "$kept"
  echo "smoke: finding saved as $kept: fix the reader, then keep it as $crashes/$(basename "$artifact")"
  status=1
done
exit "$status"
