#!/usr/bin/env bats
# mt-tokenize --tokenizer-type HuggingFaceTokenizer with SentencePiece-style tokenizer.json files
# (tests/golden/sentencepiece/llama_style_2k.legacy.json and its metaspace and split siblings, made
# by make_hf_goldens.py from llama_style_2k.model as transformers converts LLaMA-2): on the demo
# corpus the legacy file gives sentencepiece's ids (live python3-sentencepiece when installed, and
# the .model path), the template's BOS and --append-eod's </s> in a Megatron dataset, raw text
# encoded alike by 1 or 2 workers, tokenizers' spacing after special tokens (--allow-special),
# and the components mt does not read refused by name.

setup_file() {
  jq -R -s -c 'split("\n\n")[] | {text: .}' "$BATS_TEST_DIRNAME/../../data/demo/tinyshakespeare.txt" \
    >"$BATS_FILE_TMPDIR/tinyshakespeare.jsonl"
}

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
  MODELS="$MT_ROOT/tests/golden/sentencepiece"
  SHAKESPEARE_JSONL="$BATS_FILE_TMPDIR/tinyshakespeare.jsonl"
  LEGACY=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$MODELS/llama_style_2k.legacy.json")
  METASPACE=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$MODELS/llama_style_2k.metaspace.json")
}

teardown() { rm -rf "$TMP"; }

@test "hf sentencepiece: the legacy tokenizer.json gives sentencepiece's ids on the demo corpus" {
  mt-tokenize encode "${LEGACY[@]}" --tokenizer-hf-no-include-special-tokens --input "$SHAKESPEARE_JSONL" \
    --format jsonl --workers 2 >"$TMP/json.ids"
  mt-tokenize encode --tokenizer-type Llama2Tokenizer --tokenizer-model "$MODELS/llama_style_2k.model" \
    --input "$SHAKESPEARE_JSONL" --format jsonl --workers 2 >"$TMP/model.ids"
  [[ "$(wc -l <"$TMP/json.ids")" -eq 7222 ]] || fail "$(wc -l <"$TMP/json.ids") lines"
  cmp "$TMP/json.ids" "$TMP/model.ids" || fail "tokenizer.json and .model disagree on the demo corpus"
  if /usr/bin/python3 -c 'import sentencepiece' 2>/dev/null; then
    run_split /usr/bin/python3 "$MODELS/check_live.py" encode "$MODELS/llama_style_2k.model" "$SHAKESPEARE_JSONL" "$TMP/json.ids"
    [[ $status -eq 0 && "$out" == "ok 7222" ]] || fail "$status $out $err"
  fi
}

@test "hf sentencepiece: a Megatron dataset holds the template's BOS, the ids, and --append-eod's </s>" {
  printf '%s\n' '{"text": "Hello world"}' '{"text": ""}' >"$TMP/in.jsonl"
  mt-tokenize --input "$TMP/in.jsonl" "${LEGACY[@]}" --append-eod --output-format megatron \
    --output-prefix "$TMP/hello" >"$TMP/out.jsonl"
  jq -e 'select(.record=="summary") | .tokenizer == "HuggingFaceTokenizer" and .documents == 2' "$TMP/out.jsonl" >/dev/null ||
    fail "$(cat "$TMP/out.jsonl")"
  run /usr/bin/python3 "$MT_ROOT/tests/data/read_megatron_idx.py" "$TMP/hello_text_document"
  assert_output --partial "sequence 0: 1 464 293 1929 1197 2"  # tokenizers: <s> ▁He ll o ▁world, then eod
  assert_output --partial "sequence 1: 1 2"
}

@test "hf sentencepiece: raw text gives the same ids with 1 and 2 workers" {
  head -c 1500000 "$MT_ROOT/data/corpus/war_and_peace_pg2600.txt" >"$TMP/text.txt"
  for file in legacy metaspace split; do
    local options=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$MODELS/llama_style_2k.$file.json")
    mt-tokenize encode --raw "${options[@]}" --input "$TMP/text.txt" --workers 1 >"$TMP/one" 2>/dev/null
    mt-tokenize encode --raw "${options[@]}" --input "$TMP/text.txt" --workers 2 >"$TMP/two" 2>/dev/null
    cmp "$TMP/one" "$TMP/two" || fail "$file: the workers' parts encode differently"
  done
}

@test "hf sentencepiece: --allow-special splits special tokens, with tokenizers' legacy spacing after them" {
  # tokenizers 0.20.3 (hf_goldens.jsonl): the legacy Prepend normalizer puts a "▁" (1926) after <s>;
  # Metaspace(prepend_scheme first) does not; sentencepiece reads "<s>" as text (65 1934 67).
  run_split bash -c "printf 'Hello <s> world' | mt-tokenize encode --raw --allow-special --tokenizer-hf-no-include-special-tokens ${LEGACY[*]}"
  [[ $status -eq 0 && "$out" == "464 293 1929 1926 1 1926 1197" ]] || fail "legacy: $status $out $err"
  run_split bash -c "printf 'Hello <s> world' | mt-tokenize encode --raw --allow-special --tokenizer-hf-no-include-special-tokens ${METASPACE[*]}"
  [[ $status -eq 0 && "$out" == "464 293 1929 1926 1 1197" ]] || fail "metaspace: $status $out $err"
  run_split bash -c "printf 'Hello <s> world' | mt-tokenize encode --raw --tokenizer-hf-no-include-special-tokens ${LEGACY[*]}"
  [[ $status -eq 0 && "$out" == "464 293 1929 1926 65 1934 67 1197" ]] || fail "without --allow-special: $status $out $err"
  run_split bash -c "echo '464 293 1929 1926 1 1926 1197 1926 231 135 177' | mt-tokenize decode ${LEGACY[*]}"
  [[ "$out" == '{"text":"Hello <s>  world €"}' ]] || fail "$out $err"
}

@test "hf sentencepiece: components mt does not read are refused by name" {
  refuse() {  # refuse JQ_EDIT EXPECTED_MESSAGE_PART
    jq "$1" "$MODELS/llama_style_2k.legacy.json" >"$TMP/edited.json"
    run_split bash -c "printf x | mt-tokenize encode --raw --tokenizer-type HuggingFaceTokenizer --tokenizer-model '$TMP/edited.json'"
    [[ $status -eq 1 && "$err" == "mt-tokenize: error: $TMP/edited.json"*"$2"* ]] || fail "$1: $status $err"
  }
  refuse '.normalizer = {"type": "NFKC"}' "normalizer NFKC is not supported"
  refuse '.normalizer.normalizers[1].pattern = {"Regex": " +"}' "Replace is supported with a String pattern only"
  refuse '.decoder.decoders[0] = {"type": "CTC"}' "decoder CTC is not supported"
  refuse '.pre_tokenizer = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "sometimes", "split": true}' \
    'prepend_scheme "sometimes" is not always, first or never'
  refuse '.model.dropout = 0.1' "BPE dropout is not supported"
  refuse '.added_tokens[0].lstrip = true' "added token <unk>: uses lstrip"
  refuse '.model.merges[0] = ["▁", "zz"]' 'token "zz" is not in the vocab'
}
