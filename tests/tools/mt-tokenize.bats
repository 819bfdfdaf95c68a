#!/usr/bin/env bats
# mt-tokenize end to end: encode/decode against known ids, round trips, Megatron preprocessing
# into HDF5 and .bin/.idx (read back by an independent numpy reader), identical output for every
# worker count and input split, each flag through an effect that would vanish if it were
# ignored, bad input (one-line error with file and line, non-zero exit, nothing written), a
# killed run leaving no file under a final name, and BPE training.

# Tiny shakespeare as JSONL, one document per speech (the split of data/corpus/SOURCES.md): 7,222
# documents, made once for the file.
setup_file() {
  jq -R -s -c 'split("\n\n")[] | {text: .}' "$BATS_TEST_DIRNAME/../../data/demo/tinyshakespeare.txt" \
    >"$BATS_FILE_TMPDIR/tinyshakespeare.jsonl"
}

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
  TOK="$MT_ROOT/data/tokenizers"
  CORPUS="$MT_ROOT/data/corpus"
  SHAKESPEARE="$MT_ROOT/data/demo/tinyshakespeare.txt"
  SHAKESPEARE_JSONL="$BATS_FILE_TMPDIR/tinyshakespeare.jsonl"
  GPT2=(--tokenizer-type GPT2BPETokenizer --vocab-file "$TOK/gpt2/encoder.json" --merge-file "$TOK/gpt2/vocab.bpe")
  LLAMA3=(--tokenizer-type TikTokenizer --tokenizer-model "$TOK/llama3/tokenizer.model")
  CL100K=(--tokenizer-type TikTokenizer --tokenizer-model "$TOK/cl100k_base/cl100k_base.tiktoken")
  HF=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOK/gpt2-hf/tokenizer.json")
}

teardown() { rm -rf "$TMP"; }

summary() { jq -c 'select(.record=="summary")' "$TMP/out.jsonl"; }

@test "encode gives the reference ids and decode gives the text back" {
  run_split bash -c "printf 'Hello world' | mt-tokenize encode --raw ${GPT2[*]}"
  [[ $status -eq 0 ]] || fail "$err"
  [[ "$out" == "15496 995" ]] || fail "GPT-2 ids: $out"
  run_split bash -c "printf 'Hello world' | mt-tokenize encode --raw ${LLAMA3[*]} --format jsonl"
  [[ "$out" == "[9906,1917]" ]] || fail "LLaMA-3 ids: $out"
  run_split bash -c "echo '15496 995' | mt-tokenize decode ${GPT2[*]}"
  [[ "$out" == '{"text":"Hello world"}' ]] || fail "decode: $out"
  run_split bash -c "echo '[9906,1917]' | mt-tokenize decode --raw ${LLAMA3[*]}"
  [[ "$out" == "Hello world" ]] || fail "decode --raw: $out"
}

@test "raw text round-trips byte for byte with every tokenizer and worker count" {
  head -c 400000 "$CORPUS/war_and_peace_pg2600.txt" >"$TMP/text.txt"
  for tokenizer in GPT2 LLAMA3 CL100K HF; do
    local -n flags="$tokenizer"
    mt-tokenize encode --raw --input "$TMP/text.txt" "${flags[@]}" >"$TMP/ids1" 2>/dev/null
    mt-tokenize encode --raw --input "$TMP/text.txt" "${flags[@]}" --workers 2 >"$TMP/ids2" 2>/dev/null
    cmp -s "$TMP/ids1" "$TMP/ids2" || fail "$tokenizer: --workers 2 changed the ids"
    [[ "$(wc -l <"$TMP/ids1")" -eq 1 ]] || fail "$tokenizer: raw input is one document"
    mt-tokenize decode --raw "${flags[@]}" <"$TMP/ids1" >"$TMP/back.txt"
    cmp "$TMP/text.txt" "$TMP/back.txt" || fail "$tokenizer: decode(encode(text)) differs"
  done
}

@test "special tokens are text unless --allow-special" {
  run_split bash -c "printf 'a<|endoftext|>' | mt-tokenize encode --raw ${GPT2[*]}"
  [[ "$out" != *50256* && "$out" == *" "*" "* ]] || fail "special token recognised without --allow-special: $out"
  run_split bash -c "printf 'a<|endoftext|>' | mt-tokenize encode --raw --allow-special ${GPT2[*]}"
  [[ "$out" == "64 50256" ]] || fail "--allow-special: $out"
}

