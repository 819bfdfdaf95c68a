#!/usr/bin/env bats
# Bad input, lost work and signals (the table in tests/BAD_INPUTS.md): each test is one case of
# issue 11 that a tool answers, checking its exit code and one-line message, and that nothing is
# lost or left behind.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
  TINY=(--model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4
        --eval-iters 0 --peak-tflops 1)
  GPT2=(--tokenizer-type GPT2BPETokenizer --vocab-file "$MT_ROOT/data/tokenizers/gpt2/encoder.json"
        --merge-file "$MT_ROOT/data/tokenizers/gpt2/vocab.bpe")
}

teardown() {
  [[ -z "${PID:-}" ]] || kill -9 "$PID" 2>/dev/null || true
  rm -rf "$TMP"
}

# A usage error of mt-train on the tiny model: exit 2, nothing on stdout, exactly the line
# "mt-train: error: $1".
refused() {
  local expected="$1"
  shift
  run_split mt-train "${TINY[@]}" --train-iters 1 "$@"
  [[ $status -eq 2 && -z "$out" ]] || fail "'$*' exited $status: $out $err"
  [[ "$err" == "mt-train: error: $expected" ]] || fail "'$*': $err"
}

# No temporary file anywhere under $TMP.
no_temporaries() {
  local left
  left="$(find "$TMP" -name '*.tmp-*')"
  [[ -z "$left" ]] || fail "temporaries left: $left"
}

# mt-train in the background with every signal at its default action (a non-interactive shell
# starts background jobs with SIGINT ignored); returns once its first step record is out.
start_training() {
  env --default-signal mt-train "$@" --log-interval 1000000 >"$TMP/out.jsonl" 2>"$TMP/err.log" &
  PID=$!
  for _ in $(seq 600); do
    grep -q '"record":"step"' "$TMP/out.jsonl" 2>/dev/null && return 0
    sleep 0.05
  done
  fail "no step within 30 s: $(cat "$TMP/err.log")"
}

@test "issue11 case 1: an output path that cannot be written is refused before step 1" {
  run_split mt-train "${TINY[@]}" --train-iters 300 --save-final "$TMP/missing/final.h5"
  [[ $status -eq 1 && -z "$out" ]] || fail "the run started: $status $(printf '%s' "$out" | head -c 300)"
  [[ "$err" == "mt-train: error: --save-final $TMP/missing/final.h5: cannot write: directory $TMP/missing does not exist" ]] \
    || fail "$err"
  touch "$TMP/file"
  run_split mt-train "${TINY[@]}" --train-iters 300 --save-init "$TMP/file/init.h5" --save-final "$TMP/final.h5"
  [[ $status -eq 1 && -z "$out" && "$err" == "mt-train: error: --save-init $TMP/file/init.h5: cannot write: "* ]] \
    || fail "$status $err"
  if [[ $EUID -ne 0 ]]; then  # root writes through permission bits
    mkdir "$TMP/read-only" && chmod 555 "$TMP/read-only"
    run_split mt-train "${TINY[@]}" --train-iters 300 --save-final "$TMP/read-only/final.h5"
    [[ $status -eq 1 && -z "$out" && "$err" == *"cannot write in $TMP/read-only: Permission denied" ]] || fail "$err"
  fi
  [[ ! -e "$TMP/final.h5" ]] || fail "final.h5 written by a refused run"
  # The sample index cache is written before step 1 too.
  "$BATS_TEST_DIRNAME/make_token_dataset.py" "$TMP/a" h5 100 0 counting:600:6:1
  run_split mt-train --model tiny-gpt --data-path "$TMP/a" --seq-length 16 --train-iters 2 --eval-iters 0 \
    --peak-tflops 1 --data-cache-path "$TMP/file/cache"
  [[ $status -eq 1 && -z "$out" && "$err" == "mt-train: error: $TMP/file/cache: cannot create the index directory: Not a directory" ]] \
    || fail "$status $err"
  no_temporaries
}

