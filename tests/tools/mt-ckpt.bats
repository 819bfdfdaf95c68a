#!/usr/bin/env bats
# mt-ckpt end to end on checkpoints mt-train writes: h5py reads every tensor by name and recomputes
# its checksum from the format's definition; inspect's records; verify accepts a good checkpoint and
# exits 3 naming the tensor for a changed value, a missing or foreign tensor, NaN/Inf.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
  H5PY="$BATS_TEST_DIRNAME/ckpt_h5py.py"
}

teardown() { rm -rf "$TMP"; }

# A resumable checkpoint of tiny-gpt at iteration 3 in $TMP/ck.
save_tiny() {
  mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
    --train-iters 3 --eval-iters 0 --peak-tflops 1 --save "$TMP/ck" "$@" >"$TMP/train.jsonl" 2>"$TMP/train.log" \
    || fail "mt-train: $(cat "$TMP/train.log")"
}

@test "h5py reads every tensor by name; its checksums, recomputed from the format's definition, match" {
  save_tiny
  run_split "$H5PY" check "$TMP/ck/iter_0000003/checkpoint.h5"
  [[ $status -eq 0 ]] || fail "$err"
  # 36 parameters and their two Adam moments; the tied output layer is not stored twice.
  printf '%s' "$out" | jq -e '.tensors == 108 and .state.iteration == 3 and .state.consumed_train_samples == 12
    and .state.mt_format_version == 2 and .hidden_size == 64 and .word_embeddings_shape == [128, 64]
    and (.names | index("optimizer/exp_avg/decoder.layers.1.mlp.linear_fc2.weight") != null)
    and (.names | map(select(startswith("model/output_layer"))) | length == 0)' >/dev/null || fail "$out"
}

@test "inspect: a checkpoint record with state and configs, one tensor record per tensor (file or --save directory)" {
  save_tiny --seed 77
  for path in "$TMP/ck" "$TMP/ck/iter_0000003/checkpoint.h5"; do
    run_split mt-ckpt inspect "$path"
    [[ $status -eq 0 ]] || fail "$err"
    printf '%s\n' "$out" >"$TMP/out.jsonl"
    jq -e -s '.[0].record == "run" and .[1].record == "checkpoint" and .[1].iteration == 3 and .[1].seed == 77
      and .[1].resumable and .[1].optimizer and .[1].optimizer_step == 3 and .[1].model.hidden_size == 64
      and .[1].train.train_iters == 3 and .[1].parallel.tensor_model_parallel_size == 1
      and ([.[] | select(.record == "tensor")] | length == 108)
      and ([.[] | select(.record == "tensor" and .name == "model/embedding.word_embeddings.weight")][0]
           | .shape == [128, 64] and .dtype == "float32" and .bytes == 32768 and (.checksum | test("^[0-9a-f]{16}$")))' \
      "$TMP/out.jsonl" >/dev/null || fail "$(head -c 600 "$TMP/out.jsonl")"
  done
  run_split mt-ckpt inspect "$TMP/ck" --format table
  [[ $status -eq 0 && "$out" == *"# tensor"* ]] || fail "$out"
}

@test "verify accepts a good checkpoint and exits 3 naming the tensor for each kind of damage" {
  save_tiny --no-save-optim
  local file="$TMP/ck/iter_0000003/checkpoint.h5"
  run_split mt-ckpt verify "$TMP/ck"
  [[ $status -eq 0 ]] || fail "$status $err"
  printf '%s\n' "$out" | jq -e -s '.[-1] | .record == "verify" and .ok and .tensors == 36 and .failed == 0' >/dev/null \
    || fail "$out"
  local name=model/decoder.layers.0.mlp.linear_fc1.weight
  for damage in value delete float64 reshape; do
    cp "$file" "$TMP/bad.h5"
    "$H5PY" corrupt "$TMP/bad.h5" "$damage" "$name"
    run_split mt-ckpt verify "$TMP/bad.h5"
    [[ $status -eq 3 ]] || fail "$damage: exit $status: $err"
    [[ "$err" == "mt-ckpt: verify: $TMP/bad.h5: 1 check(s) failed, first $name: "* ]] || fail "$damage: $err"
    printf '%s\n' "$out" | jq -e -s '.[-1].ok == false' >/dev/null || fail "$damage: $out"
  done
  # A NaN stored with a matching checksum is still found.
  cp "$file" "$TMP/nan.h5"
  /usr/bin/python3 - "$TMP/nan.h5" "$name" "$H5PY" <<'EOF'
import importlib.util, sys
import h5py, numpy as np
spec = importlib.util.spec_from_file_location("ckpt", sys.argv[3]); ckpt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ckpt)
with h5py.File(sys.argv[1], "r+") as f:
    values = f[sys.argv[2]][()]; values[0, 0] = np.nan; f[sys.argv[2]][()] = values
    f[sys.argv[2]].attrs["checksum"] = np.uint64(ckpt.checksum(values))
