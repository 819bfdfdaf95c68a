#!/usr/bin/env bash
# The main job of README's first command: raw text to a trained tiny model on the CPU, all from
# files in this repository. mt-tokenize learns a 2048-token byte-level BPE vocabulary from tiny
# shakespeare and tokenizes the text (one JSONL document per speech) into an HDF5 token dataset;
# mt-shard builds Megatron's split and sample index and inspects it; mt-train learns a tiny GPT
# on those samples, evaluates it on the validation split and writes its final parameters as an
# HDF5 checkpoint; mt-mfu and mt-memreport read its records back (MFU, memory predicted against
# measured); then the same model trains on 2 MPI ranks (data parallelism with the distributed
# optimizer), which gives the one-rank run's losses; last, the one-rank run is stopped by a signal
# after saving a checkpoint and resumed from it to the same losses; the one-rank run also writes
# TensorBoard event files with Megatron's names, and mt-plot draws the runs' curves and the memory
# report as SVGs. Outputs go to demo-out/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
OUT="${MT_DEMO_OUT:-$ROOT/demo-out}"
mkdir -p "$OUT"
TEXT="$ROOT/data/demo/tinyshakespeare.txt"

# 1. Raw text -> JSONL documents (speeches are separated by blank lines).
jq -R -s -c 'split("\n\n")[] | select(length > 0) | {text: (. + "\n\n")}' "$TEXT" >"$OUT/shakespeare.jsonl"

# 2. A byte-level BPE vocabulary learned from the text, in GPT-2's two files.
"$MT_BIN/mt-tokenize" train --raw --input "$TEXT" --vocab-size 2048 --output-dir "$OUT/bpe" >"$OUT/bpe.jsonl"
TOKENIZER=(--tokenizer-type GPT2BPETokenizer --vocab-file "$OUT/bpe/encoder.json" --merge-file "$OUT/bpe/vocab.bpe")

# 3. Megatron's preprocessing: one document per line, EOD appended, HDF5 and .bin/.idx.
"$MT_BIN/mt-tokenize" --input "$OUT/shakespeare.jsonl" "${TOKENIZER[@]}" --append-eod --workers 2 \
  --output-prefix "$OUT/shakespeare" --output-format both --log-interval 0 >"$OUT/tokenize.jsonl"

# 4. Megatron's train/valid/test split and sample index, then a look at it.
DATA=(--data-path "$OUT/shakespeare_text_document" --split 949,50,1 --seq-length 64)
BATCH=(--global-batch-size 32 --train-iters 300 --eval-interval 100 --eval-iters 4)
"$MT_BIN/mt-shard" build "${DATA[@]}" "${BATCH[@]}" --output "$OUT/index.h5" >"$OUT/shard.jsonl"
"$MT_BIN/mt-shard" inspect "$OUT/index.h5" --json >"$OUT/inspect.json"

# 5. Train a tiny GPT on those samples (mt-train finds the same index in its cache or builds it),
#    with TensorBoard event files (tensorboard --logdir demo-out/tensorboard, from PyPI, shows them).
TRAIN=(--model tiny-gpt "${DATA[@]}" "${BATCH[@]}" --micro-batch-size 16 --data-cache-path "$OUT/cache"
       --lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 30 --lr-decay-style cosine --weight-decay 0.1 --clip-grad 1.0
       --log-interval 50)
rm -rf "$OUT/tensorboard"
"$MT_BIN/mt-train" "${TRAIN[@]}" --save-final "$OUT/tiny-gpt.h5" --tensorboard-dir "$OUT/tensorboard" \
  --log-timers-to-tensorboard --log-throughput --log-memory-to-tensorboard --log-validation-ppl-to-tensorboard \
  >"$OUT/train.jsonl"

# 6. The run's accounting from its own records: MFU per step against this CPU's FMA-probe peak, and
#    the memory mt-memreport predicts beside what mt-train allocated.
"$MT_BIN/mt-mfu" --from-log - <"$OUT/train.jsonl" >"$OUT/mfu.jsonl"
"$MT_BIN/mt-memreport" --from-log - <"$OUT/train.jsonl" >"$OUT/memreport.jsonl"

# 7. The same run on 2 ranks: DP = world / TP = 2, each rank takes its half of every global batch.
mpirun -np 2 --oversubscribe "$MT_BIN/mt-train" --model tiny-gpt "${DATA[@]}" "${BATCH[@]}" --micro-batch-size 16 \
  --data-cache-path "$OUT/cache" --lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 30 --lr-decay-style cosine \
  --weight-decay 0.1 --clip-grad 1.0 --log-interval 50 --use-distributed-optimizer --overlap-grad-reduce \
  >"$OUT/train-dp2.jsonl" 2>"$OUT/train-dp2.log"

# 8. The run of step 5 stopped and resumed: with --save it checkpoints every 100 iterations; SIGUSR1
#    (a cluster's preemption notice) after iteration 150 makes it save at the end of the step and
#    exit 75; started again with --load it continues from that iteration to the same losses.
rm -rf "$OUT/ckpt"
"$MT_BIN/mt-train" "${TRAIN[@]}" --save "$OUT/ckpt" --save-interval 100 >"$OUT/train-stopped.jsonl" 2>"$OUT/train-stopped.log" &
TRAINING=$!
while kill -0 "$TRAINING" 2>/dev/null && ! grep -q '"record":"step","iteration":150,' "$OUT/train-stopped.jsonl"; do sleep 0.05; done
kill -USR1 "$TRAINING" 2>/dev/null || true
STOPPED=0
wait "$TRAINING" || STOPPED=$?
"$MT_BIN/mt-train" "${TRAIN[@]}" --save "$OUT/ckpt" --save-interval 100 --load "$OUT/ckpt" >"$OUT/train-resumed.jsonl" \
  2>"$OUT/train-resumed.log"