@test "encode reads JSONL: one line of ids per document, --json-keys picks the key" {
  printf '%s\n' '{"text": "Hello", "other": " world"}' '{"text": ["Hello", " world"], "other": ""}' >"$TMP/in.jsonl"
  run_split mt-tokenize encode --input "$TMP/in.jsonl" "${GPT2[@]}"
  [[ "$out" == $'15496\n15496 995' ]] || fail "$out"
  run_split mt-tokenize encode --input "$TMP/in.jsonl" --json-keys other "${GPT2[@]}" --format jsonl
  [[ "$out" == $'[995]\n[]' ]] || fail "$out"
  run_split mt-tokenize encode --input "$TMP/in.jsonl" --json-keys text other "${GPT2[@]}"
  [[ $status -eq 2 && "$err" == *"--json-keys"* ]] || fail "two keys for encode: $status $err"
}

@test "preprocessing writes HDF5 and Megatron .bin/.idx that an independent reader agrees with" {
  mt-tokenize --input "$SHAKESPEARE_JSONL" "${GPT2[@]}" --output-prefix "$TMP/shake" \
    --output-format both --append-eod >"$TMP/out.jsonl"
  jq -e -s '.[0].record == "run"' "$TMP/out.jsonl" >/dev/null || fail "no run record"
  summary | jq -e '.documents == 7222 and .empty_documents == 0 and .sequences == 7222 and .bad_lines == 0 and .replaced == 0 and .tokens > 300000 and .mb_per_s > 0' >/dev/null || fail "$(summary)"
  local tokens
  tokens=$(summary | jq .tokens)
  for f in shake_text_document.h5 shake_text_document.bin shake_text_document.idx; do
    [[ -s "$TMP/$f" ]] || fail "$f missing"
  done
  local read_tokens
  read_tokens=$(/usr/bin/python3 "$MT_ROOT/tests/data/read_megatron_idx.py" "$TMP/shake_text_document" |
    awk '/^sequence [0-9]+:/ { n += NF - 2 } END { print n }')
  [[ "$read_tokens" -eq "$tokens" ]] || fail "numpy reader found $read_tokens tokens, mt-tokenize wrote $tokens"
  run h5dump -A "$TMP/shake_text_document.h5"
  assert_output --partial "GPT2BPETokenizer"
  # every document ends with the EOD id 50256
  /usr/bin/python3 - "$TMP/shake_text_document" <<'PY' || fail "EOD not at every document end"
import sys, numpy as np
prefix = sys.argv[1]
idx = open(prefix + ".idx", "rb").read()
count = int.from_bytes(idx[18:26], "little")
lengths = np.frombuffer(idx, np.int32, count, 34)
tokens = np.memmap(prefix + ".bin", np.uint16, "r")
ends = np.cumsum(lengths) - 1
sys.exit(0 if (tokens[ends] == 50256).all() else 1)
PY
}

@test "--workers and several inputs give byte-identical datasets" {
  head -n 3000 "$SHAKESPEARE_JSONL" >"$TMP/a.jsonl"
  tail -n +3001 "$SHAKESPEARE_JSONL" >"$TMP/b.jsonl"
  mt-tokenize --input "$SHAKESPEARE_JSONL" "${LLAMA3[@]}" --output-prefix "$TMP/one" --output-format both >/dev/null
  mt-tokenize --input "$TMP/a.jsonl" "$TMP/b.jsonl" "${LLAMA3[@]}" --output-prefix "$TMP/two" --output-format both --workers 2 >"$TMP/out.jsonl"
  summary | jq -e '.workers == 2 and .documents == 7222' >/dev/null || fail "$(summary)"
  for ext in h5 bin idx; do
    cmp "$TMP/one_text_document.$ext" "$TMP/two_text_document.$ext" || fail ".$ext differs"
  done
}