EOF
  run_split mt-ckpt verify "$TMP/nan.h5"
  [[ $status -eq 3 && "$err" == *"$name: 1 NaN/Inf values" ]] || fail "$status $err"
  # Not a checkpoint, or no tracker: exit 1 with one line.
  run_split mt-ckpt verify "$TMP/train.log"
  [[ $status -eq 1 && "$err" == "mt-ckpt: error: $TMP/train.log: cannot open as HDF5" ]] || fail "$status $err"
  run_split mt-ckpt inspect "$TMP"
  [[ $status -eq 1 && "$err" == "mt-ckpt: error: $TMP: holds neither $TMP/latest_checkpointed_iteration.txt nor a checkpoint.h5 (give a --save directory, an iter_NNNNNNN directory or a checkpoint file)" ]] || fail "$err"
  run_split mt-ckpt
  [[ $status -eq 2 && "$err" == "mt-ckpt: error: subcommand: one of inspect, verify, diff, convert, export, import is required"* ]] || fail "$status $err"
}

@test "diff: identical checkpoints pass; another iteration differs per tensor (exit 3) unless within --atol; one-sided and reshaped tensors are named" {
  save_tiny --save-interval 2
  run_split mt-ckpt diff "$TMP/ck" "$TMP/ck/iter_0000003/checkpoint.h5"
  [[ $status -eq 0 ]] || fail "$status $err"
  printf '%s\n' "$out" | jq -e -s '.[-1] | .record == "diff" and .ok and .compared == 108 and .differing == 0 and .max_abs == 0' \
    >/dev/null || fail "$out"
  local early="$TMP/ck/iter_0000002/checkpoint.h5" late="$TMP/ck/iter_0000003/checkpoint.h5"
  run_split mt-ckpt diff "$early" "$late"
  [[ $status -eq 3 && "$err" == "mt-ckpt: diff: "*" tensor(s) differ, first "*" elements beyond the tolerance" ]] || fail "$status $err"
  printf '%s\n' "$out" | jq -e -s '(.[-1] | .ok == false and .differing > 100 and .iteration_a == 2 and .iteration_b == 3)
    and ([.[] | select(.record == "tensor_diff" and .name == "model/embedding.word_embeddings.weight")][0]
         | .max_abs > 0 and .max_rel > 0 and .mismatched > 0 and .shape_a == [128, 64] and .dtype_a == "float32")' >/dev/null \
    || fail "$out"
  run_split mt-ckpt diff "$early" "$late" --atol 1 --format table
  [[ $status -eq 0 && "$out" == *"# tensor_diff"* ]] || fail "$status $err $out"
  local name=model/decoder.layers.0.mlp.linear_fc1.weight
  cp "$late" "$TMP/deleted.h5"
  "$H5PY" corrupt "$TMP/deleted.h5" delete "$name"
  run_split mt-ckpt diff "$late" "$TMP/deleted.h5"
  [[ $status -eq 3 && "$err" == *"1 tensor(s) differ, first $name: only in A" ]] || fail "$status $err"
  run_split mt-ckpt diff "$TMP/deleted.h5" "$late"
  [[ $status -eq 3 && "$err" == *"first $name: only in B" ]] || fail "$status $err"
  cp "$late" "$TMP/reshaped.h5"
  "$H5PY" corrupt "$TMP/reshaped.h5" reshape "$name"
  run_split mt-ckpt diff "$late" "$TMP/reshaped.h5"
  [[ $status -eq 3 && "$err" == *"first $name: shape differs" ]] || fail "$status $err"
  printf '%s\n' "$out" | jq -e -s --arg n "$name" '[.[] | select(.name == $n)][0] | .shape_a == [256, 64] and .shape_b == [64, 256]' \
    >/dev/null || fail "$out"
  run_split mt-ckpt diff "$late" "$late" --rtol -1
  [[ $status -eq 2 ]] || fail "$status $err"
}