@test "issue11 case 2: a model far too big is refused before anything large exists" {
  # 1.5 GB of address space holds the tool and its libraries, nothing large.
  run_split bash -c "ulimit -v 1500000 && exec mt-train ${TINY[*]} --train-iters 1 --hidden-size 65536 --num-attention-heads 1 --num-layers 2147483647"
  [[ $status -eq 1 && -z "$out" && "$(line_count "$err")" -eq 1 ]] || fail "$status $err"
  [[ "$err" == "mt-train: error: model tiny-gpt: needs more than 1 EiB ("*"): counts that large overflow 64-bit arithmetic; use a smaller model" ]] \
    || fail "$err"
  run_split bash -c "ulimit -v 1500000 && exec mt-train ${TINY[*]} --train-iters 1 --num-layers 1000000"
  [[ $status -eq 1 && -z "$out" && "$(line_count "$err")" -eq 1 ]] || fail "$status $err"
  [[ "$err" == "mt-train: error: model tiny-gpt: needs at least "*" GiB (weights "*") but only "*" is available; use a smaller model, micro-batch or recompute" ]] \
    || fail "$err"
}

@test "issue11 case 3: SIGTERM, SIGINT, SIGHUP and SIGUSR1 finish the step, write --save-final and the summary, exit 128+n" {
  for signal in TERM INT HUP USR1; do
    rm -f "$TMP/final.h5"
    start_training "${TINY[@]}" --train-iters 100000000 --save-final "$TMP/final.h5"
    kill -s "$signal" "$PID"
    wait "$PID" && status=0 || status=$?
    PID=""
    [[ $status -eq $((128 + $(kill -l "$signal"))) ]] || fail "SIG$signal: exit $status: $(cat "$TMP/err.log")"
    h5ls "$TMP/final.h5/model" >/dev/null || fail "SIG$signal: no parameters in final.h5"
    jq -e -s --arg s "SIG$signal" '.[-1].record == "summary" and .[-1].stopped_by == $s and .[-2].record == "ckpt"
        and .[-2].iteration == .[-1].iterations and .[-1].iterations == ([.[] | select(.record == "step")] | length)' \
      "$TMP/out.jsonl" >/dev/null || fail "SIG$signal: $(tail -n 3 "$TMP/out.jsonl")"
    [[ "$(grep -c "SIG$signal" "$TMP/err.log")" -eq 1 ]] || fail "SIG$signal: $(cat "$TMP/err.log")"
    grep -qx "mt-train: stopped by SIG$signal after iteration [0-9]* of 100000000; wrote $TMP/final.h5" "$TMP/err.log" \
      || fail "SIG$signal: $(cat "$TMP/err.log")"
    no_temporaries
  done
}

@test "issue11 case 3 with --save (issue 14): SIGTERM, SIGINT, SIGHUP and SIGUSR1 save a resumable checkpoint and exit 75" {
  for signal in TERM INT HUP USR1; do
    rm -rf "$TMP/ck"
    start_training "${TINY[@]}" --train-iters 100000000 --save "$TMP/ck"
    kill -s "$signal" "$PID"
    wait "$PID" && status=0 || status=$?
    PID=""
    [[ $status -eq 75 ]] || fail "SIG$signal: exit $status: $(cat "$TMP/err.log")"
    local steps
    steps="$(jq -s '[.[] | select(.record == "step")] | length' "$TMP/out.jsonl")"
    [[ "$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" == "$steps" ]] || fail "SIG$signal: tracker vs $steps steps"
    mt-ckpt verify "$TMP/ck" >/dev/null || fail "SIG$signal: the checkpoint does not verify"
    grep -qx "mt-train: stopped by SIG$signal after iteration $steps of 100000000; saved a checkpoint in $TMP/ck (resume with --load)" \
      "$TMP/err.log" || fail "SIG$signal: $(cat "$TMP/err.log")"
    no_temporaries
  done
}

@test "issue11 case 3: a second signal exits at once, without the summary" {
  # Steps of ~0.2 s, so both signals (sent microseconds apart) land in the same step.
  start_training --model tiny-gpt --mock-data --vocab-size 97 --num-layers 4 --hidden-size 256 --num-attention-heads 4 \
    --seq-length 256 --max-position-embeddings 256 --micro-batch-size 4 --train-iters 100000 --eval-iters 0 \
    --peak-tflops 1 --save-final "$TMP/final.h5"
  /usr/bin/python3 -c "import os, signal; os.kill($PID, signal.SIGTERM); os.kill($PID, signal.SIGINT)"
  wait "$PID" && status=0 || status=$?
  PID=""
  [[ $status -eq 130 || $status -eq 143 ]] || fail "exit $status: $(cat "$TMP/err.log")"
  grep -q "^mt-train: second signal, SIG[A-Z]*; exiting now$" "$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  [[ ! -e "$TMP/final.h5" ]] || fail "final.h5 written after a second signal"
  ! grep -q '"record":"summary"' "$TMP/out.jsonl" || fail "a summary after a second signal"
  no_temporaries
}

