#!/usr/bin/env bats
# mt-tokenize --partitions (Megatron's preprocess_data.py with --partitions N and a glob --input):
# the .bin/.idx/.h5 equal an independent restatement of Megatron's dealing
# (tests/tools/partition_reference.py, Python's glob and universal newlines) tokenized by one plain
# mt-tokenize process, and no partition file or per-partition output is written; partition files
# an earlier run left are read instead; --keep-sequential-samples equals one process over the files
# in glob order; 2 and 3 MPI ranks give those bytes (each reading its byte-range chunks), with
# two keys and pre-split sentences too, and with more ranks than lines; a rank without the input
# (no shared filesystem) or with another copy stops naming it; bad input is a one-line error.

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

# `reference_run N [sequential]`: the reference's partition files for N partitions ($TMP/ref,
# outside the glob), tokenized by one plain process into $TMP/ref/one_text_document.*.
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

# No partition file (`<root>_<i><ext>`) nor per-partition output beside the merged one.
no_partition_files() {
  local left
  left="$(cd "$TMP" && ls in/*_[0-9]*.jsonl out/*_[0-9]*_document.* 2>/dev/null)" || true
  [[ -z "$left" ]] || fail "partition files were written: $left"
}

@test "issue26 partitions: round robin equals Megatron's dealing, written in partition order, no partition files" {
  mkdir "$TMP/ref1"
  python3 "$MT_ROOT/tests/tools/partition_reference.py" "$TMP/in/*.jsonl" 1 "$TMP/ref1" >/dev/null
  reference_run 3
  run_split mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 3 --workers 3 --append-eod \
    --output-prefix "$TMP/out/p" --output-format both
  [[ $status -eq 0 ]] || fail "$err"
  same_outputs "$TMP/out/p"
  no_partition_files
  [[ "$(jq -c 'select(.record=="summary") | [.documents, .partitions, .ranks, .bytes]' <<<"$out")" == \
     "[16,3,1,$(cat "$TMP"/in/*.jsonl | wc -c)]" ]] || fail "$out"
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
  same_outputs "$TMP/out/s"
  no_partition_files
}

@test "issue26 partitions: partition files an earlier run left are read instead of the input, as Megatron does" {
  # Megatron's partition files of a round-robin run, left beside the input: a sequential run then
  # reads them (Megatron's rule: all N present), so it writes the round-robin order.
  reference_run 4
  for i in 0 1 2 3; do cp "$TMP/ref/ref_$i.jsonl" "$TMP/in/*_$i.jsonl"; done
  run_split mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 4 --workers 4 --keep-sequential-samples \
    --append-eod --output-prefix "$TMP/out/s" --output-format both
  [[ $status -eq 0 && "$err" == *"read the partition files $TMP/in/*_0.jsonl ... an earlier run left"* ]] || fail "$status $err"
  same_outputs "$TMP/out/s"
  [[ "$(jq -c 'select(.record=="summary") | .inputs' <<<"$out")" == "[]" ]] || fail "$out"
}

