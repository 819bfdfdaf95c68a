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
  [[ $status -eq 1 && "$err" == "mt-ckpt: error: $TMP: holds no $TMP/latest_checkpointed_iteration.txt"* ]] || fail "$err"
  run_split mt-ckpt
  [[ $status -eq 2 && "$err" == "mt-ckpt: error: subcommand: inspect or verify is required"* ]] || fail "$status $err"
}
