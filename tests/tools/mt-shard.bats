#!/usr/bin/env bats
# mt-shard end to end: build and inspect sample indices over token datasets written by an
# independent numpy writer (make_token_dataset.py); one check per flag that fails if the flag were
# ignored; samples checked against a numpy re-reading of the index (Megatron's __getitem__);
# bad input refused in one line with nothing written; stale indices refused.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
  MAKE="$BATS_TEST_DIRNAME/make_token_dataset.py"
  # a: HDF5, 200 documents ~20 tokens, EOD 0; b: .bin/.idx, 120 documents ~12 tokens.
  "$MAKE" "$TMP/a" h5 100 0 counting:200:20:1
  "$MAKE" "$TMP/b" bin 100 0 counting:120:12:2
}

teardown() { rm -rf "$TMP"; }

COMMON=(--seq-length 16 --train-samples 64 --global-batch-size 4 --eval-interval 8 --eval-iters 2 --split 80,10,10)

# build with $COMMON and extra flags; JSON record in $TMP/build.json.
build() {
  mt-shard build "${COMMON[@]}" "$@" --json >"$TMP/build.json" 2>"$TMP/err.log" || fail "build $*: $(cat "$TMP/err.log")"
}

# inspect INDEX [flags]; JSON array in $TMP/inspect.json.
inspect() {
  mt-shard inspect "$@" --json >"$TMP/inspect.json" 2>"$TMP/err.log" || fail "inspect $*: $(cat "$TMP/err.log")"
}

q() { jq -c "$1" "$TMP/inspect.json"; }
check() { jq -e "$1" "$2" >/dev/null || fail "jq '$1' is false for: $(cat "$2")"; }

@test "build writes one HDF5 index named by the md5 of its parameters; a second build keeps it" {
  build --data-path "$TMP/a" --data-cache-path "$TMP/cache"
  check '.[0].record == "index" and .[0].built and .[0].train_samples >= 64 and .[0].valid_samples >= 24 and .[0].test_samples >= 8' "$TMP/build.json"
  path="$(jq -r '.[0].path' "$TMP/build.json")"
  md5="$(jq -r '.[0].parameters_md5' "$TMP/build.json")"
  [[ "$path" == "$TMP/cache/$md5-mt-sample-index.h5" && -f "$path" ]] || fail "$path"
  [[ "$(ls "$TMP/cache")" == "$md5-mt-sample-index.h5" ]] || fail "stray files: $(ls "$TMP/cache")"
  run h5ls -r "$path"
  assert_output --partial "/train/component_0/document_index"
  assert_output --partial "/train/component_0/sample_index Dataset {"
  assert_output --partial "/valid/component_0/shuffle_index"
  build --data-path "$TMP/a" --data-cache-path "$TMP/cache"
  check '.[0].built == false' "$TMP/build.json"
  # the default cache directory is Megatron's: PREFIX/cache/GPTDataset_indices
  build --data-path "$TMP/a"
  [[ -f "$TMP/a/cache/GPTDataset_indices/$md5-mt-sample-index.h5" ]] || fail "default cache: $(find "$TMP/a")"
}