@test "convert: bf16/fp16 parameters (h5py reads them), not resumable, within rounding of the original; --no-optim; never overwrites" {
  save_tiny
  local ckpt="$TMP/ck/iter_0000003/checkpoint.h5"
  run_split mt-ckpt convert "$TMP/ck" "$TMP/copy"
  [[ $status -eq 0 ]] || fail "$err"
  printf '%s\n' "$out" | jq -e -s '.[-1] | .record == "convert" and .tensors == 108 and .resumable and .optimizer' >/dev/null \
    || fail "$out"
  mt-ckpt diff "$TMP/ck" "$TMP/copy" >/dev/null || fail "an fp32 convert is not exact"
  [[ "$(cat "$TMP/copy/latest_checkpointed_iteration.txt")" == 3 ]] || fail "tracker"
  for dtype in bf16 fp16; do
    run_split mt-ckpt convert --dtype "$dtype" "$ckpt" "$TMP/$dtype.h5"
    [[ $status -eq 0 && "$err" == *"holds parameters only: not resumable"* ]] || fail "$dtype: $status $err"
    printf '%s\n' "$out" | jq -e -s '.[-1] | .record == "convert" and .tensors == 36 and .dropped == 72 and (.resumable | not)' \
      >/dev/null || fail "$out"
    run_split mt-ckpt verify "$TMP/$dtype.h5"
    [[ $status -eq 0 ]] || fail "$dtype verify: $err $out"
    run_split mt-ckpt inspect "$TMP/$dtype.h5"
    local stored
    stored=$(printf '%s\n' "$out" | jq -r 'select(.name == "model/embedding.word_embeddings.weight") | "\(.dtype) \(.bytes)"')
    [[ "$stored" == "$([[ $dtype == bf16 ]] && echo bfloat16 || echo float16) 16384" ]] || fail "$dtype: $stored"
    "$H5PY" check "$TMP/$dtype.h5" >/dev/null || fail "$dtype: h5py cannot read it"
    # Within half an ulp of the format (relative 2^-8 for bf16, 2^-11 for fp16, and fp16's subnormal step), not exact.
    local rtol
    rtol=$([[ $dtype == bf16 ]] && echo 0.00391 || echo 0.00049)
    run_split mt-ckpt diff "$TMP/$dtype.h5" "$ckpt" --rtol "$rtol" --atol 6e-8
    [[ $status -eq 3 && "$err" == *"only in B" ]] || fail "$dtype: the optimizer state should be only in B: $err"
    printf '%s\n' "$out" | jq -e -s '(.[-1].only_in_b == 72) and ([.[] | select(.record == "tensor_diff" and .only_in == null)]
      | length == 36 and all(.ok) and any(.max_abs > 0))' >/dev/null || fail "$dtype: $out"
  done
  # --finetune starts from it (the weights widened to fp32); a resume without --finetune is refused.
  mt-ckpt convert --dtype bf16 "$TMP/ck" "$TMP/bf16dir" >/dev/null 2>&1
  mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
    --train-iters 2 --eval-iters 0 --peak-tflops 1 --load "$TMP/bf16dir" --finetune >"$TMP/ft.jsonl" 2>"$TMP/ft.log" \
    || fail "finetune from bf16: $(cat "$TMP/ft.log")"
  run_split mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
    --train-iters 4 --eval-iters 0 --peak-tflops 1 --load "$TMP/bf16dir"
  [[ $status -eq 1 && "$err" == *"holds parameters only, not a run to resume"* ]] || fail "$status $err"
  run_split mt-ckpt convert --no-optim "$TMP/ck" "$TMP/noopt.h5"
  printf '%s\n' "$out" | jq -e -s '.[-1] | .tensors == 36 and .dtype == "float32" and (.resumable | not) and (.optimizer | not)' \
    >/dev/null || fail "$out"
  # Never an existing checkpoint: not the input, not another output.
  local before
  before=$(sha256sum "$ckpt")
  run_split mt-ckpt convert "$ckpt" "$ckpt"
  [[ $status -eq 2 && "$err" == "mt-ckpt: error: $ckpt: exists; mt-ckpt never overwrites a checkpoint"* && -z "$out" ]] \
    || fail "$status $err"
  run_split mt-ckpt convert "$TMP/ck" "$TMP/ck"
  [[ $status -eq 2 ]] || fail "$status $err"
  [[ "$(sha256sum "$ckpt")" == "$before" ]] || fail "the input changed"
  run_split mt-ckpt convert --dtype fp8 "$ckpt" "$TMP/x.h5"
  [[ $status -eq 2 && ! -e "$TMP/x.h5" ]] || fail "$status $err"
}

