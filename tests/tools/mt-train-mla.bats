#!/usr/bin/env bats
# mt-train with multi-latent attention (issue 22): tiny-deepseek trains and records its MLA fields,
# Megatron's MLA flags and defaults reach the model, and what MLA excludes is refused by name.
# The layer's numbers are tested in tests/unit/model/test_mla.cpp, test_mla_megatron.cpp and
# tests/mpi/test_mla_training.cpp.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
}

teardown() { rm -rf "$TMP"; }

check() {
  jq -e -s "$1" "$TMP/out.jsonl" >/dev/null || fail "jq '$1' is false for: $(cat "$TMP/out.jsonl" "$TMP/err.log")"
}

@test "issue22: tiny-deepseek (MLA, dense first layer, sigmoid routing with expert bias) trains on one rank" {
  head -c 60000 "$MT_ROOT/data/demo/tinyshakespeare.txt" >"$TMP/text.txt"
  mt-train --model tiny-deepseek --byte-data "$TMP/text.txt" --micro-batch-size 4 --global-batch-size 8 \
    --train-iters 12 --lr 3e-3 --lr-warmup-iters 2 --eval-iters 0 --log-interval 6 --peak-tflops 1 \
    >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  check '.[0].model.multi_latent_attention and .[0].model.q_lora_rank == 32 and .[0].model.kv_lora_rank == 16 and .[0].model.qk_layernorm'
  check '[.[] | select(.record=="step")] | length == 12'
  check '[.[] | select(.record=="step")] | (.[0].lm_loss - .[-1].lm_loss) > 0.5'
  check '[.[] | select(.record=="step")][0].moe_layers | map(.layer) == [1]'
}

@test "issue22: --multi-latent-attention takes Megatron's defaults (kv-lora-rank 32, qk 128 + 64, v 128, no q compression); the flags set them" {
  base=(mt-train --model tiny-llama --num-query-groups 4 --group-query-attention --mock-data --vocab-size 97
    --seq-length 16 --micro-batch-size 2 --global-batch-size 2 --train-iters 1 --eval-iters 0 --peak-tflops 1)
  "${base[@]}" --multi-latent-attention >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  check '.[0].model | .multi_latent_attention and .q_lora_rank == 0 and .kv_lora_rank == 32 and .qk_head_dim == 128 and .qk_pos_emb_head_dim == 64 and .v_head_dim == 128 and (.qk_layernorm | not)'
  "${base[@]}" --multi-latent-attention --q-lora-rank 12 --kv-lora-rank 10 --qk-head-dim 6 --qk-pos-emb-head-dim 4 \
    --v-head-dim 8 --qk-layernorm >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  check '.[0].model | .q_lora_rank == 12 and .kv_lora_rank == 10 and .qk_head_dim == 6 and .qk_pos_emb_head_dim == 4 and .v_head_dim == 8 and .qk_layernorm'
}

@test "issue22: MLA plans under context parallelism; it refuses --qk-layernorm without MLA and an odd RoPE part, by name" {
  run mt-train --model tiny-deepseek --mock-data --seq-length 16 --train-iters 1 --dry-run --world-size 2 \
    --context-parallel-size 2
  [[ $status -eq 0 ]] || fail "status $status: $output"
  run mt-train --model tiny-llama --mock-data --qk-layernorm --train-iters 1
  [[ $status -eq 2 ]] || fail "status $status: $output"
  [[ "$output" == *"--qk-layernorm"*"--multi-latent-attention only"* ]] || fail "$output"
  run mt-train --model tiny-deepseek --mock-data --qk-pos-emb-head-dim 5 --train-iters 1
  [[ $status -eq 2 ]] || fail "status $status: $output"
  [[ "$output" == *"--qk-pos-emb-head-dim"*"even"* ]] || fail "$output"
}

@test "issue22: YaRN (MLA only): --rope-type yarn and its flags reach the model record; yarn without MLA is refused by name, on CUDA planned" {
  base=(mt-train --model tiny-deepseek --mock-data --seq-length 16 --micro-batch-size 2 --global-batch-size 2
    --train-iters 1 --eval-iters 0 --peak-tflops 1)
  "${base[@]}" --rope-type yarn --rotary-scaling-factor 40 --mscale 1.0 --mscale-all-dim 1.0 \
    --yarn-original-max-position-embeddings 64 >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  check '.[0].model | .rope_type == "yarn" and .rotary_scaling_factor == 40 and .mscale_all_dim == 1 and .original_max_position_embeddings == 64 and .yarn_beta_fast == 32 and .yarn_beta_slow == 1'
  check '[.[] | select(.record=="step")][0].lm_loss | isfinite'
  run mt-train --model tiny-llama --mock-data --rope-type yarn --train-iters 1
  [[ $status -eq 2 ]] || fail "status $status: $output"
  [[ "$output" == *"--rope-type yarn"*"needs --multi-latent-attention"* ]] || fail "$output"
  # CUDA runs YaRN (issue 23): the dry run plans it instead of refusing it.
  run "${base[@]}" --rope-type yarn --dry-run --world-size 1 --device cuda --peak-device H100
  [[ $status -eq 0 ]] || fail "status $status: $output"
  [[ "$output" == *'"verdict":"runs"'* && "$output" != *"not supported yet"* ]] || fail "$output"
  "${base[@]}" --rope-type rope >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  check '.[0].model.rope_type == "rope"'
}