@test "merge: tokenizing files apart and merging equals one run; mismatched tokenizers are refused" {
  head -n 3000 "$SHAKESPEARE_JSONL" >"$TMP/a.jsonl"
  tail -n +3001 "$SHAKESPEARE_JSONL" >"$TMP/b.jsonl"
  mt-tokenize --input "$SHAKESPEARE_JSONL" "${GPT2[@]}" --output-prefix "$TMP/one" --output-format both >/dev/null
  mt-tokenize --input "$TMP/a.jsonl" "${GPT2[@]}" --output-prefix "$TMP/a" --output-format both >/dev/null
  mt-tokenize --input "$TMP/b.jsonl" "${GPT2[@]}" --output-prefix "$TMP/b" --output-format both >/dev/null
  mt-tokenize merge --input "$TMP/a_text_document" "$TMP/b_text_document.h5" --output-prefix "$TMP/merged" --output-format both >"$TMP/out.jsonl"
  summary | jq -e '.documents == 7222' >/dev/null || fail "$(summary)"
  for ext in h5 bin idx; do
    cmp "$TMP/one_text_document.$ext" "$TMP/merged.$ext" || fail "merged .$ext differs from one run"
  done
  run_split mt-tokenize merge --input "$TMP/a_text_document.bin" --output-prefix "$TMP/m2" --output-format megatron
  [[ $status -eq 2 && "$err" == *"--vocab-size"* ]] || fail "$status $err"
  mt-tokenize merge --input "$TMP/a_text_document.bin" "$TMP/b_text_document.idx" --vocab-size 50257 --output-prefix "$TMP/m3" --output-format megatron >/dev/null
  cmp "$TMP/one_text_document.bin" "$TMP/m3.bin" || fail ".bin/.idx merge differs"
  mt-tokenize --input "$TMP/b.jsonl" "${LLAMA3[@]}" --output-prefix "$TMP/c" >/dev/null
  run_split mt-tokenize merge --input "$TMP/a_text_document.h5" "$TMP/c_text_document.h5" --output-prefix "$TMP/bad"
  [[ $status -eq 1 && "$err" == *"another tokenizer"* ]] || fail "$status $err"
  [[ ! -e "$TMP/bad.h5" ]] || fail "output written on error"
}

@test "--json-keys writes one dataset per key; empty text is an empty document as in Megatron" {
  printf '%s\n' '{"text": "a b", "title": "T"}' '{"text": "", "title": "U"}' '{"text": ["c", "d"], "title": "V"}' >"$TMP/in.jsonl"
  mt-tokenize --input "$TMP/in.jsonl" "${GPT2[@]}" --json-keys text title --output-prefix "$TMP/k" --output-format megatron >"$TMP/out.jsonl"
  summary | jq -e '.documents == 3 and .empty_documents == 1 and .sequences == 6' >/dev/null || fail "$(summary)"
  run /usr/bin/python3 "$MT_ROOT/tests/data/read_megatron_idx.py" "$TMP/k_text_document"
  assert_success
  assert_output --partial "document_indices 0 1 1 3"
  [[ -f "$TMP/k_title_document.idx" && ! -f "$TMP/k_text_document.h5" ]] || fail "wrong outputs: $(ls "$TMP")"
}

@test "invalid UTF-8 and lone surrogates become U+FFFD and are counted" {
  printf '{"text": "a\\ud800b"}\n{"text": "c\xffd"}\n' >"$TMP/in.jsonl"
  mt-tokenize --input "$TMP/in.jsonl" "${GPT2[@]}" --output-prefix "$TMP/r" >"$TMP/out.jsonl"
  summary | jq -e '.replaced == 2' >/dev/null || fail "$(summary)"
  run_split mt-tokenize encode --input "$TMP/in.jsonl" "${GPT2[@]}"
  # U+FFFD is GPT-2 token 4210 (the byte characters of its UTF-8 EF BF BD); a, b, c, d are 64..67
  [[ $status -eq 0 && "$out" == $'64 4210 65\n66 4210 67' ]] || fail "encode: exit $status: $out $err"
  run_split bash -c "mt-tokenize encode --input '$TMP/in.jsonl' ${GPT2[*]} | mt-tokenize decode ${GPT2[*]}"
  [[ "$out" == $'{"text":"a\xef\xbf\xbdb"}\n{"text":"c\xef\xbf\xbdd"}' ]] || fail "$out"
}

