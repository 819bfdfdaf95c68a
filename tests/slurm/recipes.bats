#!/usr/bin/env bats
# The recipes without a cluster: every full-scale recipe's mt-train line passes `mt-train --dry-run`
# for its published layout and world size (MT_DRY_RUN=1; a layout that does not fit the published
# GPU at mt's memory is refused naming the memory and passes on the GPU its NEEDS_GPU names); tiny
# mode keeps every degree that fits in 32 ranks and otherwise lowers PP, printing what changed; the
# suite drivers submit one job per row with that row's resources and refuse by name the FSDP and
# BERT rows mt-train refuses at full scale (a run on CUDA), while those rows dry-run on the CPU
# table against the published GPU's memory (BERT-345M and its SP rows on V100s, the FSDP rows with
# optim_grads_params on H200s) and, in tiny mode, are submitted. The runs under Slurm are
# tests/slurm/slurm.bats.

setup() {
  load ../tools/common
  mt_load_libs
  TMP="$(mktemp -d)"
  export MT_OUT="$TMP/out" MT_BIN
  unset MT_SCALE MT_GPU SLURM_JOB_ID
}

teardown() { rm -rf "$TMP"; }

RECIPES=(llama8b_cp2 llama70b_tp4_pp4 llama405b_tp8_pp8 gpt3_175b_tp4_pp8 gpt_177b_weak_scaling)

# The value of VAR= in a recipe's configuration lines.
recipe_var() { grep -o "\b$2=[^ ]*" "$MT_ROOT/recipes/$1.sh" | head -1 | cut -d= -f2; }

@test "every full-scale recipe passes mt-train --dry-run at its published layout and world size" {
  for recipe in "${RECIPES[@]}"; do
    local world needs
    world="$(recipe_var "$recipe" WORLD)" needs="$(recipe_var "$recipe" NEEDS_GPU)"
    run_split env MT_DRY_RUN=1 bash "$MT_ROOT/recipes/$recipe.sh"
    if [[ -z "$needs" ]]; then
      [[ $status -eq 0 ]] || fail "$recipe: exited $status: $err"
      jq -e -s --argjson w "$world" 'length == 1 and (.[0] | .record == "dry_run" and .verdict == "runs" and .world_size == $w and .device == "cuda")' <<<"$out" >/dev/null \
        || fail "$recipe: $out"
    else
      [[ $status -eq 2 ]] || fail "$recipe: fits the published GPU, but declares NEEDS_GPU=$needs: $err"
      jq -e -s 'length == 1 and (.[0] | .verdict == "refused" and (.reason | test("needs .* GiB .* but only .* GiB is available")))' <<<"$out" >/dev/null \
        || fail "$recipe: refused for another reason: $out"
      run_split env MT_DRY_RUN=1 MT_GPU="$needs" bash "$MT_ROOT/recipes/$recipe.sh"
      [[ $status -eq 0 ]] && jq -e -s 'length == 1 and .[0].verdict == "runs"' <<<"$out" >/dev/null || fail "$recipe on $needs: exited $status: $err"
    fi
  done
}