@test "the index holds Megatron's arrays and dtypes; samples equal a numpy reading of it" {
  build --data-path "$TMP/b" --output "$TMP/i.h5"
  inspect "$TMP/i.h5" --show-samples 12
  q '[.[] | select(.record=="sample") | .tokens]' >"$TMP/mt.json"
  /usr/bin/python3 - "$TMP/i.h5" "$TMP/b" >"$TMP/np.json" <<'EOF'
import json, sys, h5py, numpy
index, prefix = sys.argv[1], sys.argv[2]
raw = open(prefix + ".idx", "rb").read()
count = int(numpy.frombuffer(raw, "<u8", 1, 18)[0])
lengths = numpy.frombuffer(raw, "<i4", count, 34)
pointers = numpy.frombuffer(raw, "<i8", count, 34 + 4 * count)
data = numpy.fromfile(prefix + ".bin", "<u2")
with h5py.File(index) as f:
    g = f["train/component_0"]
    assert g["sample_index"].dtype == numpy.int32 and g["shuffle_index"].dtype == numpy.uint32
    assert g["document_index"].dtype == numpy.int32 and g["sample_index"].shape[1] == 2
    doc, samples, shuffle = g["document_index"][:], g["sample_index"][:], g["shuffle_index"][:]
    assert sorted(shuffle.tolist()) == list(range(len(samples) - 1))
    seq = int(f.attrs["seq_length"])
def get(i, offset, length=None):
    start = pointers[i] // 2 + offset
    return data[start:start + (lengths[i] - offset if length is None else length)].tolist()
out = []
for idx in range(12):  # GPTDataset._query_document_sample_shuffle_indices
    j = shuffle[idx]
    (b, bo), (e, eo) = samples[j], samples[j + 1]
    if b == e:
        text = get(doc[b], bo, eo - bo + 1)
    else:
        text = []
        for i in range(b, e + 1):
            text += get(doc[i], bo if i == b else 0, None if i < e else eo + 1)
    assert len(text) == seq + 1
    out.append(text)
print(json.dumps(out, separators=(",", ":")))
EOF
  [[ "$(cat "$TMP/mt.json")" == "$(cat "$TMP/np.json")" ]] || fail "mt: $(cat "$TMP/mt.json") numpy: $(cat "$TMP/np.json")"
}

@test "inspect: datasets, splits with samples and epochs, blend shares, length histogram" {
  build --data-path 0.3 "$TMP/a" 0.7 "$TMP/b" --output "$TMP/i.h5"
  inspect "$TMP/i.h5"
  [[ "$(q '[.[] | select(.record=="dataset") | [.format, .dtype, .documents, .sequences]]')" == '[["hdf5","uint16",200,200],["megatron","uint16",120,120]]' ]] || fail "$(q .)"
  [[ "$(q '[.[] | select(.record=="split") | .split]')" == '["train","valid","test"]' ]] || fail "$(q .)"
  check '[.[] | select(.record=="split")] | all(.blended and .samples >= .requested and .epochs >= 1 and .tokens > 0 and .documents > 0)' "$TMP/inspect.json"
  check '[.[] | select(.record=="blend" and .split=="train")] | (.[0].weight - 0.3 | fabs) < 1e-12 and (.[0].share - 0.3 | fabs) < 0.02 and (.[1].share - 0.7 | fabs) < 0.02' "$TMP/inspect.json"
  check '[.[] | select(.record=="histogram" and .prefix=="'"$TMP/a"'") | .sequences] | add == 200' "$TMP/inspect.json"
  check '[.[] | select(.record=="parameters")][0] | .seq_length == 16 and .seed == 1234 and .split == "80,10,10"' "$TMP/inspect.json"
}

@test "sample counts follow Megatron: --train-iters x --global-batch-size, --eval-interval, --eval-iters" {
  mt-shard build --data-path "$TMP/a" --seq-length 8 --train-iters 10 --global-batch-size 3 --eval-interval 4 \
    --eval-iters 2 --split 80,10,10 --output "$TMP/i.h5" 2>/dev/null >/dev/null
  inspect "$TMP/i.h5"
  # train 10*3; valid (10 // 4 + 1) * 2 * 3; test 2 * 3
  [[ "$(q '[.[] | select(.record=="split") | .requested]')" == "[30,18,6]" ]] || fail "$(q '[.[] | select(.record=="split")]')"
  mt-shard build --data-path "$TMP/a" --seq-length 8 --train-samples 25 --global-batch-size 3 --eval-interval 4 \
    --eval-iters 1 --split 80,10,10 --output "$TMP/j.h5" 2>/dev/null >/dev/null
  inspect "$TMP/j.h5"
  # iters = 25 // 3 = 8: valid (8 // 4 + 1) * 1 * 3
  [[ "$(q '[.[] | select(.record=="split") | .requested]')" == "[25,9,3]" ]] || fail "$(q .)"
}