@test "bad lines: one error line with file and line number, exit 1, nothing written; --skip-bad-lines counts" {
  printf '%s\n' '{"text": "ok"}' '{"text": "ok"}' '{"text": 12}' '{"text": "ok"}' >"$TMP/bad.jsonl"
  run_split mt-tokenize --input "$TMP/bad.jsonl" "${GPT2[@]}" --output-prefix "$TMP/bad" --workers 2
  [[ $status -eq 1 ]] || fail "exit $status"
  [[ "$err" == "mt-tokenize: error: $TMP/bad.jsonl:3: key 'text': is a number, expected a string or a list of strings" ]] || fail "$err"
  [[ -z "$out" ]] || fail "stdout: $out"
  [[ "$(ls "$TMP")" == "bad.jsonl" ]] || fail "files left: $(ls "$TMP")"
  printf '%s\n' '{"text": "ok"' >>"$TMP/bad.jsonl"
  mt-tokenize --input "$TMP/bad.jsonl" "${GPT2[@]}" --output-prefix "$TMP/bad" --skip-bad-lines >"$TMP/out.jsonl" 2>"$TMP/err"
  summary | jq -e '.bad_lines == 2 and .documents == 3' >/dev/null || fail "$(summary)"
  grep -q "skipped 2 bad lines" "$TMP/err" || fail "no warning: $(cat "$TMP/err")"
  printf '%s\n' '{"body": "x"}' >"$TMP/nokey.jsonl"
  run_split mt-tokenize --input "$TMP/nokey.jsonl" "${GPT2[@]}" --output-prefix "$TMP/nokey"
  [[ $status -eq 1 && "$err" == *"nokey.jsonl:1: key 'text': missing" ]] || fail "$err"
  head -c 3000 /dev/zero | tr '\0' 'x' | sed 's/^/{"text": "/; s/$/"}/' >"$TMP/long.jsonl"
  run_split mt-tokenize --input "$TMP/long.jsonl" "${GPT2[@]}" --output-prefix "$TMP/long" --max-line-bytes 1000
  [[ $status -eq 1 && "$err" == *"long.jsonl:1: longer than --max-line-bytes: 1000" ]] || fail "$err"
  run_split mt-tokenize --input "$TMP/missing.jsonl" "${GPT2[@]}" --output-prefix "$TMP/m"
  [[ $status -eq 1 && "$(line_count "$err")" -eq 1 ]] || fail "missing input: $status $err"
}

@test "usage errors exit 2: reserved and missing flags, bad tokenizer combinations" {
  run_split mt-tokenize --input x.jsonl "${GPT2[@]}" --output-prefix "$TMP/p" --split-sentences
  [[ $status -eq 2 && "$err" == *"--split-sentences"*"not implemented"* ]] || fail "$status $err"
  run_split mt-tokenize --input x.jsonl "${GPT2[@]}" --output-prefix "$TMP/p" --partitions 2
  [[ $status -eq 2 && "$err" == *"--workers 1: must be divisible by --partitions 2"* ]] || fail "$status $err"
  run_split mt-tokenize --input x.jsonl --output-prefix "$TMP/p"
  [[ $status -eq 2 && "$err" == *"--tokenizer-type"* ]] || fail "$status $err"
  run_split mt-tokenize --input "$CORPUS/edge_cases.jsonl" --tokenizer-type GPT2BPETokenizer --output-prefix "$TMP/p"
  [[ $status -eq 2 && "$err" == *"--vocab-file"* ]] || fail "$status $err"
  run_split bash -c "echo 99999999 | mt-tokenize decode ${GPT2[*]}"
  [[ $status -eq 1 && "$err" == *"-:1"* ]] || fail "id out of range: $status $err"
  [[ "$(ls "$TMP")" == "" ]] || fail "files written: $(ls "$TMP")"
}

@test "a killed run leaves no file under a final name" {
  mkfifo "$TMP/fifo"
  mt-tokenize --input - "${GPT2[@]}" --output-prefix "$TMP/killed" --output-format both <"$TMP/fifo" >/dev/null 2>&1 &
  local pid=$!
  exec 7>"$TMP/fifo"  # bats itself uses descriptor 3
  head -n 2000 "$SHAKESPEARE_JSONL" >&7
  sleep 1
  kill -9 "$pid"
  exec 7>&-
  wait "$pid" || true
  for ext in h5 bin idx; do
    [[ ! -e "$TMP/killed_text_document.$ext" ]] || fail "killed_text_document.$ext exists"
  done
}