# Parameters only (--save-final) of PRESET flags after the name, at iteration 3, in $TMP/NAME.h5.
save_final() {
  local name="$1"
  shift
  mt-train --mock-data --seq-length 16 --micro-batch-size 2 --global-batch-size 4 --train-iters 3 --eval-iters 0 \
    --peak-tflops 1 --save-final "$TMP/$name.h5" "$@" >/dev/null 2>"$TMP/train.log" || fail "mt-train: $(cat "$TMP/train.log")"
}

# Two steps fine-tuned from $TMP/NAME.h5 under the flags after NAME, and from $TMP/imported.h5 under
# the mt_train_flags of the import record $TMP/import.jsonl, both at seed 5; each run's steps through
# the jq expression STEP go to FROM_ORIGINAL and FROM_IMPORT. Usage: finetune_both NAME STEP FLAGS...
finetune_both() {
  local name="$1" step="$2" source
  shift 2
  local flags=("$@")
  for source in "$name" imported; do
    [[ $source == imported ]] && read -ra flags <<<"$(jq -r -s '.[-1].mt_train_flags' "$TMP/import.jsonl")"
    mt-train "${flags[@]}" --mock-data --seq-length 16 --micro-batch-size 2 --global-batch-size 4 --train-iters 2 \
      --eval-iters 0 --peak-tflops 1 --seed 5 --load "$TMP/$source.h5" --finetune >"$TMP/$source.jsonl" \
      2>"$TMP/$source.log" || fail "$source: $(cat "$TMP/$source.log")"
  done
  FROM_ORIGINAL=$(jq -c -s "[.[] | select(.record == \"step\") | $step]" "$TMP/$name.jsonl")
  FROM_IMPORT=$(jq -c -s "[.[] | select(.record == \"step\") | $step]" "$TMP/imported.jsonl")
}

@test "export --format hf: config.json and a safetensors file an independent reader accepts, with transformers' names, layout and bytes" {
  save_final gpt --model tiny-gpt --vocab-size 97
  save_final llama --model tiny-llama --vocab-size 97 --group-query-attention --num-query-groups 2
  save_final gpt_untied --model tiny-gpt --vocab-size 97 --untie-embeddings-and-output-weights
  for name in gpt llama gpt_untied; do
    for dtype in fp32 bf16; do
      run_split mt-ckpt export --format hf --dtype "$dtype" "$TMP/$name.h5" "$TMP/$name-$dtype"
      [[ $status -eq 0 ]] || fail "$name $dtype: $err"
      printf '%s\n' "$out" | jq -e -s '.[-1] | .record == "export" and .format == "hf" and .tensors > 20' >/dev/null || fail "$out"
      run_split "$BATS_TEST_DIRNAME/safetensors_reader.py" check "$TMP/$name-$dtype/model.safetensors"
      [[ $status -eq 0 ]] || fail "$name $dtype: $err"
      printf '%s' "$out" | jq -e --arg d "$([[ $dtype == fp32 ]] && echo F32 || echo BF16)" \
        '.metadata.format == "pt" and .header_size % 8 == 0 and ([.tensors[] | .dtype] | all(. == $d))' >/dev/null || fail "$out"
      run_split "$BATS_TEST_DIRNAME/safetensors_reader.py" compare "$TMP/$name-$dtype/model.safetensors" "$TMP/$name.h5"
      [[ $status -eq 0 ]] || fail "$name $dtype: $err"
    done
  done
  local header
  header=$("$BATS_TEST_DIRNAME/safetensors_reader.py" check "$TMP/gpt-fp32/model.safetensors")
  printf '%s' "$header" | jq -e '.tensors["transformer.wte.weight"].shape == [97, 64]
    and .tensors["transformer.h.1.attn.c_attn.weight"].shape == [64, 192]
    and .tensors["transformer.h.0.mlp.c_fc.weight"].shape == [64, 256] and (.tensors["lm_head.weight"] == null)' >/dev/null \
    || fail "$header"
  jq -e '.architectures == ["GPT2LMHeadModel"] and .vocab_size == 97 and .n_embd == 64 and .activation_function == "gelu_new"
    and .tie_word_embeddings and .torch_dtype == "float32"' "$TMP/gpt-fp32/config.json" >/dev/null \
    || fail "$(cat "$TMP/gpt-fp32/config.json")"
  jq -e '.architectures == ["LlamaForCausalLM"] and .num_key_value_heads == 2 and .hidden_act == "silu"
    and (.tie_word_embeddings | not) and .torch_dtype == "bfloat16"' "$TMP/llama-bf16/config.json" >/dev/null \
    || fail "$(cat "$TMP/llama-bf16/config.json")"
  jq -e '.tie_word_embeddings == false' "$TMP/gpt_untied-fp32/config.json" >/dev/null || fail "untied"
  # Refusals: another format, a model no HF architecture matches.
  run_split mt-ckpt export --format gguf "$TMP/gpt.h5" "$TMP/x"
  [[ $status -eq 2 && ! -e "$TMP/x" ]] || fail "$status $err"
  save_final mixed --model tiny-gpt --vocab-size 97 --swiglu
  run_split mt-ckpt export --format hf "$TMP/mixed.h5" "$TMP/x"
  [[ $status -eq 2 && "$err" == *"no Hugging Face architecture matches"* && ! -e "$TMP/x/model.safetensors" ]] || fail "$status $err"
}