@test "every row of the suites passes mt-train --dry-run (BERT's SP rows and the FSDP rows too) but two FSDP-study rows mt's memory does not fit; at full scale BERT and FSDP rows are refused by name" {
  # Two of the FSDP study's 14 rows do not fit an H200 at mt's memory, and the dry run says so:
  # fsdp-7b-1gpu (fp32 master weights and grads and Adam's fp32 moments, where the study keeps bf16
  # parameters and AdamW states) and fsdp-13b-fsdp8 (planned on the CPU table, whose GEMM copy of
  # bf16 weights is fp32-sized and whole, beside 49 GiB of activations at micro-batch 4).
  run_split env MT_DRY_RUN=1 bash "$MT_ROOT/recipes/fsdp_tp_scaling.sh"
  [[ $status -eq 2 && "$(grep -c '"verdict":"runs"' <<<"$out")" -eq 12 ]] || fail "exited $status: $out $err"
  [[ "$(grep -c 'dry run exit 2' <<<"$err")" -eq 2 && "$err" == *"fsdp-7b-1gpu: dry run exit 2"* &&
     "$err" == *"fsdp-13b-fsdp8: dry run exit 2"* && "$err" == *"but only 141.00 GiB is available"* ]] || fail "$err"
  ! grep -q ': refused: ' <<<"$err" || fail "a row refused: $err"
  # The 11 FSDP rows: optim_grads_params with overlapped reduce-scatters over the row's DP ranks,
  # planned on the CPU table (no CUDA path yet) for H200s, the 70B one fitting (its shard, not
  # the whole model's weights and grads, is counted).
  jq -e -s '[.[] | select(.parallel.use_megatron_fsdp)] | length == 11 and all(.device == "cpu"
    and .parallel.data_parallel_sharding_strategy == "optim_grads_params" and .parallel.overlap_grad_reduce
    and (.memory.checked_against | startswith("h200")))
    and any(.model.name == "llama3-70b" and .world_size == 32 and .parallel.data_parallel_size == 8 and .verdict == "runs")' \
    <<<"$out" >/dev/null \
    || fail "$(jq -c '[.model.name, .device, .world_size, .parallel.use_megatron_fsdp, .verdict, .memory.per_rank.total_bytes]' <<<"$out")"
  run_split env MT_DRY_RUN=1 bash "$MT_ROOT/recipes/gpt_bert_345m_recompute.sh"
  [[ $status -eq 0 && "$(grep -c '"verdict":"runs"' <<<"$out")" -eq 80 ]] || fail "exited $status: $err"
  ! grep -q ': refused: ' <<<"$err" || fail "a row refused: $err"
  # BERT's 40 rows, the 16 SP rows among them: BERT-345M at its layouts, planned on the CPU table for 8 V100s.
  jq -e -s '[.[] | select(.model.bert == true)] | length == 40 and all(.model.name == "bert-345m" and .device == "cpu"
    and .world_size == 8 and (.memory.checked_against | startswith("v100-sxm")))
    and ([.[] | select(.parallel.sequence_parallel)] | length == 16)
    and ([.[] | select(.train.recompute_granularity == "full")] | length == 8)
    and ([.[] | .parallel.tensor_model_parallel_size] | unique == [2, 4])' <<<"$out" >/dev/null \
    || fail "$(jq -c 'select(.model.bert) | [.model.name, .device, .parallel.tensor_model_parallel_size, .parallel.sequence_parallel, .train.recompute_granularity]' <<<"$out")"
  run_split bash "$MT_ROOT/recipes/gpt_bert_345m_recompute.sh" bert-tp2pp2-s512-baseline
  [[ $status -eq 2 && "$err" == *"bert-tp2pp2-s512-baseline: refused: mt-train refuses BERT with --device cuda"* ]] || fail "$status $err"
  run_split bash "$MT_ROOT/recipes/fsdp_tp_scaling.sh" fsdp-7b-fsdp2
  [[ $status -eq 2 && "$err" == "fsdp_tp_scaling: fsdp-7b-fsdp2: refused: mt-train refuses FSDP's grad sharding with --device cuda"* ]] || fail "$status $err"
  run_split bash "$MT_ROOT/recipes/fsdp_tp_scaling.sh" fsdp-9b
  [[ $status -eq 2 && "$err" == "fsdp_tp_scaling: fsdp-9b: no such row (data/perf/published_runs.csv's fsdp-* rows)" ]] || fail "$status $err"
  run_split bash "$MT_ROOT/recipes/gpt_bert_345m_recompute.sh" gpt-tp2pp2-s512-full
  [[ $status -eq 2 && "$err" == *"gpt-tp2pp2-s512-full: no such row"* ]] || fail "$status $err"
}