@test "--split, --seq-length and --seed change the index" {
  build --data-path "$TMP/a" --output "$TMP/base.h5"
  inspect "$TMP/base.h5" --show-samples 4
  base_split="$(q '[.[] | select(.record=="blend") | [.sequence_begin, .sequence_end]]')"
  base_samples="$(q '[.[] | select(.record=="sample") | .tokens]')"
  [[ "$base_split" == "[[0,160],[160,180],[180,200]]" ]] || fail "$base_split"
  build --data-path "$TMP/a" --output "$TMP/split.h5" --split 50,25,25
  inspect "$TMP/split.h5"
  [[ "$(q '[.[] | select(.record=="blend") | [.sequence_begin, .sequence_end]]')" == "[[0,100],[100,150],[150,200]]" ]] || fail "$(q .)"
  build --data-path "$TMP/a" --output "$TMP/seed.h5" --seed 7
  inspect "$TMP/seed.h5" --show-samples 4
  [[ "$(q '[.[] | select(.record=="sample") | .tokens]')" != "$base_samples" ]] || fail "--seed ignored"
  build --data-path "$TMP/a" --output "$TMP/seq.h5" --seq-length 9
  inspect "$TMP/seq.h5" --show-samples 1
  check '[.[] | select(.record=="sample")][0].tokens | length == 10' "$TMP/inspect.json"
}

@test "--train-data-path, --valid-data-path and --test-data-path use whole datasets per split" {
  build --train-data-path "$TMP/a" --valid-data-path 0.5 "$TMP/a" 0.5 "$TMP/b" --output "$TMP/i.h5"
  inspect "$TMP/i.h5"
  [[ "$(q '[.[] | select(.record=="split") | .split]')" == '["train","valid"]' ]] || fail "$(q .)"
  [[ "$(q '[.[] | select(.record=="blend") | [.split, .sequence_begin, .sequence_end]]')" == '[["train",0,200],["valid",0,200],["valid",0,120]]' ]] || fail "$(q .)"
  build --train-data-path "$TMP/a" --test-data-path "$TMP/b" --output "$TMP/j.h5"
  inspect "$TMP/j.h5"
  [[ "$(q '[.[] | select(.record=="blend") | [.split, .prefix]]')" == '[["train","'"$TMP"'/a"],["test","'"$TMP"'/b"]]' ]] || fail "$(q .)"
}

@test "inspect shows the samples a data-parallel rank reads for a consumed-samples count" {
  build --data-path "$TMP/a" --output "$TMP/i.h5"
  inspect "$TMP/i.h5" --show-samples 6 --micro-batch-size 2 --data-parallel-size 3 --data-parallel-rank 1 --consumed-samples 12
  # MegatronPretrainingSampler: micro-batch m of rank 1 = 12 + m*6 + 2 + [0, 2)
  [[ "$(q '[.[] | select(.record=="sample") | .sample]')" == "[14,15,20,21,26,27]" ]] || fail "$(q .)"
  ids_all="$(q '[.[] | select(.record=="sample")] | map({(.sample|tostring): .tokens}) | add')"
  inspect "$TMP/i.h5" --show-samples 30
  for id in 14 15 20 21 26 27; do
    [[ "$(q '[.[] | select(.record=="sample" and .sample=='"$id"') | .tokens][0]')" == "$(jq -c --arg k "$id" '.[$k]' <<<"$ids_all")" ]] || fail "sample $id differs"
  done
  inspect "$TMP/i.h5" --show-samples 2 --show-split valid
  check '[.[] | select(.record=="sample")] | all(.split == "valid")' "$TMP/inspect.json"
  mt-shard inspect "$TMP/i.h5" --show-samples 2 --show-split test --format csv >"$TMP/out.csv"
  grep -q '^record,split,micro_batch,sample' "$TMP/out.csv" || fail "$(cat "$TMP/out.csv")"
}