@test "train learns a BPE vocabulary that encodes held-out text and round-trips" {
  head -n 30000 "$SHAKESPEARE" >"$TMP/train.txt"
  tail -n 5000 "$SHAKESPEARE" >"$TMP/heldout.txt"
  mt-tokenize train --raw --input "$TMP/train.txt" --vocab-size 1000 --output-dir "$TMP/bpe" >"$TMP/out.jsonl"
  summary | jq -e '.vocab_size == 1000 and .merges == 743' >/dev/null || fail "$(summary)"
  local flags=(--tokenizer-type GPT2BPETokenizer --vocab-file "$TMP/bpe/encoder.json" --merge-file "$TMP/bpe/vocab.bpe")
  mt-tokenize encode --raw --input "$TMP/heldout.txt" "${flags[@]}" >"$TMP/ids" 2>/dev/null
  local count
  count=$(wc -w <"$TMP/ids")
  (( count < $(wc -c <"$TMP/heldout.txt") / 2 )) || fail "no compression: $count ids"
  mt-tokenize decode --raw "${flags[@]}" <"$TMP/ids" >"$TMP/back.txt"
  cmp "$TMP/heldout.txt" "$TMP/back.txt"
}

@test "issue11 case 8: --skip-bad-lines counts and skips a 70 MB line; without it the error names the line" {
  /usr/bin/python3 - "$TMP/long.jsonl" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write('{"text": "before"}\n{"text": "' + "x" * (70 << 20) + '"}\n{"text": "after"}\n')
PY
  mt-tokenize --input "$TMP/long.jsonl" "${GPT2[@]}" --output-prefix "$TMP/long" --output-format megatron \
    --skip-bad-lines >"$TMP/out.jsonl" 2>"$TMP/err" || fail "$(cat "$TMP/err")"
  summary | jq -e '.documents == 2 and .bad_lines == 1 and .bytes > 73400000' >/dev/null || fail "$(summary)"
  grep -q "skipped 1 bad lines" "$TMP/err" || fail "no warning: $(cat "$TMP/err")"
  run /usr/bin/python3 "$MT_ROOT/tests/data/read_megatron_idx.py" "$TMP/long_text_document"
  assert_success
  assert_output --partial "sequence 0: 19052"  # "before"
  assert_output --partial "sequence 1: 8499"   # "after": the line after the long one is read
  run_split bash -c "mt-tokenize encode --input '$TMP/long.jsonl' ${GPT2[*]} --skip-bad-lines"
  [[ $status -eq 0 && "$out" == $'19052\n8499' ]] || fail "encode: $status $out $err"
  run_split mt-tokenize --input "$TMP/long.jsonl" "${GPT2[@]}" --output-prefix "$TMP/fail"
  [[ $status -eq 1 && "$err" == "mt-tokenize: error: $TMP/long.jsonl:2: longer than --max-line-bytes: 67108864" ]] ||
    fail "$status $err"
  [[ ! -e "$TMP/fail_text_document.h5" ]] || fail "output written on error"
}

@test "issue11 case 9: tokenizer.json's TemplateProcessing adds its special tokens unless --tokenizer-hf-no-include-special-tokens" {
  # GPT-2 with a BOS template: HF tokenizers gives 50256 15496 995 198 (tests/golden/tokenizer/templates.jsonl).
  jq --slurpfile p "$MT_ROOT/tests/golden/tokenizer/gpt2_bos_post_processor.json" '.post_processor = $p[0]' \
    "$TOK/gpt2-hf/tokenizer.json" >"$TMP/gpt2_bos.json"
  run_split bash -c "printf 'Hello world\n' | mt-tokenize encode --raw --tokenizer-type HuggingFaceTokenizer --tokenizer-model '$TMP/gpt2_bos.json'"
  [[ $status -eq 0 && "$out" == "50256 15496 995 198" ]] || fail "$status $out $err"
  # LLaMA-3's layout (post-processor Sequence[ByteLevel, TemplateProcessing]): BOS 128000 first.
  local llama=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$MT_ROOT/tests/golden/tokenizer/llama3_style_tokenizer.json")
  run_split bash -c "printf 'Hello world' | mt-tokenize encode --raw ${llama[*]}"
  [[ "$out" == "128000 39 301 385 1917" ]] || fail "$out $err"
  run_split bash -c "printf 'Hello world' | mt-tokenize encode --raw ${llama[*]} --tokenizer-hf-no-include-special-tokens"
  [[ "$out" == "39 301 385 1917" ]] || fail "$out $err"
  # Megatron's preprocess_data tokenizes each sentence: each sequence starts with BOS.
  printf '%s\n' '{"text": ["Hello", " world"]}' '{"text": ""}' >"$TMP/in.jsonl"
  mt-tokenize --input "$TMP/in.jsonl" "${llama[@]}" --append-eod --output-prefix "$TMP/bos" --output-format megatron >"$TMP/out.jsonl"
  summary | jq -e '.tokenizer == "HuggingFaceTokenizer" and .sequences == 3' >/dev/null || fail "$(summary)"
  run /usr/bin/python3 "$MT_ROOT/tests/data/read_megatron_idx.py" "$TMP/bos_text_document"
  assert_output --partial "sequence 0: 128000 39 301 385"
  assert_output --partial "sequence 1: 128000 1917 128001"
  assert_output --partial "sequence 2: 128000 128001"  # HF gives [BOS] for "", so Megatron keeps it
  mt-tokenize --input "$TMP/in.jsonl" "${llama[@]}" --tokenizer-hf-no-include-special-tokens --output-prefix "$TMP/plain" >"$TMP/out.jsonl"
  summary | jq -e '.tokenizer == "HuggingFaceTokenizer:no-special-tokens" and .sequences == 2 and .tokens == 4' >/dev/null || fail "$(summary)"
  # Raw text is one sequence however many workers cut it: one BOS.
  head -c 2000000 "$CORPUS/war_and_peace_pg2600.txt" >"$TMP/text.txt"
  mt-tokenize encode --raw --input "$TMP/text.txt" "${llama[@]}" --workers 2 >"$TMP/ids" 2>/dev/null
  [[ "$(tr ' ' '\n' <"$TMP/ids" | grep -c '^128000$')" -eq 1 && "$(cut -d' ' -f1 "$TMP/ids")" == 128000 ]] || fail "BOS count"
  run_split bash -c "printf x | mt-tokenize encode --raw ${LLAMA3[*]} --tokenizer-hf-no-include-special-tokens"
  [[ $status -eq 2 && "$err" == *"--tokenizer-hf-no-include-special-tokens: applies to HuggingFaceTokenizer, BertWordPieceLowerCase and BertWordPieceCase only"* ]] || fail "$status $err"
}