@test "import --format hf of an export: bit-identical parameters, pad rows zero; mt-train --finetune from it trains the same losses" {
  save_tiny
  local ckpt="$TMP/ck/iter_0000003/checkpoint.h5"
  mt-ckpt export --format hf "$TMP/ck" "$TMP/hf" >/dev/null || fail "export"
  run_split mt-ckpt import --format hf "$TMP/hf" "$TMP/imported"
  [[ $status -eq 0 ]] || fail "$err"
  printf '%s\n' "$out" | jq -e -s '.[-1] | .record == "import" and .tensors == 36 and .ignored == [] and (.resumable | not)
    and .model.vocab_size == 97 and (.mt_train_flags | test("--vocab-size 97"))' >/dev/null || fail "$out"
  mt-ckpt verify "$TMP/imported" >/dev/null || fail "the import does not verify"
  /usr/bin/python3 - "$ckpt" "$TMP/imported/iter_0000000/checkpoint.h5" <<'PY' || fail "the import differs from the original"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r")["model"], h5py.File(sys.argv[2], "r")["model"]
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
for name in a:
    x, y = a[name][()], b[name][()]
    if name == "embedding.word_embeddings.weight":
        assert not y[97:].any(), "pad rows not zero"
        x, y = x[:97], y[:97]
    assert x.dtype == y.dtype == np.float32 and np.array_equal(x.view(np.uint32), y.view(np.uint32)), name
PY
  # The pad rows are outside the softmax: fine-tuning from the import or from the original gives the same losses.
  local source
  for source in ck imported; do
    mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
      --train-iters 3 --eval-iters 0 --peak-tflops 1 --seed 5 --load "$TMP/$source" --finetune >"$TMP/$source.jsonl" \
      2>"$TMP/$source.log" || fail "$source: $(cat "$TMP/$source.log")"
  done
  local original imported
  original=$(jq -c -s '[.[] | select(.record == "step") | .lm_loss]' "$TMP/ck.jsonl")
  imported=$(jq -c -s '[.[] | select(.record == "step") | .lm_loss]' "$TMP/imported.jsonl")
  [[ "$original" == "$imported" && "$original" == "["*","*","*"]" ]] || fail "$original vs $imported"
  # An existing output, a directory without config.json, a model mt cannot represent: refused.
  run_split mt-ckpt import --format hf "$TMP/hf" "$TMP/imported"
  [[ $status -eq 2 && "$err" == *"exists; mt-ckpt never overwrites"* ]] || fail "$status $err"
  run_split mt-ckpt import --format hf "$TMP/ck" "$TMP/none.h5"
  [[ $status -eq 1 && "$err" == "mt-ckpt: error: $TMP/ck/config.json: cannot open"* && ! -e "$TMP/none.h5" ]] || fail "$status $err"
  jq '.activation_function = "relu"' "$TMP/hf/config.json" >"$TMP/relu.json"
  mv "$TMP/relu.json" "$TMP/hf/config.json"
  run_split mt-ckpt import --format hf "$TMP/hf" "$TMP/relu.h5"
  [[ $status -eq 2 && "$err" == *"config.json: activation_function is relu"* && ! -e "$TMP/relu.h5" ]] || fail "$status $err"
}