@test "issue11 case 4: a signal to mt-tokenize removes its temporaries; a later run removes stale ones of dead processes of this host" {
  local host
  host="$(hostname)"
  for signal in TERM INT HUP USR1; do
    rm -f "$TMP/fifo" && mkfifo "$TMP/fifo"
    env --default-signal mt-tokenize --input - "${GPT2[@]}" --output-prefix "$TMP/t" --output-format both \
      <"$TMP/fifo" >/dev/null 2>"$TMP/err.log" &
    PID=$!
    exec 7>"$TMP/fifo"
    jq -R -s -c 'split("\n\n")[] | {text: .}' "$MT_ROOT/data/demo/tinyshakespeare.txt" | head -n 2000 >&7
    local temporary=""
    for _ in $(seq 200); do
      temporary="$(find "$TMP" -name 't_text_document.bin.tmp-*')"
      [[ -z "$temporary" ]] || break
      sleep 0.05
    done
    [[ "$(basename "$temporary")" =~ ^t_text_document\.bin\.tmp-$host-$PID-[0-9a-f]{8}$ ]] || fail "name: '$temporary'"
    kill -s "$signal" "$PID"
    exec 7>&-
    wait "$PID" && status=0 || status=$?
    PID=""
    [[ $status -eq $((128 + $(kill -l "$signal"))) ]] || fail "SIG$signal: exit $status"
    [[ "$(cat "$TMP/err.log")" == "mt-tokenize: stopped by SIG$signal; exiting now" ]] || fail "$(cat "$TMP/err.log")"
    [[ -z "$(find "$TMP" -name 't_text_document*')" ]] || fail "SIG$signal left: $(ls "$TMP")"
  done
  (exit 0) &
  local dead=$!
  wait "$dead"
  local stale="$TMP/t_text_document.bin.tmp-$host-$dead-0123abcd"
  local kept=("$TMP/t_text_document.bin.tmp-elsewhere-$dead-0123abcd" "$TMP/t_text_document.idx.tmp-$host-$$-0123abcd")
  touch "$stale" "${kept[@]}"
  run_split mt-tokenize --input "$MT_ROOT/data/corpus/edge_cases.jsonl" "${GPT2[@]}" --output-prefix "$TMP/t" \
    --output-format both --log-interval 0
  [[ $status -eq 0 ]] || fail "$err"
  [[ "$err" == "warning: removed $stale, a temporary left by process $dead of this host, which is gone" ]] || fail "$err"
  [[ ! -e "$stale" ]] || fail "the stale temporary is still there"
  for file in "${kept[@]}"; do [[ -e "$file" ]] || fail "removed $file (another host's, or a live process's)"; done
}

@test "issue11 case 6: nan, inf and meaningless real values are refused with their range" {
  refused "--lr: must be a finite number, at least 0 (got nan)" --lr nan
  refused "--lr: must be a finite number, at least 0 (got inf)" --lr inf
  refused "--weight-decay: must be a finite number, at least 0 (got nan)" --weight-decay nan
  refused "--init-method-std: must be a finite number, positive (got nan)" --init-method-std nan
  refused "--rotary-base: must be positive (got -1)" --rotary-base -1
  refused "--initial-loss-scale: must be a finite number, positive (got nan)" --initial-loss-scale nan --fp16
  refused "--lr-warmup-fraction: must be a finite number, in [0, 1] (got nan)" --lr-warmup-fraction nan
  refused "--min-lr: must be at least 0 (got -0.1)" --min-lr -0.1
  refused "--adam-beta1: must be in [0, 1) (got 1)" --adam-beta1 1
  refused "--adam-eps: must be positive (got 0)" --adam-eps 0
  refused "--clip-grad: must be a finite number, at least 0 (got inf)" --clip-grad inf
  refused "--norm-epsilon: must be positive (got 0)" --norm-epsilon 0
  refused "--hidden-dropout: must be in [0, 1) (got -0.5)" --hidden-dropout -0.5
  refused "--loss-scale: must be positive (got 0)" --loss-scale 0 --fp16
  refused "--min-loss-scale: must be a finite number, positive (got nan)" --min-loss-scale nan --fp16
}