@test "the suite drivers submit one job per row with that row's resources" {
  printf '#!/bin/bash\necho "$*" >>%q\necho 77\n' "$TMP/submitted" >"$TMP/sbatch"
  chmod +x "$TMP/sbatch"
  run_split env MT_SBATCH="$TMP/sbatch" bash "$MT_ROOT/recipes/fsdp_tp_scaling.sh" fsdp-7b-tp4 fsdp-7b-tp2 fsdp-7b-fsdp4
  [[ $status -eq 0 && "$out" == $'fsdp_tp_scaling: fsdp-7b-tp4: 77\nfsdp_tp_scaling: fsdp-7b-tp2: 77' ]] || fail "$status $out $err"
  [[ "$err" == *"fsdp-7b-fsdp4: refused: mt-train refuses FSDP's grad sharding with --device cuda"* ]] || fail "$err"
  grep -q -- '--nodes=1 --ntasks=4 --ntasks-per-node=4 --gpus-per-node=4 .*--export=ALL,MT_ROW=fsdp-7b-tp4,' "$TMP/submitted" || fail "$(cat "$TMP/submitted")"
  grep -q -- '--nodes=1 --ntasks=2 --ntasks-per-node=2 --gpus-per-node=2 .*--export=ALL,MT_ROW=fsdp-7b-tp2,' "$TMP/submitted" || fail "$(cat "$TMP/submitted")"
  : >"$TMP/submitted"
  run_split env MT_SCALE=tiny MT_SBATCH="$TMP/sbatch" bash "$MT_ROOT/recipes/fsdp_tp_scaling.sh" fsdp-7b-fsdp4 fsdp-13b-tp4-fsdp8
  [[ $status -eq 0 ]] && grep -q -- '--nodes=1 --ntasks=4 --cpus-per-task=1 .*MT_ROW=fsdp-7b-fsdp4,' "$TMP/submitted" \
    && grep -q -- '--nodes=1 --ntasks=32 --cpus-per-task=1 .*MT_ROW=fsdp-13b-tp4-fsdp8,' "$TMP/submitted" \
    && [[ "$(wc -l <"$TMP/submitted")" -eq 2 ]] || fail "$status $err $(cat "$TMP/submitted")"
  : >"$TMP/submitted"
  run_split env MT_SCALE=tiny MT_SBATCH="$TMP/sbatch" bash "$MT_ROOT/recipes/gpt_bert_345m_recompute.sh" gpt-tp8pp1-s2048-sp \
    bert-tp4pp2-s512-full bert-tp2pp2-s512-sp
  [[ $status -eq 0 ]] && grep -q -- '--nodes=1 --ntasks=8 --cpus-per-task=1 .*MT_ROW=gpt-tp8pp1-s2048-sp,' "$TMP/submitted" \
    && grep -q -- '--nodes=1 --ntasks=8 --cpus-per-task=1 .*MT_ROW=bert-tp4pp2-s512-full,' "$TMP/submitted" \
    || fail "$status $err $(cat "$TMP/submitted")"
  grep -q -- '--nodes=1 --ntasks=8 --cpus-per-task=1 .*MT_ROW=bert-tp2pp2-s512-sp,' "$TMP/submitted" \
    && [[ "$(wc -l <"$TMP/submitted")" -eq 3 ]] || fail "$err $(cat "$TMP/submitted")"
}

# The layout tiny mode gives a recipe: its message and TP PP CP DP RANKS.
tiny_layout_of() {
  (
    RECIPE=test WORLD=$1 TP=$2 PP=$3 CP=$4
    source "$MT_ROOT/recipes/common.sh"
    tiny_layout
    echo "$TP $PP $CP $DP $RANKS"
  )
}

@test "tiny mode keeps every degree that fits in 32 ranks, else keeps TP and CP and lowers PP, printing what changed" {
  run_split tiny_layout_of 8 1 1 2
  [[ "$out" == "1 1 2 4 8" && "$err" == *"keeps the published layout (TP 1 PP 1 CP 2 DP 4 on 8 ranks)" ]] || fail "$out $err"
  run_split tiny_layout_of 64 4 4 2
  [[ "$out" == "4 4 2 1 32" && "$err" == *"DP 2 -> 1 (TP 4 and CP 2 kept; 32 ranks)" ]] || fail "$out $err"
  run_split tiny_layout_of 1024 8 8 2
  [[ "$out" == "8 2 2 1 32" && "$err" == *"PP 8 -> 2 DP 8 -> 1 (TP 8 and CP 2 kept; 32 ranks)" ]] || fail "$out $err"
  run_split tiny_layout_of 2304 8 6 1
  [[ "$out" == "8 4 1 1 32" && "$err" == *"PP 6 -> 4 DP 48 -> 1"* ]] || fail "$out $err"
}