@test "export/import --format hf of tiny-mixtral: MixtralForCausalLM names an independent reader checks, bit-identical import, mt-train --finetune from its mt_train_flags trains the same losses; other routers refused by flag" {
  save_final mixtral --model tiny-mixtral --vocab-size 97
  run_split mt-ckpt export --format hf "$TMP/mixtral.h5" "$TMP/hf"
  [[ $status -eq 0 ]] || fail "$err"
  printf '%s\n' "$out" | jq -e -s '.[-1] | .architecture == "MixtralForCausalLM" and .tensors == 65' >/dev/null || fail "$out"
  run_split "$BATS_TEST_DIRNAME/safetensors_reader.py" compare "$TMP/hf/model.safetensors" "$TMP/mixtral.h5"
  [[ $status -eq 0 ]] || fail "$err"
  jq -e '.architectures == ["MixtralForCausalLM"] and .num_local_experts == 8 and .num_experts_per_tok == 2
    and .intermediate_size == 32 and .router_aux_loss_coef == 0.01' "$TMP/hf/config.json" >/dev/null || fail "$(cat "$TMP/hf/config.json")"
  run_split mt-ckpt import --format hf "$TMP/hf" "$TMP/imported.h5"
  [[ $status -eq 0 ]] || fail "$err"
  printf '%s\n' "$out" >"$TMP/import.jsonl"
  jq -e -s '.[-1] | .tensors == 65 and .ignored == []' "$TMP/import.jsonl" >/dev/null || fail "$out"
  /usr/bin/python3 - "$TMP/mixtral.h5" "$TMP/imported.h5" <<'PY' || fail "the import differs from the original"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r")["model"], h5py.File(sys.argv[2], "r")["model"]
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
for name in a:
    x, y = a[name][()], b[name][()]
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        assert not y[97:].any(), "pad rows not zero"
        x, y = x[:97], y[:97]
    assert np.array_equal(x.view(np.uint32), y.view(np.uint32)), name
PY
  # The original under its own flags, the import under its record's mt_train_flags (tiny-mixtral's
  # unused dense --ffn-hidden-size 176 is not in config.json: the import's is the experts' 32).
  finetune_both mixtral '.lm_loss' --model tiny-mixtral --vocab-size 97
  [[ "$FROM_ORIGINAL" == "$FROM_IMPORT" && "$FROM_ORIGINAL" == "["*","*"]" ]] || fail "$FROM_ORIGINAL vs $FROM_IMPORT"
  save_final presoftmax --model tiny-mixtral --vocab-size 97 --moe-router-pre-softmax
  run_split mt-ckpt export --format hf "$TMP/presoftmax.h5" "$TMP/x"
  [[ $status -eq 2 && "$err" == *"--moe-router-pre-softmax has no Hugging Face export"* && ! -e "$TMP/x/model.safetensors" ]] \
    || fail "$status $err"
}