@test "issue11 case 7: zero sizes, a peak of 0 or -1 and seeds outside [0, 2^32) are refused; the seed is in the run record" {
  refused "--global-batch-size: must be at least 1 (got 0)" --global-batch-size 0
  refused "--num-query-groups: must be at least 1 (got 0)" --num-query-groups 0 --group-query-attention
  refused "--ffn-hidden-size: must be at least 1 (got 0)" --ffn-hidden-size 0
  refused "--peak-tflops: must be positive (got 0)" --peak-tflops 0
  refused "--peak-tflops: must be positive (got -1)" --peak-tflops -1
  refused "--seed: must be in [0, 4294967295] (got -1)" --seed -1
  refused "--seed: must be in [0, 4294967295] (got 4294967296)" --seed 4294967296
  run_split mt-train "${TINY[@]}" --train-iters 1 --seed 4294967295
  [[ $status -eq 0 ]] || fail "$err"
  printf '%s\n' "$out" | jq -e -s '.[0].record == "run" and .[0].seed == 4294967295 and .[0].train.seed == 4294967295' \
    >/dev/null || fail "$(printf '%s' "$out" | head -n 1)"
}

@test "issue11 case 11: token ids beyond the model's vocabulary in a .bin/.idx are refused before training" {
  "$BATS_TEST_DIRNAME/make_token_dataset.py" "$TMP/big" bin 1000 0 counting:300:10:2
  local largest
  largest="$(/usr/bin/python3 -c "import numpy; print(int(numpy.fromfile('$TMP/big.bin', numpy.uint16).max()))")"
  (( largest >= 256 )) || fail "the fixture's largest id is $largest"
  local data=(--model tiny-gpt --seq-length 16 --micro-batch-size 2 --global-batch-size 4 --train-iters 2
              --eval-iters 0 --peak-tflops 1 --data-cache-path "$TMP/cache" --data-path)
  run_split mt-train "${data[@]}" "$TMP/big"
  [[ $status -eq 2 && -z "$out" ]] || fail "$status $err"
  [[ "$err" == "mt-train: error: --vocab-size: the largest token id in $TMP/big.bin is $largest, outside the vocabulary of 256 (the preset tiny-gpt's); give --vocab-size $((largest + 1)) or more" ]] \
    || fail "$err"
  [[ ! -e "$TMP/cache" ]] || fail "the sample index was built before the refusal"
  run_split mt-train "${data[@]}" "$TMP/big" --vocab-size 300
  [[ $status -eq 2 && "$err" == *"outside the vocabulary of 300 (--vocab-size)"* ]] || fail "$err"
  run_split mt-train "${data[@]}" "$TMP/big" --vocab-size $((largest + 1))
  [[ $status -eq 0 ]] || fail "$err"
  # An HDF5 token dataset records its vocabulary, which the model then takes.
  "$BATS_TEST_DIRNAME/make_token_dataset.py" "$TMP/rec" h5 1000 0 counting:300:10:2
  run_split mt-train "${data[@]}" "$TMP/rec"
  [[ $status -eq 0 ]] || fail "$err"
  printf '%s\n' "$out" | jq -e -s '.[0].model.vocab_size == 1000' >/dev/null || fail "$(printf '%s' "$out" | head -n 1)"
}

