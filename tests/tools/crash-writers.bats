#!/usr/bin/env bats
# The writers killed at random moments (issue 28, "make the classes impossible"), as the
# checkpoint crash test (mt-train.bats "issue14: killed 20 times ..."): mt-tokenize, mt-shard
# build, mt-ckpt convert, import and export each rewrite an output whose previous version is in
# place (mt-shard, which refuses an index of other parameters, writes where none is), and are killed with SIGKILL at a random moment of their measured run time. After every
# kill each file under a final name is the previous output, byte for byte, or the new one
# complete (HDF5 files compared by content: their objects carry modification times), never anything else; a later run completes and cleans up. 20 rounds in all, the
# writers taken in turn (4 rounds each: the 60 s CI budget), the kill times from a printed seed
# (MT_CRASH_SEED replays them). A second case kills mt-tokenize at the one moment a .bin/.idx pair
# is neither version (between its renames, MT_TOKEN_DATASET_FAULT): never a mixed pair.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
}

teardown() { rm -rf "$TMP"; }

TOK="--json-keys text --tokenizer-type GPT2BPETokenizer --append-eod --workers 1"
TINY=(--model tiny-gpt --hidden-size 256 --num-attention-heads 4 --num-layers 4 --mock-data --vocab-size 97
      --seq-length 16 --micro-batch-size 2 --global-batch-size 2 --eval-iters 0)

# writer NAME VERSION [bg]: writes version A or B of NAME's output (the files `outputs NAME`
# lists); with bg the tool replaces the (background) shell, so its pid is the tool's.
writer() {
  local t="$MT_ROOT/data/tokenizers/gpt2" run=()
  [[ "${3:-}" == bg ]] && run=(exec)
  case "$1" in
    tokenize) # shellcheck disable=SC2086
      "${run[@]}" mt-tokenize $TOK --vocab-file "$t/encoder.json" --merge-file "$t/vocab.bpe" --input "$TMP/$2.jsonl" \
        --output-prefix "$TMP/out/tok" --output-format both ;;
    shard) # mt-shard refuses an index of other parameters: its previous output is none
      [[ $2 == A ]] && return 0
      "${run[@]}" mt-shard build --data-path "$TMP/ref/A/tok_text_document" --seq-length 16 --train-samples 4000 \
        --eval-iters 10 --split 98,1,1 --output "$TMP/out/index.h5" ;;
    convert) "${run[@]}" mt-ckpt convert "$TMP/ck$2.h5" "$TMP/out/conv.h5" --dtype bf16 --force ;;
    import) "${run[@]}" mt-ckpt import --format hf "$TMP/hf$2" "$TMP/out/imp.h5" --force ;;
    export) "${run[@]}" mt-ckpt export --format hf "$TMP/ck$2.h5" "$TMP/out/hf" --force ;;
  esac
}

outputs() {
  case "$1" in
    tokenize) echo tok_text_document.bin tok_text_document.idx tok_text_document.h5 ;;
    shard) echo index.h5 ;;
    convert) echo conv.h5 ;;
    import) echo imp.h5 ;;
    export) echo hf/model.safetensors hf/config.json ;;
  esac
}

# same FILE REFERENCE: FILE is REFERENCE, byte for byte, or for HDF5 files (whose objects carry
# modification times) the same groups, datasets, values and attributes (h5diff).
same() {
  [[ -e "$1" && -e "$2" ]] || return 1
  cmp -s "$1" "$2" && return 0
  [[ "$1" == *.h5 ]] && h5diff -q "$1" "$2" >/dev/null 2>&1
}