@test "issue22: export/import --format hf of a trained DeepSeek-V3-shaped model with MTP: DeepseekV3ForCausalLM config and names, bit-identical import (expert biases too), mt-train --finetune from its mt_train_flags trains the same losses" {
  local model=(--model tiny-deepseek --moe-router-topk 4 --mtp-num-layers 1 --vocab-size 97)
  save_final deepseek "${model[@]}"
  run_split mt-ckpt export --format hf "$TMP/deepseek.h5" "$TMP/hf"
  [[ $status -eq 0 ]] || fail "$err"
  printf '%s\n' "$out" | jq -e -s '.[-1].architecture == "DeepseekV3ForCausalLM"' >/dev/null || fail "$out"
  jq -e '.architectures == ["DeepseekV3ForCausalLM"] and .model_type == "deepseek_v3" and .first_k_dense_replace == 1
    and .n_routed_experts == 8 and .num_experts_per_tok == 4 and .n_group == 4 and .topk_group == 2
    and .n_shared_experts == 1 and .routed_scaling_factor == 2.5 and .num_nextn_predict_layers == 1
    and .q_lora_rank == 32 and .kv_lora_rank == 16 and .qk_nope_head_dim == 16 and .qk_rope_head_dim == 8' \
    "$TMP/hf/config.json" >/dev/null || fail "$(cat "$TMP/hf/config.json")"
  /usr/bin/python3 - "$TMP/hf/model.safetensors" <<'PY' || fail "the export's MTP layer"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
for name in ("enorm", "hnorm", "eh_proj", "shared_head.norm", "shared_head.head", "embed_tokens", "mlp.gate.e_score_correction_bias"):
    assert "model.layers.2.%s.weight" % name in header or "model.layers.2.%s" % name in header, name
assert header["model.layers.2.eh_proj.weight"]["shape"] == [64, 128], header["model.layers.2.eh_proj.weight"]
PY
  run_split mt-ckpt import --format hf "$TMP/hf" "$TMP/imported.h5"
  [[ $status -eq 0 ]] || fail "$err"
  printf '%s\n' "$out" >"$TMP/import.jsonl"
  jq -e -s '.[-1] | .ignored == []' "$TMP/import.jsonl" >/dev/null || fail "$out"
  /usr/bin/python3 - "$TMP/deepseek.h5" "$TMP/imported.h5" <<'PY' || fail "the import differs from the original"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r")["model"], h5py.File(sys.argv[2], "r")["model"]
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
assert "decoder.layers.2.mlp.router.expert_bias" in a
for name in a:
    x, y = a[name][()], b[name][()]
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        assert not y[97:].any(), "pad rows not zero"
        x, y = x[:97], y[:97]
    assert np.array_equal(x.view(np.uint32), y.view(np.uint32)), name
PY
  finetune_both deepseek '[.lm_loss, .mtp_1_loss]' "${model[@]}"
  [[ "$FROM_ORIGINAL" == "$FROM_IMPORT" && "$FROM_ORIGINAL" == "[["*","*"]]" ]] || fail "$FROM_ORIGINAL vs $FROM_IMPORT"
  save_final groups --model tiny-deepseek --vocab-size 97
  run_split mt-ckpt export --format hf "$TMP/groups.h5" "$TMP/x"
  [[ $status -eq 2 && "$err" == *"--moe-router-group-topk 2 has no Hugging Face export"* && ! -e "$TMP/x/model.safetensors" ]] \
    || fail "$status $err"
}

@test "import --format hf of GPT-2's default dropouts (attn_pdrop, resid_pdrop, embd_pdrop 0.1): taken into mt_train_flags, and mt-train runs them" {
  save_tiny
  mt-ckpt export --format hf "$TMP/ck" "$TMP/hf" >/dev/null || fail "export"
  jq '.attn_pdrop = 0.1 | .resid_pdrop = 0.1 | .embd_pdrop = 0.1' "$TMP/hf/config.json" >"$TMP/gpt2.json"
  mv "$TMP/gpt2.json" "$TMP/hf/config.json"
  run_split mt-ckpt import --format hf "$TMP/hf" "$TMP/imported"
  [[ $status -eq 0 ]] || fail "$err"
  local flags
  flags=$(printf '%s\n' "$out" | jq -r -s '.[-1].mt_train_flags')
  [[ "$flags" == *"--hidden-dropout 0.1 --attention-dropout 0.1"* ]] || fail "$flags"
  # shellcheck disable=SC2086
  mt-train $flags --mock-data --seq-length 16 --micro-batch-size 2 --global-batch-size 4 --train-iters 2 \
    --eval-iters 0 --peak-tflops 1 --load "$TMP/imported" --finetune >"$TMP/train.jsonl" 2>"$TMP/train.log" ||
    fail "$(cat "$TMP/train.log")"
  jq -e -s '[.[] | select(.record == "step") | .lm_loss | isfinite] == [true, true]' "$TMP/train.jsonl" >/dev/null ||
    fail "$(cat "$TMP/train.jsonl")"
}

