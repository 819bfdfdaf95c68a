#!/usr/bin/env bats
# mt-train with BERT (issue 25), from WordPiece tokenizing to training: pre-split sentences (a JSON
# list per document) tokenized by mt-tokenize with a small uncased WordPiece vocab.txt written here
# (no [CLS]/[SEP] around each sentence: the dataset adds them), then tiny-bert trained on Megatron's
# masked samples with pretrain_bert.py's flags: lm loss and sop loss in the step and eval records
# and in Megatron's log lines, --bert-no-binary-head without the sop loss, a checkpoint that
# resumes bit for bit, TP = 2 (with and without sequence parallelism), DP = 2 and PP = 2 under
# mpirun equal to one rank, mt-mfu's FLOPs and mt-memreport's memory of BERT, and what BERT does
# not run with refused by name. The losses against the model run outside the trainer are
# tests/unit/train/test_bert_training.cpp; the samples against Megatron's tests/unit/data/test_bert_data.cpp.

setup_file() {
  load common
  export DATA="$BATS_FILE_TMPDIR"
  python3 - "$DATA" <<'PYTHON'
import json, random, sys
directory = sys.argv[1]
words = ("the a king queen war peace river house soldier letter night morning walked spoke saw wrote "
         "quickly slowly old young great small red blue").split()
pieces = ["##s", "##ed", "##ing", "##ly"]
with open(directory + "/vocab.txt", "w") as f:
    f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + words + pieces) + "\n")
rng = random.Random(5)
with open(directory + "/corpus.jsonl", "w") as f:
    for _ in range(120):
        sentences = []
        for _ in range(rng.randint(1, 6)):
            sentence = []
            for _ in range(rng.randint(2, 9)):
                word = rng.choice(words)
                if rng.random() < 0.2:
                    word += rng.choice(pieces)[2:]
                sentence.append(word)
            sentences.append(" ".join(sentence).capitalize() + ".")
        f.write(json.dumps({"text": sentences}) + "\n")
PYTHON
  mt-tokenize --input "$DATA/corpus.jsonl" --tokenizer-type BertWordPieceLowerCase --vocab-file "$DATA/vocab.txt" \
    --tokenizer-hf-no-include-special-tokens --output-prefix "$DATA/bert" --log-interval 0 >/dev/null
}

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
}

teardown() { rm -rf "$TMP"; }

check() {
  jq -e -s "$1" "$TMP/out.jsonl" >/dev/null || fail "jq '$1' is false for: $(head -c 3000 "$TMP/out.jsonl") $(cat "$TMP/err.log")"
}

BERT=(--model tiny-bert --seq-length 32 --max-position-embeddings 32 --tokenizer-type BertWordPieceLowerCase
      --micro-batch-size 2 --global-batch-size 8 --train-iters 4 --lr 1e-3 --eval-interval 2 --eval-iters 1
      --split 90,10,0 --log-interval 1 --peak-tflops 1)

bert() { mt-train "${BERT[@]}" --data-path "$DATA/bert_text_document" --vocab-file "$DATA/vocab.txt" "$@"; }

# Per-step [lm loss, sop loss, grad norm] of a record stream.
numbers() { jq -c -s '[.[] | select(.record=="step") | [.lm_loss, .sop_loss, .grad_norm]]' "$1"; }