@test "inspect decodes the shown samples with a tokenizer (--tokenizer-type, --tokenizer-model)" {
  build --data-path "$TMP/a" --output "$TMP/i.h5"
  # a tiktoken rank file of the 256 single bytes: id t decodes to byte t
  /usr/bin/python3 -c 'import base64, sys; [print(base64.b64encode(bytes([b])).decode(), b) for b in range(256)]' >"$TMP/bytes.tiktoken"
  inspect "$TMP/i.h5" --show-samples 3 --tokenizer-type TikTokenizer --tokenizer-model "$TMP/bytes.tiktoken"
  check '[.[] | select(.record=="sample")] | length == 3 and all(.text == (.tokens | implode))' "$TMP/inspect.json"
  [[ "$(cat "$TMP/err.log")" == *"warning: mt-shard: $TMP/a.h5 was tokenized by test"* ]] || fail "no tokenizer mismatch warning: $(cat "$TMP/err.log")"
  # GPT-2's two files (a byte-level encoder of the 256 bytes, no merges), and Megatron's TikTokenizer JSON
  # whose ids start after --tiktoken-num-special-tokens specials
  /usr/bin/python3 - "$TMP" <<'EOF'
import base64, json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
encoder = {chr(c): b for b, c in zip(bs, cs)}
encoder["<|endoftext|>"] = 256
json.dump(encoder, open(sys.argv[1] + "/encoder.json", "w"))
open(sys.argv[1] + "/vocab.bpe", "w").write("#version: 0.2\n")
json.dump([{"rank": b, "token_bytes": base64.b64encode(bytes([b])).decode(), "token_str": chr(b)} for b in range(256)],
          open(sys.argv[1] + "/megatron.json", "w"))
EOF
  inspect "$TMP/i.h5" --show-samples 2 --tokenizer-type GPT2BPETokenizer --vocab-file "$TMP/encoder.json" --merge-file "$TMP/vocab.bpe"
  check '[.[] | select(.record=="sample")] | all(.text == (.tokens | implode))' "$TMP/inspect.json"
  inspect "$TMP/i.h5" --show-samples 2 --tokenizer-type TikTokenizer --tokenizer-model "$TMP/megatron.json" --tiktoken-num-special-tokens 3
  check '[.[] | select(.record=="sample")] | all(.text == (.tokens | map(if . < 3 then ["<unk>", "<s>", "</s>"][.] else ([. - 3] | implode) end) | add))' "$TMP/inspect.json"
  inspect "$TMP/i.h5" --show-samples 1 --tokenizer-type TikTokenizer --tokenizer-model "$TMP/megatron.json"
  check '[.[] | select(.record=="sample")][0].text | startswith("<SPECIAL_")' "$TMP/inspect.json"
  run_split mt-shard inspect "$TMP/i.h5" --tokenizer-type TikTokenizer --tokenizer-model "$TMP/bytes.tiktoken"
  [[ $status -eq 2 && "$err" == *"--tokenizer-type: decodes shown samples"* ]] || fail "$status $err"
  run_split mt-shard inspect "$TMP/i.h5" --show-samples 1 --tokenizer-model "$TMP/bytes.tiktoken"
  [[ $status -eq 2 ]] || fail "--tokenizer-model without a type must be refused: $status $err"
}

@test "output formats: jsonl led by the run record by default, table, csv" {
  run_split mt-shard build "${COMMON[@]}" --data-path "$TMP/a" --output "$TMP/i.h5"
  [[ $status -eq 0 ]] || fail "$status $err"
  printf '%s\n' "$out" | jq -e -s '.[0].record == "run" and .[1].record == "index"' >/dev/null || fail "$out"
  run_split mt-shard inspect "$TMP/i.h5"
  printf '%s\n' "$out" | jq -e -s '.[0].record == "run" and .[0].tool == "mt-shard" and .[1].record == "parameters"' >/dev/null || fail "$out"
  run_split mt-shard build "${COMMON[@]}" --data-path "$TMP/a" --output "$TMP/i.h5" --format table
  [[ $status -eq 0 && "$out" == "# index"* ]] || fail "$status $out $err"
  run_split mt-shard inspect "$TMP/i.h5" --format csv
  [[ "$out" == *"record,split,requested,samples"* ]] || fail "$out"
}

@test "a stale index is refused: other parameters, or other data behind the same prefix" {
  build --data-path "$TMP/a" --output "$TMP/i.h5"
  cp "$TMP/i.h5" "$TMP/before.h5"
  run_split mt-shard build "${COMMON[@]}" --data-path "$TMP/a" --output "$TMP/i.h5" --seq-length 12
  [[ $status -eq 1 && "$(line_count "$err")" -eq 1 ]] || fail "$status $err"
  [[ "$err" == "mt-shard: error: $TMP/i.h5: stale sample index"*"seq_length: file 16, asked 12"* ]] || fail "$err"
  cmp -s "$TMP/i.h5" "$TMP/before.h5" || fail "the index was rewritten"
  "$MAKE" "$TMP/a" h5 100 0 counting:201:20:1
  run_split mt-shard build "${COMMON[@]}" --data-path "$TMP/a" --output "$TMP/i.h5"
  [[ $status -eq 1 && "$err" == *"stale sample index"*"datasets[0].sequences: file 200, asked 201"* ]] || fail "$status $err"
  run_split mt-shard inspect "$TMP/i.h5"
  [[ $status -eq 1 && "$err" == *"stale"* ]] || fail "inspect must refuse too: $status $err"
}