@test "crash: mt-tokenize, mt-shard build, mt-ckpt convert/import/export killed 20 times at random moments (seed printed) leave the previous output or the new one complete" {
  local seed="${MT_CRASH_SEED:-$(( $(date +%s%N) % 1000000 ))}"
  echo "# MT_CRASH_SEED=$seed (set it to replay these kill times)" >&3
  RANDOM=$seed
  # Inputs: two JSONL texts; two checkpoints of one model (seeds 1 and 2) and their HF exports.
  jq -R -s -c 'split("\n\n")[:400][] | {text: .}' "$MT_ROOT/data/demo/tinyshakespeare.txt" >"$TMP/A.jsonl"
  jq -R -s -c 'split("\n\n")[400:800][] | {text: .}' "$MT_ROOT/data/demo/tinyshakespeare.txt" >"$TMP/B.jsonl"
  for v in A B; do
    mt-train "${TINY[@]}" --train-iters 1 --seed "$([[ $v == A ]] && echo 1 || echo 2)" --save-final "$TMP/ck$v.h5" \
      >/dev/null 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
    mt-ckpt export --format hf "$TMP/ck$v.h5" "$TMP/hf$v" >/dev/null || fail "export $v"
  done
  # Each writer's two complete outputs, and its run time (the window the kills fall in).
  local name v f
  declare -A window_ms
  for name in tokenize shard convert import export; do
    for v in A B; do
      rm -rf "$TMP/out" && mkdir -p "$TMP/out" "$TMP/ref/$v"
      local start=$(date +%s%N)
      writer "$name" "$v" >/dev/null 2>"$TMP/err.log" || fail "$name $v: $(cat "$TMP/err.log")"
      window_ms[$name]=$(( ($(date +%s%N) - start) / 1000000 ))
      for f in $(outputs "$name"); do
        [[ -e "$TMP/out/$f" ]] || continue  # none (mt-shard's version A)
        mkdir -p "$(dirname "$TMP/ref/$v/$f")" && cp "$TMP/out/$f" "$TMP/ref/$v/$f"
      done
    done
    for f in $(outputs "$name"); do
      same "$TMP/ref/A/$f" "$TMP/ref/B/$f" && [[ "$f" != hf/config.json ]] && fail "$name: versions A and B of $f are the same"
    done
  done
  local round delay_ms pid new=0 old=0
  local names=(tokenize shard convert import export)
  for round in $(seq 20); do
    name="${names[$(( (round - 1) % 5 ))]}"
    rm -rf "$TMP/out" && mkdir -p "$TMP/out"
    for f in $(outputs "$name"); do
      mkdir -p "$(dirname "$TMP/out/$f")"
      [[ ! -e "$TMP/ref/A/$f" ]] || cp "$TMP/ref/A/$f" "$TMP/out/$f"
    done
    delay_ms=$(( (RANDOM * 32768 + RANDOM) % (window_ms[$name] + 1) ))
    writer "$name" B bg >/dev/null 2>&1 &
    pid=$!
    sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for f in $(outputs "$name"); do
      if same "$TMP/out/$f" "$TMP/ref/B/$f"; then new=$((new + 1))
      elif cmp -s "$TMP/out/$f" "$TMP/ref/A/$f" || [[ ! -e "$TMP/out/$f" && ! -e "$TMP/ref/A/$f" ]]; then old=$((old + 1))
      else fail "round $round, $name killed ${delay_ms} ms in (of ${window_ms[$name]}): $f is neither the previous output nor the new one"
      fi
    done
    # A run after the kill completes the new output (and removes the dead run's temporaries).
    writer "$name" B >/dev/null 2>"$TMP/err.log" || fail "round $round, $name after the kill: $(cat "$TMP/err.log")"
    for f in $(outputs "$name"); do same "$TMP/out/$f" "$TMP/ref/B/$f" || fail "round $round, $name: $f not rewritten"; done
    [[ -z "$(find "$TMP/out" -name '*.tmp-*')" ]] || fail "round $round, $name: temporaries left: $(find "$TMP/out" -name '*.tmp-*')"
  done
  echo "# windows (ms): $(for name in "${names[@]}"; do printf '%s %s ' "$name" "${window_ms[$name]}"; done); files found new $new, previous $old" >&3
}

@test "crash: a kill between the .bin and .idx renames (MT_TOKEN_DATASET_FAULT) never leaves a new .bin beside the previous .idx; mt and Megatron's layout refuse the lone .bin, a rerun completes" {
  local t="$MT_ROOT/data/tokenizers/gpt2" prefix="$TMP/out/tok_text_document" ext
  local gpt2=(--vocab-file "$t/encoder.json" --merge-file "$t/vocab.bpe" --output-format megatron)
  jq -R -s -c 'split("\n\n")[:200][] | {text: .}' "$MT_ROOT/data/demo/tinyshakespeare.txt" >"$TMP/A.jsonl"
  jq -R -s -c 'split("\n\n")[200:500][] | {text: .}' "$MT_ROOT/data/demo/tinyshakespeare.txt" >"$TMP/B.jsonl"
  mkdir -p "$TMP/out" "$TMP/ref"
  # shellcheck disable=SC2086
  mt-tokenize $TOK "${gpt2[@]}" --input "$TMP/B.jsonl" --output-prefix "$TMP/ref/tok" >/dev/null || fail "version B"
  # shellcheck disable=SC2086
  mt-tokenize $TOK "${gpt2[@]}" --input "$TMP/A.jsonl" --output-prefix "$TMP/out/tok" >/dev/null || fail "version A"
  cp "$prefix.idx" "$TMP/ref/previous.idx"
  # shellcheck disable=SC2086
  run_split env MT_TOKEN_DATASET_FAULT=between-renames:kill mt-tokenize $TOK "${gpt2[@]}" --input "$TMP/B.jsonl" \
    --output-prefix "$TMP/out/tok"
  [[ $status -eq 137 ]] || fail "the injected kill did not happen: status $status: $err"
  # The pair under the final names is never mixed: the previous .idx went before the new .bin came.
  cmp -s "$prefix.bin" "$TMP/ref/tok_text_document.bin" || fail "the .bin is not the new one"
  if [[ -e "$prefix.idx" ]]; then
    cmp -s "$prefix.idx" "$TMP/ref/previous.idx" && fail "the new .bin is beside the previous .idx (a mixed pair)"
    fail "an .idx is beside the new .bin"
  fi
  run_split mt-tokenize merge --input "$TMP/out/tok_text_document" --output-prefix "$TMP/merged" --vocab-size 50257
  [[ $status -ne 0 && "$err" == *"$prefix.bin exists but $prefix.idx does not"* ]] || fail "mt read it: $status $err"
  run_split python3 "$MT_ROOT/tests/data/read_megatron_idx.py" "$prefix"
  [[ $status -ne 0 ]] || fail "Megatron's layout read a .bin without its .idx"
  # shellcheck disable=SC2086
  mt-tokenize $TOK "${gpt2[@]}" --input "$TMP/B.jsonl" --output-prefix "$TMP/out/tok" >/dev/null || fail "the rerun failed"
  for ext in bin idx; do cmp "$prefix.$ext" "$TMP/ref/tok_text_document.$ext" || fail "rerun .$ext"; done
  [[ -z "$(find "$TMP/out" -name '*.tmp-*')" ]] || fail "temporaries left: $(find "$TMP/out" -name '*.tmp-*')"
}
