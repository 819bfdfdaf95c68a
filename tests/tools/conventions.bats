#!/usr/bin/env bats
# Meta-test: every mt-* tool follows the CLI conventions of docs/DESIGN.md section 5 (help, version,
# usage errors, one-line errors, stdout holds only data, JSON that parses, MPI behaviour).

setup() {
  load common
  mt_load_libs
  FIXTURES="$BATS_FILE_TMPDIR"
}

# A token dataset and its sample index for mt-shard's data invocation, made once per file.
shard_fixture() {
  [[ -f "$FIXTURES/index.h5" ]] && return 0
  "$MT_ROOT/tests/tools/make_token_dataset.py" "$FIXTURES/tokens" h5 100 0 counting:50:20:1
  mt-shard build --data-path "$FIXTURES/tokens" --split 80,10,10 --seq-length 8 --train-samples 16 --global-batch-size 4 \
    --eval-interval 4 --eval-iters 1 --output "$FIXTURES/index.h5" >/dev/null
}

# A checkpoint for mt-ckpt's data invocation, made once per file.
ckpt_fixture() {
  [[ -f "$FIXTURES/ck/latest_checkpointed_iteration.txt" ]] && return 0
  mt-train --model tiny-gpt --mock-data --seq-length 16 --train-iters 1 --eval-iters 0 --peak-tflops 1 \
    --save "$FIXTURES/ck" >/dev/null 2>&1
}

# A tool's data invocation: prints records on stdout. Every tool has one ("all seven tools are
# built" checks it), so a tool added later must add its own here.
json_invocation() {
  case "$1" in
    mt-train) echo "mt-train --model tiny-gpt --mock-data --seq-length 16 --train-iters 2 --eval-iters 0 --peak-tflops 1" ;;
    mt-shard) shard_fixture && echo "mt-shard inspect $FIXTURES/index.h5" ;;
    mt-ckpt) ckpt_fixture && echo "mt-ckpt inspect $FIXTURES/ck" ;;
    mt-mfu) echo "mt-mfu --model tiny-gpt --step-time 0.01 --peak-tflops 1" ;;
    mt-memreport) echo "mt-memreport --model tiny-gpt" ;;
    mt-plot) printf '{"record":"step","iteration":1,"lm_loss":4.5,"lr":0.001,"grad_norm":1,"tokens_per_s":100}\n' \
      >"$FIXTURES/steps.jsonl" && echo "mt-plot training $FIXTURES/steps.jsonl --output $FIXTURES/plot.svg" ;;
    mt-tokenize) echo "mt-tokenize --input $MT_ROOT/data/corpus/edge_cases.jsonl --tokenizer-type GPT2BPETokenizer --vocab-file $MT_ROOT/data/tokenizers/gpt2/encoder.json --merge-file $MT_ROOT/data/tokenizers/gpt2/vocab.bpe --output-prefix $FIXTURES/tok --log-interval 0" ;;
    *) echo "" ;;
  esac
}

@test "all seven tools are built" {
  for tool in "${MT_TOOLS[@]}"; do
    [[ -x "$MT_BIN/$tool" ]] || fail "$tool missing from $MT_BIN"
    [[ -n "$(json_invocation "$tool")" ]] || fail "$tool has no data invocation in conventions.bats"
  done
}

@test "--help and -h print usage on stdout, nothing on stderr, exit 0" {
  for tool in "${MT_TOOLS[@]}"; do
    for flag in --help -h; do
      run_split "$tool" "$flag"
      [[ $status -eq 0 ]] || fail "$tool $flag exited $status"
      [[ "$out" == *"Usage: $tool"* ]] || fail "$tool $flag: no usage on stdout"
      [[ "$out" == *"--version"* ]] || fail "$tool $flag: --version not listed"
      [[ -z "$err" ]] || fail "$tool $flag wrote to stderr: $err"
    done
  done
}