@test "issue11 case 13: range errors are one short line that says the range, in every tool" {
  run_split mt-tokenize --workers 0 --input x --output-prefix y "${GPT2[@]}"
  [[ $status -eq 2 && "$err" == "mt-tokenize: error: --workers: must be at least 1 (got 0)" ]] || fail "$status $err"
  run_split mt-tokenize encode --workers abc "${GPT2[@]}"
  [[ $status -eq 2 && "$err" == "mt-tokenize: error: --workers: must be an integer, at least 1 (got abc)" ]] || fail "$err"
  run_split mt-tokenize --output-format parquet --input x --output-prefix y "${GPT2[@]}"
  [[ $status -eq 2 && "$err" == "mt-tokenize: error: --output-format: must be one of hdf5, megatron, both (got parquet)" ]] \
    || fail "$err"
  run_split mt-shard build --data-path x --seq-length 0 --train-samples 1
  [[ $status -eq 2 && "$err" == "mt-shard: error: --seq-length: must be at least 1 (got 0)" ]] || fail "$err"
  run_split mt-shard inspect x.h5 --data-parallel-size 0
  [[ $status -eq 2 && "$err" == "mt-shard: error: --data-parallel-size: must be at least 1 (got 0)" ]] || fail "$err"
  run_split mt-shard inspect x.h5 --format xml
  [[ $status -eq 2 && "$err" == "mt-shard: error: --format: must be one of table, json, jsonl, csv (got xml)" ]] || fail "$err"
  refused "--num-layers: must be at least 1 (got 0)" --num-layers 0
  refused "--micro-batch-size: must be an integer, at least 1 (got 1.5)" --micro-batch-size 1.5
}

@test "issue11 case 14: --train-iters 0 or -5 and --train-samples 0 must be positive" {
  refused "--train-iters: must be positive (got 0)" --train-iters 0
  refused "--train-iters: must be positive (got -5)" --train-iters -5
  refused "--train-samples: must be positive (got 0)" --train-samples 0
  run_split mt-shard build --data-path x --seq-length 8 --train-iters 0
  [[ $status -eq 2 && "$err" == "mt-shard: error: --train-iters: must be positive (got 0)" ]] || fail "$err"
}

@test "issue11 case 18: Megatron's harmless defaults are accepted; other values are refused as not supported yet" {
  run_split mt-train "${TINY[@]}" --train-iters 2 --log-interval 1 --tensor-model-parallel-size 1 \
    --pipeline-model-parallel-size 1 --context-parallel-size 1 --expert-model-parallel-size 1 \
    --expert-tensor-parallel-size 1 --dataset-impl mmap --dataloader-type single --optimizer adam \
    --transformer-impl local --use-mcore-models --use-flash-attn --attention-softmax-in-fp32 \
    --accumulate-allreduce-grads-in-fp32 --exit-signal-handler --check-for-nan-in-loss-and-grad --log-throughput \
    --sequence-parallel
  [[ $status -eq 0 ]] || fail "$err"
  # As Megatron, sequence parallelism at TP 1 is turned off with a warning.
  [[ "$err" == *"warning: mt-train: --sequence-parallel: disabled because --tensor-model-parallel-size is 1"* ]] \
    || fail "no warning: $err"
  [[ "$err" == *"elapsed time per iteration (ms): "*" | throughput per GPU (TFLOP/s/GPU): "*" | learning rate:"* ]] \
    || fail "--log-throughput ignored: $err"
  refused "world size 1: not divisible by --tensor-model-parallel-size 2 x --context-parallel-size 1 x --pipeline-model-parallel-size 1 (data parallelism takes the rest)" \
    --tensor-model-parallel-size 2
  refused "world size 1: not divisible by --tensor-model-parallel-size 1 x --context-parallel-size 1 x --pipeline-model-parallel-size 2 (data parallelism takes the rest)" \
    --pipeline-model-parallel-size 2
  refused "world size 1: not divisible by --tensor-model-parallel-size 1 x --context-parallel-size 2 x --pipeline-model-parallel-size 1 (data parallelism takes the rest)" \
    --context-parallel-size 2 --sequence-parallel
  refused "--overlap-param-gather: needs --use-distributed-optimizer" --overlap-grad-reduce --overlap-param-gather
  refused "--dataset-impl: lazy is not supported yet (mt implements mmap, infer)" --dataset-impl lazy
  refused "--transformer-impl: transformer_engine is not supported yet (mt implements local)" \
    --transformer-impl transformer_engine
  refused "--fp8-format: needs --bf16 or --fp16 (the layers outside FP8 run in it, as Megatron's)" --fp8-format hybrid
  refused "--distributed-backend: Megatron flag not supported yet" --distributed-backend nccl
}