@test "issue26 partitions: 2 and 3 MPI ranks write the same files as one" {
  reference_run 3
  for ranks in 2 3; do
    run_split mpirun_n "$ranks" mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 3 --workers 3 \
      --append-eod --output-prefix "$TMP/out/r$ranks" --output-format both
    [[ $status -eq 0 ]] || fail "$ranks ranks: $err"
    [[ "$(jq -c 'select(.record=="summary") | [.documents, .ranks]' <<<"$out")" == "[16,$ranks]" ]] || fail "$out"
    same_outputs "$TMP/out/r$ranks"
  done
  no_partition_files
  # A corpus big enough (2 MB, War and Peace's paragraphs) that the ranks race: rank 0 must hold a
  # chunk's tokens that arrive, or that it makes, before their turn.
  mkdir "$TMP/big"
  tr -d '\r' <"$MT_ROOT/data/corpus/war_and_peace_pg2600.txt" | head -c 2000000 |
    jq -R -s -c 'split("\n\n")[] | select(length > 0) | {text: .}' >"$TMP/big/w.jsonl"
  mt-tokenize "${GPT2[@]}" --input "$TMP/big/*.jsonl" --partitions 3 --workers 3 --append-eod \
    --output-prefix "$TMP/out/big1" --output-format megatron >/dev/null
  for ranks in 2 3; do
    run_split mpirun_n "$ranks" mt-tokenize "${GPT2[@]}" --input "$TMP/big/*.jsonl" --partitions 3 --workers 3 \
      --append-eod --output-prefix "$TMP/out/big$ranks" --output-format megatron
    [[ $status -eq 0 ]] || fail "$ranks ranks, 2 MB: $err"
    # On one filesystem every rank writes its own tokens into the outputs (none sends them).
    [[ "$err" != *"sends its tokens to rank 0"* ]] || fail "$ranks ranks, 2 MB: $err"
    for ext in bin idx; do cmp "$TMP/out/big${ranks}_text_document.$ext" "$TMP/out/big1_text_document.$ext" || fail "2 MB, $ranks ranks: .$ext"; done
  done
  # More ranks than lines (and than partitions: rank 2 holds none): chunks and ranks without a
  # line start have nothing to send.
  mkdir "$TMP/few" "$TMP/ref_few"
  head -n 2 "$TMP/in/alpha.jsonl" >"$TMP/few/a.jsonl"
  REF_FILES="$(python3 "$MT_ROOT/tests/tools/partition_reference.py" "$TMP/few/*.jsonl" 2 "$TMP/ref_few")"
  # shellcheck disable=SC2086 # REF_FILES is a list of paths without spaces
  mt-tokenize "${GPT2[@]}" --input $REF_FILES --output-prefix "$TMP/ref_few/one" --output-format megatron --append-eod >/dev/null
  run_split mpirun_n 3 mt-tokenize "${GPT2[@]}" --input "$TMP/few/*.jsonl" --partitions 2 --workers 2 \
    --append-eod --output-prefix "$TMP/out/few" --output-format megatron
  [[ $status -eq 0 ]] || fail "3 ranks, 2 lines: $err"
  for ext in bin idx; do cmp "$TMP/out/few_text_document.$ext" "$TMP/ref_few/one_text_document.$ext" || fail "few .$ext"; done
}

@test "issue26 partitions: under MPI two keys and pre-split sentences keep every document and sequence boundary" {
  # Documents of 0 to 3 sentences (a sentence that encodes to nothing is dropped, as Megatron
  # drops it) and a title; 5 partitions over 2 ranks (rank 0 reads 3 chunks in 5, rank 1 sends
  # its tokens of every partition); one rank writes the same bytes.
  rm "$TMP"/in/*
  for i in $(seq 1 40); do
    sentences="$(for s in $(seq 1 $((i % 4))); do printf '"sentence %d of %d.",' "$s" "$i"; done)"
    printf '{"text": [%s""], "title": "title %d"}\n' "$sentences" "$i"
  done >"$TMP/in/sentences.jsonl"
  REF_FILES="$(python3 "$MT_ROOT/tests/tools/partition_reference.py" "$TMP/in/*.jsonl" 5 "$TMP/ref")"
  # shellcheck disable=SC2086 # REF_FILES is a list of paths without spaces
  mt-tokenize "${GPT2[@]}" --input $REF_FILES --json-keys text title --output-prefix "$TMP/ref/one" \
    --output-format both --append-eod >/dev/null
  for ranks in 1 2; do
    run_split mpirun_n "$ranks" mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 5 --workers 5 \
      --json-keys text title --append-eod --output-prefix "$TMP/out/k$ranks" --output-format both
    [[ $status -eq 0 ]] || fail "$ranks ranks: $err"
    for key in text title; do
      for ext in bin idx h5; do
        cmp "$TMP/out/k${ranks}_${key}_document.$ext" "$TMP/ref/one_${key}_document.$ext" || fail "$ranks ranks: $key .$ext"
      done
    done
  done
  [[ "$(jq -c 'select(.record=="summary") | [.documents, .empty_documents, .sequences]' <<<"$out")" == "[40,10,100]" ]] ||
    fail "$out"
  no_partition_files
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
  # Partition files of another count (Megatron's, of --partitions 2) are inputs the glob matches: refused.
  python3 "$MT_ROOT/tests/tools/partition_reference.py" "$TMP/in/*.jsonl" 2 "$TMP/ref" >/dev/null
  for i in 0 1; do cp "$TMP/ref/ref_$i.jsonl" "$TMP/in/*_$i.jsonl"; done
  run_split mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 3 --workers 3 --output-prefix "$TMP/out/p"
  [[ $status -ne 0 && "$err" == *"*_0.jsonl, a partition file left by an earlier run; remove it"* ]] || fail "$err"
  run_split mpirun_n 2 mt-tokenize "${GPT2[@]}" --input "$TMP/in/alpha.jsonl" --output-prefix "$TMP/out/m"
  [[ $status -ne 0 && "$err" == *"several MPI ranks need --partitions 2 or more"* ]] || fail "$err"
  ls "$TMP/out" | grep -q '^m_' && fail "an output was left: $(ls "$TMP/out")" || true
}

@test "issue26 partitions: under MPI a bad line stops the job, naming its file and line, whichever rank reads it" {
  # Rank 0 claims the first segment itself, so line 2 is its; the last line goes to whichever rank
  # claims the last segment. Rank 0 failing must not leave rank 1 waiting for a claim (it hung once).
  rm "$TMP"/in/*
  for where in 2 3000; do
    for i in $(seq 1 3000); do
      if ((i == where)); then echo '{"text": broken}'; else printf '{"text": "line %d"}\n' "$i"; fi
    done >"$TMP/in/bad.jsonl"
    SECONDS=0
    run_split mpirun_n 2 mt-tokenize "${GPT2[@]}" --input "$TMP/in/*.jsonl" --partitions 2 --workers 2 \
      --output-prefix "$TMP/out/bad"
    [[ $status -ne 0 && $status -ne 124 && "$err" == *"bad.jsonl:$where: malformed JSON"* ]] || fail "line $where: $status $err"
    ((SECONDS < 60)) || fail "line $where: $SECONDS s to stop"
    ls "$TMP/out" | grep -q '^bad_' && fail "line $where: an output was left: $(ls "$TMP/out")" || true
  done
}

@test "issue26 partitions: glob expansion equals Python's glob.glob, in its (unsorted) order" {
  for name in zeta alpha2 mid beta2 '[x]'; do cp "$TMP/in/alpha.jsonl" "$TMP/in/$name.jsonl"; done
  for pattern in '*.jsonl' '[ab]*.jsonl' '[!a]*' '?eta*.jsonl' '.*' 'alpha.jsonl' '*a*[.]jsonl' '[[]x].jsonl' '*[0-9]*'; do
    expected="$(python3 -c 'import glob,json,sys; print(json.dumps(glob.glob(sys.argv[1])))' "$TMP/in/$pattern")"
    run_split mt-tokenize "${GPT2[@]}" --input "$TMP/in/$pattern" --partitions 2 --workers 2 --output-prefix "$TMP/out/g"
    [[ $status -eq 0 ]] || fail "$pattern: $err"
    [[ "$(jq -c 'select(.record=="summary") | .inputs' <<<"$out")" == "$(jq -c . <<<"$expected")" ]] ||
      fail "$pattern: $out vs $expected"
  done
}

@test "issue26 partitions: without a shared filesystem a rank needs the same input; one without it, or with another, says so" {
  # Two working directories stand for two nodes' local disks. Rank 0 alone writes the output.
  mkdir -p "$TMP/node0/in" "$TMP/node0/out" "$TMP/node1/in" "$TMP/node1/out"
  cp "$TMP/in/alpha.jsonl" "$TMP/node0/in/a.jsonl"
  local args=("${GPT2[@]}" --input 'in/*.jsonl' --partitions 2 --workers 2 --output-format both)
  two_nodes() { timeout 120 mpirun -np 1 --wdir "$TMP/node0" mt-tokenize "$@" : -np 1 --wdir "$TMP/node1" mt-tokenize "$@"; }
  run_split two_nodes "${args[@]}" --output-prefix out/x
  [[ $status -ne 0 ]] || fail "a rank without the input succeeded"
  [[ "$err$out" == *"[rank 1] mt-tokenize: error: in/a.jsonl: not found on rank 1: --partitions under MPI reads the input on every rank; put it on a filesystem they share"* ]] ||
    fail "$err"
  [[ ! -e "$TMP/node0/out/x_text_document.h5" ]] || fail "rank 0 wrote an output without rank 1's partition"
  head -n 6 "$TMP/in/alpha.jsonl" >"$TMP/node1/in/a.jsonl"
  run_split two_nodes "${args[@]}" --output-prefix out/x
  [[ $status -ne 0 && "$err$out" == *"in/a.jsonl: is $(wc -c <"$TMP/node1/in/a.jsonl") bytes on rank 1 but $(wc -c <"$TMP/in/alpha.jsonl") on rank 0"* ]] ||
    fail "$err"
  # The same copy on each node: the output equals one rank's, and only rank 0's disk has it (rank 1,
  # which cannot open rank 0's token files, sends its tokens to rank 0 and says so).
  cp "$TMP/in/alpha.jsonl" "$TMP/node1/in/a.jsonl"
  run_split two_nodes "${args[@]}" --output-prefix out/x
  [[ $status -eq 0 ]] || fail "$err"
  [[ "$err" == *"[rank 1] warning: --partitions: out/x_text_document.bin.tmp-"*": cannot open for writing: No such file or directory: no filesystem shared with rank 0's outputs, so this rank sends its tokens to rank 0"* ]] ||
    fail "$err"
  (cd "$TMP/node1" && mt-tokenize "${args[@]}" --output-prefix out/one >/dev/null)
  for ext in bin idx h5; do cmp "$TMP/node0/out/x_text_document.$ext" "$TMP/node1/out/one_text_document.$ext" || fail ".$ext"; done
  [[ "$(ls "$TMP/node1/out")" != *x_* ]] || fail "rank 1 wrote an output: $(ls "$TMP/node1/out")"
}
