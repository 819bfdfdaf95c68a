#!/usr/bin/env bats
# mt-plot end to end: SVGs of mt-train's JSONL (several runs, a resumed run) and of mt-memreport's
# measured-beside-predicted memory, parsed as XML by Python and mapped back through each panel's
# axis transform to the records' values within half a pixel (plot_reader.py); bad input.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
  READER="$MT_ROOT/tests/tools/plot_reader.py"
}

teardown() { rm -rf "$TMP"; }

TINY=(--model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4
      --eval-iters 0 --peak-tflops 1 --lr 1e-3 --lr-warmup-iters 2 --lr-decay-iters 12)

@test "issue27: training curves of runs overlaid, a resumed run joined, points within half a pixel" {
  mt-train "${TINY[@]}" --train-iters 12 >"$TMP/straight.jsonl" 2>/dev/null
  mt-train "${TINY[@]}" --train-iters 12 --fp16 >"$TMP/fp16.jsonl" 2>/dev/null
  mt-train "${TINY[@]}" --train-iters 8 --save "$TMP/ck" --save-interval 5 >"$TMP/first.jsonl" 2>/dev/null
  mt-train "${TINY[@]}" --train-iters 12 --load "$TMP/ck" >"$TMP/second.jsonl" 2>/dev/null  # repeats 6..8
  run_split mt-plot training "$TMP/straight.jsonl" "$TMP/fp16.jsonl" "$TMP/first.jsonl,$TMP/second.jsonl" \
    --label straight --label fp16 --label resumed --output "$TMP/runs.svg" --title "three runs"
  [[ $status -eq 0 ]] || fail "$err"
  echo "$out" | jq -e -s '.[0].record == "run" and .[1].record == "plot" and .[1].runs == 3 and .[1].points == 144' \
    >/dev/null || fail "$out"
  run_split "$READER" training "$TMP/runs.svg" "$TMP/straight.jsonl" "$TMP/fp16.jsonl" "$TMP/first.jsonl,$TMP/second.jsonl"
  [[ $status -eq 0 ]] || fail "$out $err"
  # Every value drawn: 4 curves x 12 iterations x 3 runs, less the fp16 run's skipped grad norms.
  echo "$out" | jq -e '.panels == 4 and .points > 130' >/dev/null || fail "$out"
  grep -q 'data-series="resumed"' "$TMP/runs.svg" || fail "no resumed line"
}

@test "issue27: memory bars, predicted beside measured per pipeline stage, as tall as the bytes" {
  mpirun_n 2 mt-train "${TINY[@]}" --pipeline-model-parallel-size 2 --train-iters 2 >"$TMP/pp.jsonl" 2>/dev/null ||
    fail "mt-train under mpirun failed"
  mt-memreport --from-log "$TMP/pp.jsonl" >"$TMP/report.jsonl" || fail "mt-memreport failed"
  run_split mt-plot memory "$TMP/report.jsonl" --output "$TMP/memory.svg"
  [[ $status -eq 0 ]] || fail "$err"
  echo "$out" | jq -e -s '.[1].kind == "memory" and .[1].stages == 2' >/dev/null || fail "$out"
  run_split "$READER" memory "$TMP/memory.svg" "$TMP/report.jsonl"
  [[ $status -eq 0 ]] || fail "$out $err"
  echo "$out" | jq -e '.segments == 20' >/dev/null || fail "$out"
}

@test "issue27: mt-plot's bad input is one line naming it, exit 2, no SVG and nothing on stdout" {
  printf '{"record":"step","iteration":1}\nnot json\n' >"$TMP/bad.jsonl"
  run_split mt-plot training "$TMP/bad.jsonl" --output "$TMP/x.svg"
  [[ $status -eq 2 && -z "$out" && "$err" == "mt-plot: error: $TMP/bad.jsonl:2: not a JSON record" ]] || fail "$status: $err"
  printf '{"record":"run"}\n' >"$TMP/none.jsonl"
  run_split mt-plot training "$TMP/none.jsonl" --output "$TMP/x.svg"
  [[ $status -eq 2 && "$err" == *"holds no step records"* ]] || fail "$status: $err"
  run_split mt-plot memory "$TMP/none.jsonl" --output "$TMP/x.svg"
  [[ $status -eq 2 && "$err" == *"holds no memory_check records"* ]] || fail "$status: $err"
  run_split mt-plot training "$TMP/none.jsonl" "$TMP/none.jsonl" --label one --output "$TMP/x.svg"
  [[ $status -eq 2 && "$err" == *"--label"*"one per run"* ]] || fail "$status: $err"
  run_split mt-plot training "$TMP/missing.jsonl" --output "$TMP/x.svg"
  [[ $status -eq 1 && "$err" == "mt-plot: error: $TMP/missing.jsonl: cannot open" ]] || fail "$status: $err"
  run_split mt-plot
  [[ $status -eq 2 && "$err" == *"one of training, memory"* ]] || fail "$status: $err"
  [[ ! -e "$TMP/x.svg" ]] || fail "an SVG was written"
}