@test "bad input: one line, non-zero exit, nothing written" {
  cp "$TMP/b.idx" "$TMP/good.idx"
  bad() {  # NAME: a broken copy of b as $TMP/NAME.{bin,idx}
    cp "$TMP/b.bin" "$TMP/$1.bin"
    cp "$TMP/good.idx" "$TMP/$1.idx"
  }
  bad magic; printf 'XXIDIDX' | dd of="$TMP/magic.idx" conv=notrunc 2>/dev/null
  bad truncated; truncate -s 100 "$TMP/truncated.idx"
  bad pointers; truncate -s 200 "$TMP/pointers.bin"
  bad dtype; printf '\x04' | dd of="$TMP/dtype.idx" bs=1 seek=17 conv=notrunc 2>/dev/null  # uint16 data called int32
  "$MAKE" "$TMP/tiny" h5 100 0 counting:20:3:1
  expect_error() {  # STATUS FRAGMENT ARGS...
    local want="$1" fragment="$2"
    shift 2
    run_split mt-shard build "$@" --output "$TMP/out/index.h5"
    [[ $status -eq $want ]] || fail "'$*' exited $status (want $want): $err"
    [[ -z "$out" ]] || fail "'$*' printed on stdout: $out"
    [[ "$(line_count "$err")" -eq 1 && "$err" == "mt-shard: error: "*"$fragment"* ]] || fail "'$*': $err"
    [[ ! -e "$TMP/out" ]] || fail "'$*' wrote $(ls -R "$TMP/out")"
  }
  expect_error 1 "wrong magic" "${COMMON[@]}" --data-path "$TMP/magic"
  expect_error 1 "truncated" "${COMMON[@]}" --data-path "$TMP/truncated"
  expect_error 1 "pointers.bin" "${COMMON[@]}" --data-path "$TMP/pointers"
  expect_error 1 "4-byte token size" "${COMMON[@]}" --data-path "$TMP/dtype"
  expect_error 1 "the valid split of $TMP/tiny is empty" "${COMMON[@]}" --data-path "$TMP/tiny" --split 98,1,1
  expect_error 1 "--seq-length 5000: longer than the train split" "${COMMON[@]}" --data-path "$TMP/a" --seq-length 5000
  expect_error 2 "--data-path" "${COMMON[@]}" --data-path 0 "$TMP/a" 0 "$TMP/b"
  expect_error 2 "--data-path" "${COMMON[@]}" --data-path 0.5 "$TMP/a" x "$TMP/b"
  expect_error 2 "split" "${COMMON[@]}" --data-path "$TMP/a" --split 0,0,0
  expect_error 1 "no token dataset" "${COMMON[@]}" --data-path "$TMP/nonexistent"
  expect_error 2 "--seq-length" --data-path "$TMP/a" --train-samples 10
  expect_error 2 "--train-iters/--train-samples" --data-path "$TMP/a" --seq-length 8
  expect_error 2 "--data-path" "${COMMON[@]}"
  expect_error 2 "--data-path" "${COMMON[@]}" --data-path "$TMP/a" --train-data-path "$TMP/a"
  expect_error 2 "--seed" "${COMMON[@]}" --data-path "$TMP/a" --seed -1
  run_split mt-shard inspect "$TMP/a.h5"
  [[ $status -eq 1 && "$err" == "mt-shard: error: $TMP/a.h5: not an mt sample index"* ]] || fail "$status $err"
  run_split mt-shard
  [[ $status -eq 2 && "$(line_count "$err")" -eq 1 && "$err" == "mt-shard: error: "* ]] || fail "no command: $status $err"
}