# 9. Pictures without TensorBoard: the three runs' curves overlaid (the stopped run and its resumption
#    as one), and the memory report's predicted and measured bytes as stacked bars.
"$MT_BIN/mt-plot" training "$OUT/train.jsonl" "$OUT/train-dp2.jsonl" "$OUT/train-stopped.jsonl,$OUT/train-resumed.jsonl" \
  --label "1 rank" --label "2 ranks (DP, distributed optimizer)" --label "stopped by SIGUSR1, resumed" \
  --title "tiny GPT on tiny shakespeare" --output "$OUT/training.svg" >"$OUT/plot.jsonl"
"$MT_BIN/mt-plot" memory "$OUT/memreport.jsonl" --title "tiny GPT: memory per rank" --output "$OUT/memory.svg" \
  >>"$OUT/plot.jsonl"

echo
echo "mt demo: raw text to a trained tiny GPT"
jq -r '"  tokenizer: \(.vocab_size)-token BPE learned from \(.text_bytes) bytes in \(.seconds * 100 | round / 100) s"' \
  <(jq -c 'select(.record=="summary")' "$OUT/bpe.jsonl")
jq -r 'select(.record=="summary") | "  tokenized: \(.documents) documents, \(.tokens) tokens at \(.mb_per_s | round) MB/s"' "$OUT/tokenize.jsonl"
jq -r 'select(.record=="run") | "  model: tiny GPT, \(.model.parameters) parameters, vocabulary \(.model.vocab_size)"' "$OUT/train.jsonl"
jq -r 'select(.record=="eval") | "  iteration \(.iteration): validation loss \(.lm_loss * 1000 | round / 1000), perplexity \(.ppl * 100 | round / 100)"' "$OUT/train.jsonl"
jq -r 'select(.record=="summary") | "  \(.iterations) steps, \(.tokens_per_s | round) tokens/s, final training loss \(.lm_loss * 1000 | round / 1000)"' "$OUT/train.jsonl"
jq -r 'select(.record=="mfu_summary") | "  mt-mfu: \(.tflops_per_device * 1000 | round) GFLOP/s (\(.flops_convention) FLOPs), MFU \(.mfu * 1000 | round / 10)% of \(.peak_tflops * 1000 | round) GFLOP/s (\(.peak_source)); GEMM efficiency \(.gemm_efficiency * 1000 | round / 10)%"' "$OUT/mfu.jsonl"
jq -r 'select(.record=="memory_check") | "  mt-memreport: \(.category) predicted \(.predicted_bytes) bytes, measured \(.measured_bytes), error \(.error * 1000 | round / 10)%"' "$OUT/memreport.jsonl"
jq -r -s --argjson one "$(jq -s '[.[] | select(.record=="eval")][-1].lm_loss' "$OUT/train.jsonl")" '
  (.[0].parallel.data_parallel_size) as $dp | ([.[] | select(.record=="eval")][-1].lm_loss) as $two
  | ([.[] | select(.record=="summary")][0]) as $s
  | "  2 ranks (DP=\($dp), distributed optimizer): validation loss \($two * 1000 | round / 1000) (one rank: \($one * 1000 | round / 1000), relative difference \((($two - $one) / $one) | fabs * 1e9 | round / 1e9)), \($s.tokens_per_s | round) tokens/s"' \
  "$OUT/train-dp2.jsonl"
jq -r -s --arg status "$STOPPED" '[.[] | select(.record == "ckpt")][-1] as $c | ([.[] | select(.record == "summary")][0]) as $s
  | "  stopped by \($s.stopped_by // "nothing") after iteration \($c.iteration) (exit \($status)); saved \($c.bytes / 1e6 * 10 | round / 10) MB in \($c.seconds * 1000 | round) ms (\($c.mb_per_s | round) MB/s)"' \
  "$OUT/train-stopped.jsonl"
jq -r -s --argjson one "$(jq -s '[.[] | select(.record=="eval")][-1].lm_loss' "$OUT/train.jsonl")" '
  ([.[] | select(.record == "ckpt" and .event == "load")][0].iteration) as $from | ([.[] | select(.record=="eval")][-1].lm_loss) as $loss
  | "  resumed with --load from iteration \($from): validation loss \($loss * 1000 | round / 1000) at the end, \(if $loss == $one then "bit for bit" else "NOT" end) the uninterrupted run'"'"'s"' \
  "$OUT/train-resumed.jsonl"
echo "  TensorBoard: $(find "$OUT/tensorboard" -name 'events.out.tfevents.*' | wc -l) event file in $OUT/tensorboard; mt-plot: $OUT/training.svg, $OUT/memory.svg"
echo "  files in $OUT: bpe/, shakespeare_text_document.{h5,bin,idx}, index.h5, train.jsonl, mfu.jsonl,"
echo "    memreport.jsonl, tiny-gpt.h5, train-dp2.jsonl, ckpt/, train-stopped.jsonl, train-resumed.jsonl,"
echo "    tensorboard/, training.svg, memory.svg"