@test "--version names version, git commit and build flags" {
  for tool in "${MT_TOOLS[@]}"; do
    run_split "$tool" --version
    [[ $status -eq 0 ]] || fail "$tool --version exited $status"
    [[ "$out" =~ ^$tool\ [0-9]+\.[0-9]+\.[0-9]+\ \(git\ [0-9a-f]+(-dirty)?|unknown ]] || fail "$tool: bad version line: $out"
    for key in cuda= nccl= mpi= blas=; do
      [[ "$out" == *"$key"* ]] || fail "$tool --version lacks $key"
    done
    [[ -z "$err" ]] || fail "$tool --version wrote to stderr"
  done
}

@test "an unknown flag is a one-line usage error on stderr with exit 2" {
  for tool in "${MT_TOOLS[@]}"; do
    run_split "$tool" --no-such-flag
    [[ $status -eq 2 ]] || fail "$tool --no-such-flag exited $status"
    [[ -z "$out" ]] || fail "$tool wrote to stdout on a usage error: $out"
    [[ "$(line_count "$err")" -eq 1 ]] || fail "$tool: error is not one line: $err"
    [[ "$err" == "$tool: error: "*"--no-such-flag"* ]] || fail "$tool: bad error line: $err"
  done
}

@test "a stray positional argument is a usage error" {
  for tool in "${MT_TOOLS[@]}"; do
    run_split "$tool" stray-argument-xyz
    [[ $status -eq 2 ]] || fail "$tool stray argument exited $status"
    [[ "$err" == "$tool: error: "* ]] || fail "$tool: bad error line: $err"
  done
}

@test "issue11 case 23: records on stdout are JSONL by default in every tool, tables on request" {
  for tool in "${MT_TOOLS[@]}"; do
    local invocation
    invocation="$(json_invocation "$tool")"
    run_split bash -c "$invocation"
    [[ $status -eq 0 ]] || fail "$tool: '$invocation' exited $status: $err"
    printf '%s\n' "$out" | jq -e -s '.[0].record == "run" and (.[1:] | length > 0) and all(.[]; .record | type == "string")' \
      >/dev/null || fail "$tool: not JSONL by default: $(printf '%s' "$out" | head -c 300)"
    run_split bash -c "$invocation --format table"
    [[ $status -eq 0 && "$out" == "# "* ]] || fail "$tool --format table: $(printf '%s' "$out" | head -c 300)"
  done
}

@test "issue11 case 22: the README's introduction promises only what runs today" {
  local intro
  intro="$(sed -n '1,/^## Status/p' "$MT_ROOT/README.md")"
  if [[ -z "$(find "$MT_ROOT/sbatch" "$MT_ROOT/recipes" -type f ! -name README.md)" ]]; then
    [[ "$intro" != *sbatch* ]] || fail "the introduction names sbatch launches; sbatch/ holds no template"
  fi
  [[ "$intro" != *"launches natively"* ]] || fail "the introduction promises native launches"
  [[ "$intro" == *"one rank"* && "$intro" == *"tensor, sequence, context (ring attention) and data parallelism"* \
     && "$intro" == *"pipeline parallelism"* ]] \
    || fail "the introduction does not say mt-train runs on one rank or with TP, SP, CP, DP and PP today"
  [[ "$intro" == *"mixture-of-experts models with expert parallelism"* && "$intro" == *"multi-token prediction"*"are not there yet"* ]] \
    || fail "the introduction does not say which parallelism is missing"
  [[ "$intro" == *"BERT trains on the CPU"*"under TP, SP, DP and PP; not under context parallelism, not on GPUs yet"* ]] \
    || fail "the introduction does not say where BERT trains and where it does not"
}

@test "JSON output of every built tool parses and stdout holds only data" {
  local checked=0
  for tool in "${MT_TOOLS[@]}"; do
    local invocation
    invocation="$(json_invocation "$tool")"
    [[ -n "$invocation" ]] || continue
    run_split bash -c "$invocation --json"
    [[ $status -eq 0 ]] || fail "$tool: '$invocation --json' exited $status: $err"
    printf '%s' "$out" | jq -e . >/dev/null || fail "$tool: --json output does not parse: $out"
    run_split bash -c "$invocation --format jsonl"
    printf '%s\n' "$out" | jq -e -s '.[0].record == "run"' >/dev/null || fail "$tool: jsonl does not lead with a run record"
    # tools re-execute themselves so that idle OpenMP threads wait passively; mt-tokenize runs no
    # OpenMP region and says so (tools/common/tool_main.cpp)
    local policy=passive
    [[ "$tool" == mt-tokenize ]] && policy=unused
    printf '%s\n' "$out" | jq -e -s --arg policy "$policy" '.[0].openmp_wait_policy == $policy' >/dev/null ||
      fail "$tool: OpenMP wait policy not $policy"
    checked=$((checked + 1))
  done
  if [[ $checked -eq 0 ]]; then skip "no tool produces records yet"; fi
}

@test "MT_CPU_ISA unknown or above the CPU's level is a usage error; --help ignores it" {
  run_split env MT_CPU_ISA=sse9 mt-shard inspect /nonexistent
  [[ $status -eq 2 ]] || fail "unknown MT_CPU_ISA exited $status"
  [[ "$err" == "mt-shard: error: MT_CPU_ISA: MT_CPU_ISA=sse9: unknown level"* ]] || fail "$err"
  run_split env MT_CPU_ISA=sse9 mt-shard --help
  [[ $status -eq 0 ]] || fail "--help must not depend on MT_CPU_ISA"
  if ! grep -q avx512_bf16 /proc/cpuinfo; then
    run_split env MT_CPU_ISA=avx512-bf16 mt-shard inspect /nonexistent
    [[ $status -eq 2 && "$err" == *"not supported by this CPU"* ]] || fail "$status: $err"
  fi
  run_split env MT_CPU_ISA=x86-64-v2 mt-shard inspect /nonexistent
  [[ $status -eq 1 && "$err" == *"/nonexistent"* ]] || fail "a lower level must be accepted: $err"
}

@test "--help and --version never start MPI, even with launcher variables set" {
  for tool in "${MT_TOOLS[@]}"; do
    run_split env PMIX_RANK=0 OMPI_COMM_WORLD_SIZE=2 timeout 20 "$tool" --help
    [[ $status -eq 0 ]] || fail "$tool --help with launcher env exited $status"
    run_split env PMIX_RANK=0 OMPI_COMM_WORLD_SIZE=2 timeout 20 "$tool" --version
    [[ $status -eq 0 ]] || fail "$tool --version with launcher env exited $status"
  done
}

@test "under mpirun a failing tool aborts the job with rank-prefixed one-line errors" {
  run_split timeout 60 mpirun -np 2 --oversubscribe mt-train --model tiny-gpt --mock-data --train-iters 1 \
    --tensor-model-parallel-size 4
  [[ $status -ne 0 && $status -ne 124 ]] || fail "mpirun mt-train exited $status (124 = hung)"
  [[ -z "$out" ]] || fail "stdout not empty: $out"
  [[ "$err" == *"[rank "*"] mt-train: error: world size 2: not divisible by --tensor-model-parallel-size 4"* ]] || fail "no rank-prefixed error: $err"
  run_split timeout 60 mpirun -np 2 --oversubscribe mt-shard inspect /nonexistent
  [[ $status -ne 0 && $status -ne 124 ]] || fail "mpirun mt-shard exited $status (124 = hung)"
  [[ "$err" == *"[rank "*"] mt-shard: error: /nonexistent"* ]] || fail "no rank-prefixed error: $err"
}