# Runs "$@" with stdout a pipe whose reader leaves after $1 lines (as `| head -n $1` does) and every
# signal at its default action (SIGPIPE included, as a shell starts it): $status (128 + n for a
# signal), $err.
reader_leaves_after() {
  /usr/bin/python3 - "$@" 2>"$TMP/closed.err" <<'PY' && status=0 || status=$?
import os, subprocess, sys
read_end, write_end = os.pipe()
tool = subprocess.Popen(sys.argv[2:], stdout=write_end)
os.close(write_end)
with os.fdopen(read_end, "rb") as reader:
    for _ in range(int(sys.argv[1])):
        reader.readline()
code = tool.wait()
sys.exit(128 - code if code < 0 else code)
PY
  err="$(cat "$TMP/closed.err")"
}

@test "issue28 L5: a closed stdout (mt-train | head -1) stops mt-train with a save and exit 75; other tools say so in one line" {
  reader_leaves_after 3 mt-train "${TINY[@]}" --train-iters 100000 --save "$TMP/ck"
  [[ $status -eq 75 ]] || fail "exit $status: $err"
  local saved
  saved="$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" || fail "no tracker: $err"
  mt-ckpt verify "$TMP/ck" >/dev/null || fail "the checkpoint does not verify"
  [[ "$(tail -n 1 <<<"$err")" == "mt-train: stopped by stdout (Broken pipe) after iteration $saved of 100000; saved a checkpoint in $TMP/ck (resume with --load)" ]] \
    || fail "$err"
  # The probe's pipeline: head leaves after the first line.
  rm -rf "$TMP/ck"
  env --default-signal mt-train "${TINY[@]}" --train-iters 100000 --save "$TMP/ck" 2>"$TMP/err.log" | head -n 1 >/dev/null
  [[ "${PIPESTATUS[0]}" -eq 75 && -s "$TMP/ck/latest_checkpointed_iteration.txt" ]] || fail "$(cat "$TMP/err.log")"
  # A tool that cannot stop cleanly reports the write error in one line, exit 1.
  reader_leaves_after 0 mt-ckpt verify "$TMP/ck"
  [[ $status -eq 1 && "$err" == "mt-ckpt: error: stdout: write failed: Broken pipe" ]] || fail "exit $status: $err"
  no_temporaries
}

@test "issue28 L7: a signal during the save a first signal started waits for it: exit 75, the tracker set; SIGKILL leaves the previous checkpoint latest" {
  # Each save takes 2 s longer (MT_TEST_SAVE_DELAY_SECONDS): SIGUSR1 (Slurm's warning) starts it,
  # SIGTERM and SIGINT arrive while it is written.
  export MT_TEST_SAVE_DELAY_SECONDS=2
  start_training "${TINY[@]}" --train-iters 100000 --save "$TMP/ck"
  kill -USR1 "$PID"
  sleep 0.7
  kill -TERM "$PID"
  sleep 0.3
  kill -INT "$PID"
  wait "$PID" && status=0 || status=$?
  PID=""
  [[ $status -eq 75 ]] || fail "exit $status: $(cat "$TMP/err.log")"
  grep -qx "mt-train: SIGTERM during a save; finishing the save first (at most 120 s)" "$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  local steps
  steps="$(jq -s '[.[] | select(.record == "step")] | length' "$TMP/out.jsonl")"
  [[ "$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" == "$steps" ]] || fail "tracker vs $steps steps"
  mt-ckpt verify "$TMP/ck" >/dev/null || fail "the checkpoint does not verify"
  grep -qx "mt-train: stopped by SIGUSR1 after iteration $steps of 100000; saved a checkpoint in $TMP/ck (resume with --load)" \
    "$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  # Only SIGKILL loses the save in progress; the checkpoint before it stays the latest and verifies.
  start_training "${TINY[@]}" --train-iters 100000 --save "$TMP/ck" --load "$TMP/ck"
  kill -USR1 "$PID"
  sleep 0.7
  kill -KILL "$PID"
  wait "$PID" || true
  PID=""
  [[ "$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" == "$steps" ]] || fail "the tracker moved"
  mt-ckpt verify "$TMP/ck" >/dev/null || fail "the previous checkpoint does not verify"
}