@test "issue11 case 10: truncated tokenizer files are refused, naming the file" {
  head -n 100000 "$TOK/llama3/tokenizer.model" >"$TMP/llama3.model"
  run_split bash -c "printf 'Hello' | mt-tokenize encode --raw --tokenizer-type TikTokenizer --tokenizer-model '$TMP/llama3.model'"
  [[ $status -eq 1 && "$err" == "mt-tokenize: error: $TMP/llama3.model: truncated: 100000 ranks, but a file starting with these ranks is cl100k_base (100256) or llama3 (128000)" ]] ||
    fail "$status $out $err"
  : >"$TMP/empty.bpe"
  head -n 1000 "$TOK/gpt2/vocab.bpe" >"$TMP/cut.bpe"
  for merges in empty.bpe cut.bpe; do
    run_split bash -c "printf 'Hello' | mt-tokenize encode --raw --tokenizer-type GPT2BPETokenizer --vocab-file '$TOK/gpt2/encoder.json' --merge-file '$TMP/$merges'"
    [[ $status -eq 1 && "$err" == "mt-tokenize: error: $TMP/$merges: "*"of the 50257 tokens of $TOK/gpt2/encoder.json are never made"*"truncated"* ]] ||
      fail "$merges: $status $out $err"
  done
}

@test "issue11 case 17: a directory given as a file says so; a rank file cut mid-line names the line" {
  mkdir "$TMP/dir"
  local cases=("--tokenizer-type TikTokenizer --tokenizer-model $TMP/dir|--tokenizer-model $TMP/dir"
               "--tokenizer-type HuggingFaceTokenizer --tokenizer-model $TMP/dir|--tokenizer-model $TMP/dir"
               "--tokenizer-type GPT2BPETokenizer --vocab-file $TMP/dir --merge-file $TOK/gpt2/vocab.bpe|--vocab-file $TMP/dir"
               "--tokenizer-type GPT2BPETokenizer --vocab-file $TOK/gpt2/encoder.json --merge-file $TMP/dir|--merge-file $TMP/dir"
               "${GPT2[*]} --input $TMP/dir|--input $TMP/dir")
  for c in "${cases[@]}"; do
    run_split bash -c "printf x | mt-tokenize encode ${c%%|*}"
    [[ $status -eq 1 && "$err" == "mt-tokenize: error: ${c#*|}: is a directory, expected a file" ]] || fail "${c%%|*}: $status $err"
  done
  run_split mt-tokenize --input "$TMP/dir" "${GPT2[@]}" --output-prefix "$TMP/p"
  [[ $status -eq 1 && "$err" == "mt-tokenize: error: --input $TMP/dir: is a directory, expected a file" ]] || fail "$status $err"
  run_split mt-tokenize decode --input "$TMP/dir" "${GPT2[@]}"
  [[ $status -eq 1 && "$err" == "mt-tokenize: error: --input $TMP/dir: is a directory, expected a file" ]] || fail "$status $err"
  run_split mt-tokenize merge --input "$TMP/dir" --output-prefix "$TMP/m"
  [[ $status -eq 1 && "$err" == *"$TMP/dir: is a directory; a token dataset is named by its prefix"* ]] || fail "$status $err"
  head -c 1000000 "$TOK/llama3/tokenizer.model" >"$TMP/cut.model"  # ends in "IGZhY3Rv 6" of rank 61595
  run_split bash -c "printf x | mt-tokenize encode --raw --tokenizer-type TikTokenizer --tokenizer-model '$TMP/cut.model'"
  [[ $status -eq 1 && "$err" == "mt-tokenize: error: $TMP/cut.model: line 61597: rank 6 was already given on line 7 (the last line has no newline: the file looks cut mid-line)" ]] ||
    fail "$status $err"
  # issue 28 U14: a tokenizer.json given as a tiktoken rank file is named as JSON, not as a cut file.
  run_split bash -c "printf x | mt-tokenize encode --raw --tokenizer-type TikTokenizer --tokenizer-model '$TOK/gpt2-hf/tokenizer.json'"
  [[ $status -eq 1 && "$err" == "mt-tokenize: error: $TOK/gpt2-hf/tokenizer.json: is JSON, not a tiktoken rank file (\`base64 rank\` lines); a Hugging Face tokenizer.json loads with --tokenizer-type HuggingFaceTokenizer" ]] ||
    fail "$status $err"
}

