#!/usr/bin/env bats
# mt-tokenize with SentencePiece BPE models (SentencePieceTokenizer, GPTSentencePieceTokenizer,
# Llama2Tokenizer): ids and Megatron datasets against the live reference (python3-sentencepiece,
# tests/golden/sentencepiece/check_live.py) on the demo corpus, Megatron-Core's wrapper facts
# (no BOS, --append-eod appends the model's eos), and the flags refused by name. The test models
# are tests/golden/sentencepiece/*.model (make_models.py).

setup_file() {
  jq -R -s -c 'split("\n\n")[] | {text: .}' "$BATS_TEST_DIRNAME/../../data/demo/tinyshakespeare.txt" \
    >"$BATS_FILE_TMPDIR/tinyshakespeare.jsonl"
}

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
  MODELS="$MT_ROOT/tests/golden/sentencepiece"
  LIVE="$MODELS/check_live.py"
  SHAKESPEARE_JSONL="$BATS_FILE_TMPDIR/tinyshakespeare.jsonl"
  LLAMA=(--tokenizer-type Llama2Tokenizer --tokenizer-model "$MODELS/llama_style_2k.model")
}

teardown() { rm -rf "$TMP"; }

need_sentencepiece() {
  /usr/bin/python3 -c 'import sentencepiece' 2>/dev/null || skip_without_oracle "python3-sentencepiece is not installed"
}

@test "sentencepiece: encode equals the reference on the demo corpus for every test model" {
  need_sentencepiece
  for model in llama_style_2k nfkc_4k identity_1k; do
    mt-tokenize encode --tokenizer-type SentencePieceTokenizer --tokenizer-model "$MODELS/$model.model" \
      --input "$SHAKESPEARE_JSONL" --format jsonl --workers 2 >"$TMP/$model.ids"
    run_split /usr/bin/python3 "$LIVE" encode "$MODELS/$model.model" "$SHAKESPEARE_JSONL" "$TMP/$model.ids"
    [[ $status -eq 0 && "$out" == "ok 7222" ]] || fail "$model: $status $out $err"
  done
}

@test "sentencepiece: preprocessing adds no BOS and --append-eod appends the model's eos" {
  need_sentencepiece
  mt-tokenize --input "$SHAKESPEARE_JSONL" "${LLAMA[@]}" --append-eod --output-format megatron \
    --output-prefix "$TMP/shake" >"$TMP/out.jsonl"
  jq -e 'select(.record=="summary") | .tokenizer == "Llama2Tokenizer" and .documents == 7222' "$TMP/out.jsonl" >/dev/null ||
    fail "$(cat "$TMP/out.jsonl")"
  run_split /usr/bin/python3 "$LIVE" dataset "$MODELS/llama_style_2k.model" "$SHAKESPEARE_JSONL" \
    "$TMP/shake_text_document" "$MT_ROOT/tests/data/read_megatron_idx.py"
  [[ $status -eq 0 && "$out" == "ok 7222" ]] || fail "$status $out $err"
}

@test "sentencepiece: decode gives the reference's text and encode --raw | decode --raw round-trips" {
  run_split bash -c "printf 'Hello world' | mt-tokenize encode --raw ${LLAMA[*]}"
  [[ $status -eq 0 && "$out" == "464 293 1929 1197" ]] || fail "$status $out $err"
  run_split bash -c "echo '1 464 293 1929 1197 2 1926 231 135 177' | mt-tokenize decode ${LLAMA[*]}"
  [[ "$out" == '{"text":"Hello world €"}' ]] || fail "$out $err"
  head -c 200000 "$MT_ROOT/data/corpus/war_and_peace_pg2600.txt" | tr -s ' \n' >"$TMP/text.txt"
  mt-tokenize encode --raw "${LLAMA[@]}" --input "$TMP/text.txt" | mt-tokenize decode --raw "${LLAMA[@]}" >"$TMP/back.txt"
  cmp "$TMP/text.txt" "$TMP/back.txt" || fail "the identity-normalizer model does not round-trip"
}

@test "sentencepiece: Megatron-Core's non-default wrapper flags and --allow-special are refused by name" {
  run_split bash -c "printf x | mt-tokenize encode --raw ${LLAMA[*]} --tokenizer-sentencepiece-legacy"
  [[ $status -eq 2 && "$err" == "mt-tokenize: error: --tokenizer-sentencepiece-legacy: is not supported"* ]] || fail "$status $err"
  run_split bash -c "printf x | mt-tokenize encode --raw ${LLAMA[*]} --tokenizer-sentencepiece-ignore-extra-whitespaces=false"
  [[ $status -eq 2 && "$err" == "mt-tokenize: error: --tokenizer-sentencepiece-ignore-extra-whitespaces: false is not supported"* ]] ||
    fail "$status $err"
  run_split bash -c "printf x | mt-tokenize encode --raw ${LLAMA[*]} --tokenizer-sentencepiece-ignore-extra-whitespaces"
  [[ $status -eq 0 && "$out" == "1926 1975" ]] || fail "the default value: $status $out $err"
  run_split mt-tokenize --input "$SHAKESPEARE_JSONL" "${LLAMA[@]}" --allow-special --output-prefix "$TMP/p"
  [[ $status -eq 2 && "$err" == "mt-tokenize: error: --allow-special: does not apply to Llama2Tokenizer"* ]] || fail "$status $err"
  [[ -z "$(ls "$TMP")" ]] || fail "files written: $(ls "$TMP")"
}

@test "sentencepiece: a truncated or corrupt model is refused naming the file and what is wrong" {
  head -c 15000 "$MODELS/llama_style_2k.model" >"$TMP/cut.model"
  run_split bash -c "printf x | mt-tokenize encode --raw --tokenizer-type Llama2Tokenizer --tokenizer-model '$TMP/cut.model'"
  [[ $status -eq 1 && "$err" == "mt-tokenize: error: $TMP/cut.model: not a valid SentencePiece model: ModelProto: cut short"* ]] ||
    fail "$status $err"
  run_split bash -c "printf x | mt-tokenize encode --raw --tokenizer-type Llama2Tokenizer --tokenizer-model '$MT_ROOT/data/tokenizers/gpt2-hf/tokenizer.json'"
  [[ $status -eq 1 && "$err" == *"tokenizer.json: not a valid SentencePiece model: "* ]] || fail "$status $err"
  run_split mt-tokenize encode --raw --tokenizer-type Llama2Tokenizer
  [[ $status -eq 2 && "$err" == *"--tokenizer-model"* ]] || fail "$status $err"
}
