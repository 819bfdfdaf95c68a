#!/usr/bin/env bats
# mt-tokenize --partitions (Megatron's preprocess_data.py with --partitions N and a glob --input):
# the partition files and the merged .bin/.idx/.h5 equal an independent restatement of Megatron's
# dealing (tests/tools/partition_reference.py, Python's glob and universal newlines) tokenized by
# one plain mt-tokenize process; --keep-sequential-samples equals one process over the files in
# glob order; 2 and 3 MPI ranks give the same bytes as one; a rank without a shared filesystem
# stops naming it; bad input is a one-line error.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
  TOK="$MT_ROOT/data/tokenizers"
  GPT2=(--tokenizer-type GPT2BPETokenizer --vocab-file "$TOK/gpt2/encoder.json" --merge-file "$TOK/gpt2/vocab.bpe")
  mkdir -p "$TMP/in" "$TMP/out" "$TMP/ref"
  # Three files of unequal length (7, 4, 5 lines) with CRLF, a lone CR and a last line without
  # its newline: Python's text mode ends lines at each.
  for i in 1 2 3 4 5 6 7; do printf '{"text": "alpha %d says hello to the world"}\n' "$i"; done >"$TMP/in/alpha.jsonl"
  printf '{"text": "beta one"}\r\n{"text": "beta two, with CRLF"}\r\n{"text": "beta three"}\r{"text": "beta four after a lone CR"}\n' \
    >"$TMP/in/beta.jsonl"
  for i in 1 2 3 4; do printf '{"text": "gamma %d: Ünïcode ✓"}\n' "$i"; done >"$TMP/in/gamma.jsonl"
  printf '{"text": "gamma last, no newline"}' >>"$TMP/in/gamma.jsonl"
  printf '{"text": "not matched"}\n' >"$TMP/in/other.txt"
  printf '{"text": "hidden, not matched by *"}\n' >"$TMP/in/.hidden.jsonl"
}

teardown() { rm -rf "$TMP"; }

# `reference_run N [sequential]`: the reference files for N partitions, tokenized by one plain
# process into $TMP/ref/one_text_document.* (run before mt's partition files join the glob).
reference_run() {
  local partitions="$1" mode="$2"
  REF_FILES="$(python3 "$MT_ROOT/tests/tools/partition_reference.py" "$TMP/in/*.jsonl" "$partitions" "$TMP/ref" $mode)"
  # shellcheck disable=SC2086 # REF_FILES is a list of paths without spaces
  mt-tokenize "${GPT2[@]}" --input $REF_FILES --output-prefix "$TMP/ref/one" --output-format both --append-eod >/dev/null
}

same_outputs() {
  local prefix="$1"
  for ext in bin idx h5; do
    cmp "$prefix"_text_document.$ext "$TMP/ref/one_text_document.$ext" || fail "$prefix .$ext differs from the reference"
  done
}

@test "issue26 partitions: round robin equals Megatron's dealing, merged in partition order" {
  mkdir "$TMP/ref1"
  python3 "$MT_ROOT/tests/tools/partition_reference.py" "$TMP/in/*.jsonl" 1 "$TMP/ref1" >/dev/null
  reference_run 3
  run_split mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 3 --workers 3 --append-eod \
    --output-prefix "$TMP/out/p" --output-format both
  [[ $status -eq 0 ]] || fail "$err"
  for i in 0 1 2; do cmp "$TMP/in/*_$i.jsonl" "$TMP/ref/ref_$i.jsonl" || fail "partition file $i"; done
  same_outputs "$TMP/out/p"
  for i in 0 1 2; do [[ -f "$TMP/out/p_${i}_text_document.idx" ]] || fail "partition output $i missing"; done
  [[ "$(jq -c 'select(.record=="summary") | [.documents, .partitions, .ranks]' <<<"$out")" == "[16,3,1]" ]] || fail "$out"
  # Round robin reorders documents: the merged file differs from one process in glob order.
  mt-tokenize "${GPT2[@]}" --input "$TMP/ref1/ref_0.jsonl" \
    --output-prefix "$TMP/ref/plain" --output-format megatron --append-eod >/dev/null
  ! cmp -s "$TMP/out/p_text_document.bin" "$TMP/ref/plain_text_document.bin" || fail "round robin kept the input order"
}

@test "issue26 partitions: --keep-sequential-samples equals one process over the files in glob order" {
  reference_run 4 sequential
  run_split mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 4 --workers 4 --keep-sequential-samples \
    --append-eod --output-prefix "$TMP/out/s" --output-format both
  [[ $status -eq 0 ]] || fail "$err"
  for i in 0 1 2 3; do cmp "$TMP/in/*_$i.jsonl" "$TMP/ref/ref_$i.jsonl" || fail "partition file $i"; done
  same_outputs "$TMP/out/s"
  # A rerun with all partition files present reuses them, as Megatron does, and says so.
  run_split mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 4 --workers 4 --keep-sequential-samples \
    --append-eod --output-prefix "$TMP/out/s" --output-format both
  [[ $status -eq 0 && "$err" == *"reused the existing partition files"* ]] || fail "$status $err"
  same_outputs "$TMP/out/s"
}

@test "issue26 partitions: 2 and 3 MPI ranks write the same files as one" {
  mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 3 --workers 3 --append-eod \
    --output-prefix "$TMP/out/one" --output-format both >/dev/null
  rm "$TMP"/in/*_?.jsonl
  for ranks in 2 3; do
    run_split mpirun_n "$ranks" mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 3 --workers 3 \
      --append-eod --output-prefix "$TMP/out/r$ranks" --output-format both
    [[ $status -eq 0 ]] || fail "$ranks ranks: $err"
    [[ "$(jq -c 'select(.record=="summary") | [.documents, .ranks]' <<<"$out")" == "[16,$ranks]" ]] || fail "$out"
    for ext in bin idx h5; do cmp "$TMP/out/r${ranks}_text_document.$ext" "$TMP/out/one_text_document.$ext" || fail "$ranks ranks .$ext"; done
    rm "$TMP"/in/*_?.jsonl
  done
}

@test "issue26 partitions: bad input is a one-line error" {
  run_split mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 0 --workers 2 --output-prefix "$TMP/out/p"
  [[ $status -ne 0 && "$err" == *"--partitions: must be at least 1"* ]] || fail "$err"
  run_split mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 3 --workers 2 --output-prefix "$TMP/out/p"
  [[ $status -ne 0 && "$err" == *"--workers 2: must be divisible by --partitions 3"* ]] || fail "$err"
  run_split mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.none" --partitions 2 --workers 2 --output-prefix "$TMP/out/p"
  [[ $status -ne 0 && "$err" == *"*.none: matches no file"* ]] || fail "$err"
  [[ "$(line_count "$err")" -eq 1 ]] || fail "not one line: $err"
  run_split mt-tokenize "${GPT2[@]}" --input "$TMP/in/alpha.jsonl" "$TMP/in/beta.jsonl" --partitions 2 --workers 2 --output-prefix "$TMP/out/p"
  [[ $status -eq 2 && "$err" == *"--partitions takes one input file or glob pattern"* ]] || fail "$status $err"
  run_split mt-tokenize "${GPT2[@]}" --input "$TMP/*/*.jsonl" --partitions 2 --workers 2 --output-prefix "$TMP/out/p"
  [[ $status -ne 0 && "$err" == *"wildcards in a directory name are not supported"* ]] || fail "$err"
  : >"$TMP/in/empty.jsonl"
  run_split mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 2 --workers 2 --keep-sequential-samples \
    --output-prefix "$TMP/out/p"
  [[ $status -ne 0 && "$err" == *"empty.jsonl is empty"* ]] || fail "$err"
  rm "$TMP/in/empty.jsonl"
  # Partition files of another count are inputs the glob matches: refused, never overwritten while read.
  mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 2 --workers 2 --output-prefix "$TMP/out/p" >/dev/null
  run_split mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 3 --workers 3 --output-prefix "$TMP/out/p"
  [[ $status -ne 0 && "$err" == *"a partition file of this run left by an earlier one"* ]] || fail "$err"
  run_split mpirun_n 2 mt-tokenize "${GPT2[@]}" --input "$TMP/in/alpha.jsonl" --output-prefix "$TMP/out/m"
  [[ $status -ne 0 && "$err" == *"several MPI ranks need --partitions 2 or more"* ]] || fail "$err"
  ls "$TMP/out" | grep -q '^m_' && fail "an output was left: $(ls "$TMP/out")" || true
}