@test "issue11 case 21: blank JSONL lines are skipped and counted; a UTF-8 byte order mark is accepted" {
  printf '{"text": "a"}\n\n{"text": "b"}\n  \r\n' >"$TMP/blank.jsonl"
  mt-tokenize --input "$TMP/blank.jsonl" "${GPT2[@]}" --output-prefix "$TMP/blank" >"$TMP/out.jsonl"
  summary | jq -e '.documents == 2 and .blank_lines == 2 and .bad_lines == 0 and .tokens == 2' >/dev/null || fail "$(summary)"
  printf '\xef\xbb\xbf{"text": "a"}\n' >"$TMP/bom.jsonl"
  mt-tokenize --input "$TMP/bom.jsonl" "$TMP/bom.jsonl" "${GPT2[@]}" --output-prefix "$TMP/bom" >"$TMP/out.jsonl"
  summary | jq -e '.documents == 2 and .tokens == 2 and .replaced == 0' >/dev/null || fail "$(summary)"
  run_split bash -c "cat '$TMP/bom.jsonl' '$TMP/blank.jsonl' | mt-tokenize encode ${GPT2[*]}"
  [[ $status -eq 0 && "$out" == $'64\n64\n65' ]] || fail "encode from stdin: $status $out $err"
  # A BOM inside a file (not at its start) is text, as any other character: still malformed JSON.
  printf '{"text": "a"}\n\xef\xbb\xbf{"text": "b"}\n' >"$TMP/inner.jsonl"
  run_split mt-tokenize --input "$TMP/inner.jsonl" "${GPT2[@]}" --output-prefix "$TMP/inner"
  [[ $status -eq 1 && "$err" == *"inner.jsonl:2: malformed JSON"* ]] || fail "$status $err"
}

# ---- issue 26: BERT WordPiece (vocabularies and reference ids in tests/golden/wordpiece) ----