# Every number of $1 within 1e-5 (relative) of $2's.
same_numbers() {
  jq -e -n --argjson a "$(numbers "$1")" --argjson b "$(numbers "$2")" \
    '($a | length) == ($b | length) and ($a | length) > 0 and
     ([range($a | length) as $i | range($a[$i] | length) as $j |
       (($a[$i][$j] // 0) - ($b[$i][$j] // 0) | fabs) <= 1e-5 * (($b[$i][$j] // 0) | fabs) + 1e-7] | all)' >/dev/null \
    || fail "$(numbers "$1") against one rank's $(numbers "$2")"
}

@test "issue25: tiny-bert trains on WordPiece sentences; lm loss and sop loss in the records and Megatron's log lines" {
  bert >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  check '.[0].model.bert == true and .[0].model.bert_binary_head == true and .[0].model.vocab_size == 34'
  check '[.[] | select(.record=="step")] | length == 4 and all(.lm_loss > 1 and .sop_loss > 0.3 and .sop_loss < 1.5)'
  check '[.[] | select(.record=="eval")] | length == 2 and all(.lm_loss > 1 and .sop_loss > 0)'
  grep -q " lm loss: [0-9.E+-]* | sop loss: [0-9.E+-]* | loss scale:" "$TMP/err.log" \
    || fail "no sop loss after lm loss in the log line: $(grep 'iteration' "$TMP/err.log" | head -2)"
  grep -q "validation loss at iteration 2 | lm loss value: [0-9.E+-]* | lm loss PPL: [0-9.E+-]* | sop loss value: [0-9.E+-]* | sop loss PPL:" \
    "$TMP/err.log" || fail "no sop loss in the validation line: $(grep 'validation' "$TMP/err.log")"
  # The masked-LM loss falls on this small vocabulary.
  check '[.[] | select(.record=="step")] | .[0].lm_loss - .[-1].lm_loss > 0.05'
}

@test "issue25: --bert-no-binary-head trains without the sop loss; --mask-prob and --short-seq-prob change the samples" {
  bert --bert-no-binary-head >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  check '.[0].model.bert_binary_head == false'
  check '[.[] | select(.record=="step" or .record=="eval")] | all(has("sop_loss") | not)'
  ! grep -q "sop loss" "$TMP/err.log" || fail "a sop loss without the binary head: $(grep 'sop' "$TMP/err.log" | head -2)"
  bert >"$TMP/plain.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  for flags in "--mask-prob 0.3" "--short-seq-prob 0.5"; do
    # shellcheck disable=SC2086
    bert $flags >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$flags: $(cat "$TMP/err.log")"
    [[ "$(numbers "$TMP/out.jsonl")" != "$(numbers "$TMP/plain.jsonl")" ]] || fail "$flags changed nothing"
  done
}

@test "issue25: a BERT checkpoint resumes bit for bit" {
  bert >"$TMP/whole.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  bert --exit-interval 2 --save "$TMP/ckpt" --save-interval 2 >"$TMP/first.jsonl" 2>"$TMP/err.log" \
    || [[ $? -eq 75 ]] || fail "$(cat "$TMP/err.log")"
  bert --load "$TMP/ckpt" --save "$TMP/ckpt" >"$TMP/second.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  pick='[.[] | select(.record=="step" or .record=="eval") | [.record, .iteration, .lm_loss, .sop_loss, .grad_norm]]'
  whole=$(jq -c -s "$pick" "$TMP/whole.jsonl")
  resumed=$(jq -c -s "$pick" "$TMP/first.jsonl" "$TMP/second.jsonl")
  [[ "$whole" == "$resumed" ]] || fail "resumed $resumed, whole $whole"
}

@test "issue25: TP=2 (with and without SP), DP=2 and PP=2 under mpirun train one rank's BERT numbers" {
  bert >"$TMP/one.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  for layout in "" "--tensor-model-parallel-size 2" "--tensor-model-parallel-size 2 --sequence-parallel" \
    "--pipeline-model-parallel-size 2"; do
    # shellcheck disable=SC2086
    mpirun_n 2 mt-train "${BERT[@]}" --data-path "$DATA/bert_text_document" --vocab-file "$DATA/vocab.txt" $layout \
      >"$TMP/two.jsonl" 2>"$TMP/err.log" || fail "'$layout': $(cat "$TMP/err.log")"
    same_numbers "$TMP/two.jsonl" "$TMP/one.jsonl"
  done
}

@test "issue25: mt-mfu and mt-memreport account BERT: tiny-bert's FLOPs by hand, a BERT run's memory per category" {
  # tests/unit/perf/test_flops.cpp's hand count: layers, core attention not halved, logits, the heads.
  mt-mfu --model tiny-bert --global-batch-size 1 >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  check '[.[] | select(.record=="mfu")][0].flops_per_token == 12460428'
  bert >"$TMP/train.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  mt-memreport --from-log - <"$TMP/train.jsonl" >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  check '[.[] | select(.record=="memory_check")] as $c | ($c | length) == 5 and ($c[0:3] | all(.error == 0)) and
         ($c[3].error | fabs) <= 0.10 and $c[0].measured_bytes > 0'
  mt-mfu --from-log "$TMP/train.jsonl" >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  check '[.[] | select(.record=="mfu_summary")] | length == 1 and .[0].flops_per_token > 0'
}

@test "issue25: what BERT does not run with is refused by name" {
  run bert --context-parallel-size 2 --dry-run --world-size 2
  [[ $status -eq 2 ]] || fail "status $status: $output"
  [[ "$output" == *"--context-parallel-size 2 with BERT: not supported yet"* ]] || fail "$output"
  run mt-train "${BERT[@]}" --data-path "$DATA/bert_text_document"
  [[ $status -eq 2 && "$output" == *"--vocab-file"* ]] || fail "no vocab file: status $status: $output"
  run mt-train --model tiny-bert --mock-data --train-iters 1
  [[ $status -eq 2 && "$output" == *"--data-path: BERT (model tiny-bert) trains on one pre-split sentence dataset"* ]] \
    || fail "mock data: status $status: $output"
  run bert --calculate-per-token-loss
  [[ $status -eq 2 && "$output" == *"--calculate-per-token-loss: not supported with BERT"* ]] || fail "$output"
  run mt-train --model tiny-gpt --mock-data --vocab-size 97 --train-iters 1 --mask-prob 0.2
  [[ $status -eq 2 && "$output" == *"--mask-prob: is read for BERT models only"* ]] || fail "GPT: $output"
  run mt-train --model tiny-gpt --mock-data --vocab-size 97 --train-iters 1 --bert-no-binary-head
  [[ $status -eq 2 && "$output" == *"--bert-no-binary-head"* ]] || fail "GPT: $output"
  run bert --vocab-size 20
  [[ $status -eq 2 && "$output" == *"smaller than the WordPiece vocabulary"* ]] || fail "$output"
}