@test "issue26 partitions: glob expansion equals Python's glob.glob, in its (unsorted) order" {
  for name in zeta alpha2 mid beta2 '[x]'; do cp "$TMP/in/alpha.jsonl" "$TMP/in/$name.jsonl"; done
  for pattern in '*.jsonl' '[ab]*.jsonl' '[!a]*' '?eta*.jsonl' '.*' 'alpha.jsonl' '*a*[.]jsonl' '[[]x].jsonl' '*[0-9]*'; do
    expected="$(python3 -c 'import glob,json,sys; print(json.dumps(glob.glob(sys.argv[1])))' "$TMP/in/$pattern")"
    run_split mt-tokenize "${GPT2[@]}" --input "$TMP/in/$pattern" --partitions 2 --workers 2 --output-prefix "$TMP/out/g"
    [[ $status -eq 0 ]] || fail "$pattern: $err"
    [[ "$(jq -c 'select(.record=="summary") | .inputs' <<<"$out")" == "$(jq -c . <<<"$expected")" ]] ||
      fail "$pattern: $out vs $expected"
    python3 -c 'import os,sys; r,e=os.path.splitext(sys.argv[1]); [os.remove(f"{r}_{i}{e}") for i in (0,1)]' "$TMP/in/$pattern"
  done
}

@test "issue26 partitions: a rank that cannot see the partition files (no shared filesystem) says so" {
  # Two working directories stand for two nodes' local disks: rank 1 never sees rank 0's files.
  mkdir -p "$TMP/node0/in" "$TMP/node0/out" "$TMP/node1/in" "$TMP/node1/out"
  cp "$TMP/in/alpha.jsonl" "$TMP/node0/in/a.jsonl"
  cp "$TMP/in/alpha.jsonl" "$TMP/node1/in/a.jsonl"
  local args=("${GPT2[@]}" --input 'in/*.jsonl' --partitions 2 --workers 2 --output-prefix out/x)
  run_split timeout 120 mpirun -np 1 --wdir "$TMP/node0" mt-tokenize "${args[@]}" : -np 1 --wdir "$TMP/node1" mt-tokenize "${args[@]}"
  [[ $status -ne 0 ]] || fail "a rank without the partition files succeeded"
  [[ "$err$out" == *"[rank 1] mt-tokenize: error: in/*_1.jsonl: not found on rank 1: --partitions under MPI needs the input's directory on a filesystem every rank shares"* ]] ||
    fail "$err"
  [[ ! -e "$TMP/node0/out/x_text_document.h5" ]] || fail "rank 0 merged without rank 1's partition"
}