@test "issue26 wordpiece: encode, decode and sequences equal HF tokenizers' BertWordPiece" {
  local golden="$MT_ROOT/tests/golden/wordpiece"
  local uncased=(--tokenizer-type BertWordPieceLowerCase --vocab-file "$golden/vocab-uncased.txt")
  local cased=(--tokenizer-type BertWordPieceCase --vocab-file "$golden/vocab-cased.txt")
  # encode: the reference's [CLS] ids [SEP] for "Hello, World!" (meta.json), and without the specials.
  local expected plain sep
  expected=$(jq -r '.uncased.with_special_tokens.ids | map(tostring) | join(" ")' "$golden/meta.json")
  plain=$(jq -r '.uncased.with_special_tokens.ids[1:-1] | map(tostring) | join(" ")' "$golden/meta.json")
  sep=$(jq -r '.uncased.special_ids["[SEP]"]' "$golden/meta.json")
  run_split bash -c "printf 'Hello, World!' | mt-tokenize encode --raw ${uncased[*]}"
  [[ $status -eq 0 && "$out" == "$expected" ]] || fail "$status '$out' != '$expected' $err"
  run_split bash -c "printf 'Hello, World!' | mt-tokenize encode --raw ${uncased[*]} --tokenizer-hf-no-include-special-tokens"
  [[ "$out" == "$plain" ]] || fail "'$out' != '$plain'"
  # decode: the reference's text for the ids of a torture record.
  jq -c 'select(.name == "accents_upper") | .cased' "$golden/torture.jsonl" >"$TMP/ids"
  run_split bash -c "mt-tokenize decode --raw ${cased[*]} <'$TMP/ids'"
  [[ "$out" == "$(jq -r 'select(.name == "accents_upper") | .cased_decoded' "$golden/torture.jsonl")" ]] || fail "decode: $out"
  # Megatron-Core's BertWordPieceCase: <extra_id_N> after the vocabulary, special with --allow-special.
  run_split bash -c "printf '<extra_id_7>' | mt-tokenize encode --raw ${cased[*]} --tokenizer-hf-no-include-special-tokens --allow-special"
  [[ "$out" == "$(jq -r '.cased.special_ids["<extra_id_7>"]' "$golden/meta.json")" ]] || fail "extra id: $out"
  # preprocess: each sentence is [CLS] ... [SEP]; --append-eod appends [SEP], Megatron-Core's eod.
  printf '%s\n' '{"text": ["Hello, World!", "Hello, World!"]}' >"$TMP/in.jsonl"
  mt-tokenize --input "$TMP/in.jsonl" "${uncased[@]}" --append-eod --output-prefix "$TMP/bert" --output-format megatron >"$TMP/out.jsonl"
  summary | jq -e '.tokenizer == "BertWordPieceLowerCase" and .sequences == 2' >/dev/null || fail "$(summary)"
  run /usr/bin/python3 "$MT_ROOT/tests/data/read_megatron_idx.py" "$TMP/bert_text_document"
  assert_output --partial "sequence 0: $expected"
  assert_output --partial "sequence 1: $expected $sep"
}

@test "issue26 wordpiece: a corrupt vocab.txt is refused naming the file and the line" {
  local golden="$MT_ROOT/tests/golden/wordpiece"
  { head -n 20 "$golden/vocab-uncased.txt"; echo; tail -n +21 "$golden/vocab-uncased.txt"; } >"$TMP/blank.txt"
  { cat "$golden/vocab-uncased.txt"; sed -n 10p "$golden/vocab-uncased.txt"; } >"$TMP/repeat.txt"
  { head -c 5000 "$golden/vocab-uncased.txt"; printf '\xe4\xb8'; } >"$TMP/cut.txt"
  sed '/^\[UNK\]$/d' "$golden/vocab-uncased.txt" >"$TMP/nounk.txt"
  local lines; lines=$(wc -l <"$golden/vocab-uncased.txt")
  local cases=("blank.txt|line 21: is empty" "repeat.txt|line $((lines + 1)): repeats the token"
               "cut.txt|is not valid UTF-8" "nounk.txt|has no [UNK] token")
  for case in "${cases[@]}"; do
    local file="${case%%|*}" message="${case#*|}"
    run_split bash -c "printf x | mt-tokenize encode --raw --tokenizer-type BertWordPieceLowerCase --vocab-file '$TMP/$file'"
    [[ $status -eq 1 && "$err" == "mt-tokenize: error: $TMP/$file"*"$message"* && $(wc -l <<<"$err") -eq 1 ]] || fail "$file: $status $err"
  done
}

@test "issue28 U15: a flag given twice takes its last value, as in every mt tool and Megatron's argparse" {
  printf '{"text": "hello world"}\n' >"$TMP/in.jsonl"
  mt-tokenize --input "$TMP/in.jsonl" "${GPT2[@]}" --output-prefix "$TMP/x" --output-format both --output-format hdf5 \
    >/dev/null 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  [[ -e "$TMP/x_text_document.h5" && ! -e "$TMP/x_text_document.bin" ]] || fail "$(ls "$TMP")"
}