@test "--help of every subcommand says what it does and its options" {
  local command
  for command in inspect verify diff convert export import; do
    run_split mt-ckpt "$command" --help
    [[ $status -eq 0 ]] || fail "$command --help: $status"
  done
  [[ "$(mt-ckpt diff --help)" == *"--atol"*"--rtol"*"defaults 0 and 0"* ]] || fail "diff help"
  [[ "$(mt-ckpt convert --help)" == *"--dtype"*"--no-optim"*"not resumable"*"fp32 master weights"* ]] || fail "convert help"
  [[ "$(mt-ckpt export --help)" == *"GPT2LMHeadModel"*"LlamaForCausalLM"*"pad rows are dropped"* ]] || fail "export help"
  [[ "$(mt-ckpt import --help)" == *"--finetune"* ]] || fail "import help"
  [[ "$(mt-ckpt --help)" != *"Not built yet"* ]] || fail "the top-level help still says not built"
}

@test "import --format hf of transformers' default GPT2Config and LlamaConfig models: dropouts in mt_train_flags; with dropout off mt-train gives transformers' loss, grad norm and loss after one step" {
  # tests/golden/hf/default-config: GPT2LMHeadModel(GPT2Config()) and LlamaForCausalLM(LlamaConfig(
  # attention_dropout=0.1)), sizes shrunk, saved by transformers; losses.json holds transformers'
  # loss on the periodic sequence, the gradient norm and the loss after one AdamW step
  # (make_default_config_goldens.sh).
  local golden="$MT_ROOT/tests/golden/hf/default-config" name flags got key
  # One document without EOD: the period repeated; every sample mt cuts from it is the same tokens.
  "$BATS_TEST_DIRNAME/make_token_dataset.py" "$TMP/periodic" h5 "$(jq '.shrunk.gpt2.vocab_size' "$golden/losses.json")" -1 \
    "$(jq -c '[[[range(64) as $i | .period[]]]]' "$golden/losses.json")"
  for name in gpt2 llama; do
    run_split mt-ckpt import --format hf "$golden/$name" "$TMP/$name"
    [[ $status -eq 0 ]] || fail "$name: $err"
    flags=$(printf '%s\n' "$out" | jq -r -s '.[-1].mt_train_flags')
    case $name in
      gpt2) [[ "$flags" == *"--hidden-dropout 0.1 --attention-dropout 0.1" ]] || fail "$name: $flags" ;;
      llama) [[ "$flags" == *"--hidden-dropout 0 --attention-dropout 0.1" ]] || fail "$name: $flags" ;;
    esac
    flags="${flags% --hidden-dropout *} --hidden-dropout 0 --attention-dropout 0"
    # Step 2's lm_loss is the loss after step 1's update (its lr is 1e-4 under the linear decay).
    # Adam's first step is nearly sign(gradient) * lr: it checks the gradients' signs and the lr
    # (1.1e-4 fails), not the clipping (scale-free) nor weight decay (a 1e-6 shrink, under tolerance).
    # shellcheck disable=SC2086
    mt-train $flags --data-path "$TMP/periodic" --data-cache-path "$TMP/cache-$name" \
      --seq-length "$(jq '.seq_length' "$golden/losses.json")" --micro-batch-size 1 --global-batch-size 1 \
      --lr 1e-4 --weight-decay 0.01 --clip-grad 1 --adam-beta1 0.9 --adam-beta2 0.999 --adam-eps 1e-8 \
      --train-iters 2 --eval-iters 0 --peak-tflops 1 --load "$TMP/$name" --finetune >"$TMP/$name.jsonl" 2>"$TMP/$name.log" ||
      fail "$name: $(cat "$TMP/$name.log")"
    got=$(jq -s -c '[.[] | select(.record == "step")] | {loss: .[0].lm_loss, grad_norm: .[0].grad_norm, loss_after_step: .[1].lm_loss}' \
      "$TMP/$name.jsonl")
    # fp32 on both sides, values near ln(96) and 3-4: 1e-5 relative is tens of float ulps of slack
    # for the different summation orders (measured under 1e-7), far below what a wrong weight,
    # mask or dropout changes.
    for key in loss grad_norm loss_after_step; do
      jq -n -e --argjson got "$got" --slurpfile golden "$golden/losses.json" --arg name "$name" --arg key "$key" \
        '($golden[0][$key][$name]) as $want | (($got[$key] - $want) | fabs) <= 1e-5 * ($want | fabs)' >/dev/null ||
        fail "$name $key: mt $(jq -c ".$key" <<<"$got"), transformers $(jq ".$key.$name" "$golden/losses.json")"
    done
  done
}