@test "--help lists every command's flags" {
  run_split mt-shard --help
  [[ $status -eq 0 ]] || fail "$status"
  for flag in --data-path --train-data-path --valid-data-path --test-data-path --split --seq-length --seed \
      --train-samples --train-iters --global-batch-size --eval-interval --eval-iters --output --data-cache-path \
      --show-samples --show-split --consumed-samples --micro-batch-size --data-parallel-size --data-parallel-rank \
      --tokenizer-type --vocab-file --merge-file --tokenizer-model --tiktoken-num-special-tokens \
      --format --json --version; do
    [[ "$out" == *"$flag"* ]] || fail "--help lacks $flag"
  done
}

@test "issue11 case 5: a prefix with X.h5 and X.bin/.idx of different datasets is refused, naming both" {
  "$MAKE" "$TMP/x" h5 100 0 counting:200:20:1
  "$MAKE" "$TMP/x" bin 100 0 counting:120:12:2  # a later run of another corpus, same prefix
  run_split mt-shard build "${COMMON[@]}" --data-path "$TMP/x" --output "$TMP/i.h5"
  [[ $status -eq 1 && "$err" == "mt-shard: error: $TMP/x: ambiguous: $TMP/x.h5 and $TMP/x.bin + $TMP/x.idx hold different token datasets (200 documents, 200 sequences, "*" tokens against 120 documents, 120 sequences, "*"); remove the stale one, or name the one to read ($TMP/x.h5 or $TMP/x.bin)" ]] ||
    fail "$status $err"
  [[ ! -e "$TMP/i.h5" ]] || fail "index written"
  build --data-path "$TMP/x.bin" --output "$TMP/bin.h5"  # naming one file reads that one
  check '.[0].train_samples > 0' "$TMP/build.json"
  # Same structure, one token changed: still two datasets.
  "$MAKE" "$TMP/y" h5 100 0 '[[[1,2,3,4]],[[5,6,7]]]'
  "$MAKE" "$TMP/y" bin 100 0 '[[[1,2,3,4]],[[5,6,8]]]'
  run_split mt-shard build "${COMMON[@]}" --data-path "$TMP/y" --output "$TMP/j.h5"
  [[ $status -eq 1 && "$err" == *"ambiguous"*"(the tokens of sequence 1 differ)"* ]] || fail "$status $err"
  # One dataset in both formats (mt-tokenize --output-format both) is not ambiguous.
  "$MAKE" "$TMP/z" h5 100 0 counting:200:20:1
  "$MAKE" "$TMP/z" bin 100 0 counting:200:20:1
  build --data-path "$TMP/z" --output "$TMP/k.h5"
}

# --split SPLIT is a usage error with MESSAGE, and no index is written.
split_refused() {
  run_split mt-shard build "${COMMON[@]}" --data-path "$TMP/a" --output "$TMP/i.h5" --split="$1"
  [[ $status -eq 2 && "$err" == "mt-shard: error: --split: '$1': $2 (expected up to three proportions for train, valid, test, such as 969,30,1)" ]] ||
    fail "--split $1: $status $err"
  [[ ! -e "$TMP/i.h5" ]] || fail "index written for --split $1"
}

@test "issue11 case 12: --split \"-1,2,3\", \"nan,1,1\", \"1,,1\" are refused, not read as other numbers" {
  split_refused "-1,2,3" "'-1' is negative"
  split_refused "nan,1,1" "'nan' is not a number"
  split_refused "1,,1" "part 2 is empty"
  split_refused "1,2/3" "mixes ',' and '/'"
  for split in "80, 10, 10" "80/10/10" "80 10 10" "8.0,1,1."; do
    build --data-path "$TMP/a" --output "$TMP/ok.h5" --split="$split"
    inspect "$TMP/ok.h5"
    [[ "$(q '[.[] | select(.record=="blend") | [.sequence_begin, .sequence_end]]')" == "[[0,160],[160,180],[180,200]]" ]] || fail "$split: $(q .)"
    rm "$TMP/ok.h5"
  done
}

@test "issue11 case 15: --split errors say what is wrong with the given string" {
  split_refused "a,b,c" "'a' is not a number"
  split_refused "1e3,1,1" "'1e3' has an exponent; write the number out"
  split_refused "1,2,3,4" "4 parts, at most three"
  split_refused "0,0,0" "the parts sum to zero"
}

