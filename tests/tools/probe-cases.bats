#!/usr/bin/env bats
# Bad files and sizes from the 2026-11-27 probe (issue 28, cases U16, W8, C2), each reproduced on
# a tiny model or GPT-2's tokenizer: a safetensors import names the tensor it misses and a wrong
# model_type is a bad file; a tokenizer.json whose merges list is cut is refused as a cut
# vocab.bpe is; mt-memreport, --plan and --sweep refuse what mt-train's closed-form floor
# refuses before they build anything per layer.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
}

teardown() { rm -rf "$TMP"; }

# An HF directory of tiny-gpt (mt-ckpt export of a one-step run) in $TMP/hf.
hf_tiny() {
  mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 2 \
    --train-iters 1 --eval-iters 0 --save-final "$TMP/final.h5" >/dev/null 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  mt-ckpt export --format hf "$TMP/final.h5" "$TMP/hf" >/dev/null || fail "export"
}

@test "U16: safetensors import names a tensor missing from the header (not a hole), and a wrong model_type is a bad file (exit 1)" {
  hf_tiny
  cp -r "$TMP/hf" "$TMP/missing"
  # The tensor's entry deleted from the header, its bytes left where they were (the probe's st_missing).
  /usr/bin/python3 - "$TMP/missing/model.safetensors" <<'EOF'
import json, struct, sys
path = sys.argv[1]
data = open(path, "rb").read()
size = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + size])
del header["transformer.h.1.mlp.c_fc.bias"]
text = json.dumps(header).encode()
open(path, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + size:])
EOF
  run_split mt-ckpt import --format hf "$TMP/missing" "$TMP/x1.h5"
  [[ $status -eq 1 && "$err" == "mt-ckpt: error: tensor transformer.h.1.mlp.c_fc.bias: missing from $TMP/missing/model.safetensors" ]] \
    || fail "$status $err"
  [[ ! -e "$TMP/x1.h5" ]] || fail "an output was left"
  # A hole no tensor the model needs explains is still refused, naming the bytes.
  cp -r "$TMP/hf" "$TMP/hole"
  /usr/bin/python3 - "$TMP/hole/model.safetensors" <<'EOF'
import json, struct, sys
path = sys.argv[1]
data = open(path, "rb").read()
size = struct.unpack("<Q", data[:8])[0]
text = data[8:8 + size]
open(path, "wb").write(data[:8] + text + data[8 + size:] + b"\0" * 16)
EOF
  run_split mt-ckpt import --format hf "$TMP/hole" "$TMP/x3.h5"
  [[ $status -eq 1 && "$err" == "mt-ckpt: error: $TMP/hole/model.safetensors: the tensors end at byte "*" of a "*"-byte file: a tensor missing from the header, or a damaged file" ]] \
    || fail "$status $err"
  cp -r "$TMP/hf" "$TMP/bert"
  jq '.model_type = "bert" | .architectures = ["BertModel"]' "$TMP/hf/config.json" >"$TMP/bert/config.json"
  run_split mt-ckpt import --format hf "$TMP/bert" "$TMP/x2.h5"
  [[ $status -eq 1 && "$err" == "mt-ckpt: error: $TMP/bert/config.json: model_type 'bert' is not imported (mt imports gpt2, llama, mixtral and deepseek_v3)" ]] \
    || fail "$status $err"
}

@test "W8: an HF tokenizer.json whose merges list is cut (still valid JSON) is refused naming the file, as a cut vocab.bpe is" {
  /usr/bin/python3 -c "import json,sys; t=json.load(open(sys.argv[1])); t['model']['merges']=t['model']['merges'][:20000]; json.dump(t,open(sys.argv[2],'w'))" \
    "$MT_ROOT/data/tokenizers/gpt2-hf/tokenizer.json" "$TMP/cut.json"
  run_split bash -c "printf 'Hello world sidewalk' | mt-tokenize encode --raw --tokenizer-type HuggingFaceTokenizer --tokenizer-model '$TMP/cut.json'"
  [[ $status -eq 1 && -z "$out" ]] || fail "$status $out $err"
  [[ "$err" == "mt-tokenize: error: $TMP/cut.json: model.merges: 20000 merges, so 30000 of the 50257 tokens of model.vocab are never made (the first: '"*"', id 20256): the merges list is truncated or belongs to another vocabulary" ]] \
    || fail "$err"
  # The whole file still encodes as GPT-2 does.
  run_split bash -c "printf 'Hello world sidewalk' | mt-tokenize encode --raw --tokenizer-type HuggingFaceTokenizer --tokenizer-model '$MT_ROOT/data/tokenizers/gpt2-hf/tokenizer.json'"
  [[ $status -eq 0 && "$out" == *"15496 995 24058"* ]] || fail "$status $out $err"
}

@test "C2: mt-memreport, --plan and --sweep refuse a size mt-train refuses from the closed-form floor, at once and with flat memory" {
  for args in "--num-layers 10000000" "--num-layers 2147483647" "--plan dgx-h100 --world-size 16 --num-layers 10000000" \
              "--sweep num-layers=2,10000000"; do
    # Under 2 GB of address space (the probe's 10^7 layers grew to 23.8 GB); the CPU seconds the
    # tool used (bash's time: user + sys of the child), not the wall clock of a loaded machine.
    run_split bash -c "ulimit -v 2000000; TIMEFORMAT='%3U %3S'; { time mt-memreport --model llama3-8b --global-batch-size 16 $args 2>&3; } 3>&2 2>'$TMP/cpu'"
    local cpu
    cpu="$(awk '{print $1 + $2}' "$TMP/cpu")"
    [[ $status -eq 1 && -z "$out" ]] || fail "$args: $status ($cpu s) $out $err"
    [[ "$err" == "mt-memreport: error: model llama3-8b: needs "* ]] || fail "$args: $err"
    awk -v s="$cpu" 'BEGIN { exit !(s < 1.0) }' || fail "$args: $cpu CPU seconds"
    echo "# $args: refused after $cpu CPU seconds" >&3
  done
  [[ "$err" == *": needs at least "*" per rank ("*"), more than any device mt knows holds (the largest, "*") and than this host's available "*"; use a smaller model, more ranks, a smaller micro-batch or recompute" ]] \
    || fail "$err"
  # Sizes a device holds are reported as before.
  mt-memreport --model llama3-8b --global-batch-size 16 --num-layers 64 --world-size 16 --tensor-model-parallel-size 8 >/dev/null \
    || fail "a fitting size was refused"
}