@test "issue11 case 17: a directory where mt-shard expects a file or a dataset prefix says so" {
  mkdir "$TMP/dir"
  run_split mt-shard inspect "$TMP/dir"
  [[ $status -eq 1 && "$err" == "mt-shard: error: $TMP/dir: is a directory, expected a file" ]] || fail "$status $err"
  run_split mt-shard build "${COMMON[@]}" --data-path "$TMP/dir" --output "$TMP/i.h5"
  [[ $status -eq 1 && "$err" == "mt-shard: error: $TMP/dir: is a directory; a token dataset is named by its prefix X (of X.h5, or X.bin and X.idx)" ]] ||
    fail "$status $err"
  run_split mt-shard build "${COMMON[@]}" --data-path "$TMP/a" --output "$TMP/dir"
  [[ $status -eq 1 && "$err" == "mt-shard: error: $TMP/dir: is a directory, expected a file" ]] || fail "$status $err"
  build --data-path "$TMP/a" --output "$TMP/i.h5"
  run_split mt-shard inspect "$TMP/i.h5" --show-samples 1 --tokenizer-type TikTokenizer --tokenizer-model "$TMP/dir"
  [[ $status -eq 1 && "$err" == "mt-shard: error: --tokenizer-model $TMP/dir: is a directory, expected a file" ]] || fail "$status $err"
}

@test "issue11 case 20: inspect --format table|csv escapes decoded control characters and prints one header per kind" {
  build --data-path "$TMP/b" --output "$TMP/i.h5"
  # Every id decodes to its byte, so the counting samples hold newlines, tabs and ESC.
  /usr/bin/python3 -c 'import base64; [print(base64.b64encode(bytes([b])).decode(), b) for b in range(256)]' >"$TMP/bytes.tiktoken"
  local decode=(--show-samples 3 --tokenizer-type TikTokenizer --tokenizer-model "$TMP/bytes.tiktoken")
  mt-shard inspect "$TMP/i.h5" "${decode[@]}" --format table >"$TMP/table.txt" 2>/dev/null
  for kind in parameters dataset split blend histogram sample; do
    [[ "$(grep -c "^# $kind\$" "$TMP/table.txt")" -eq 1 ]] || fail "# $kind: $(cat "$TMP/table.txt")"
  done
  local records
  records="$(mt-shard inspect "$TMP/i.h5" "${decode[@]}" --format jsonl 2>/dev/null | grep -vc '^{"record":"run"')"
  # 6 kinds of title, header and rule, then one line per record
  [[ "$(grep -cv '^$' "$TMP/table.txt")" -eq $(( 6 * 3 + records )) ]] ||
    fail "a row broke over lines: $(cat -A "$TMP/table.txt" | tail -8)"
  grep -q '\\n' "$TMP/table.txt" || fail "no escaped newline in the decoded text"
  local header row
  header="$(grep -A1 '^# sample$' "$TMP/table.txt" | tail -1)"
  row="$(grep -A3 '^# sample$' "$TMP/table.txt" | tail -1)"
  [[ "$header" == *" tokens  "*" text  " && ${#header} -eq ${#row} ]] || fail "header: $header"
  mt-shard inspect "$TMP/i.h5" "${decode[@]}" --format csv >"$TMP/out.csv" 2>/dev/null
  [[ "$(grep -c '^record,split,requested' "$TMP/out.csv")" -eq 1 && "$(grep -c '^record,split,component' "$TMP/out.csv")" -eq 1 ]] ||
    fail "$(cat "$TMP/out.csv")"
  [[ "$(grep -cv '^$' "$TMP/out.csv")" -eq $(( 6 + records )) ]] || fail "a csv record broke over lines: $(cat -A "$TMP/out.csv" | tail -4)"
  /usr/bin/python3 - "$TMP/out.csv" <<'PY' || fail "csv does not parse: $(tail -3 "$TMP/out.csv")"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1], newline="")) if r]
samples = [r for r in rows if r[0] == "sample"]
header = [r for r in rows if r[0] == "record" and r[1] == "split" and r[2] == "micro_batch"][0]
assert len(samples) == 3 and all(len(r) == len(header) for r in samples), (header, samples)
PY
}
