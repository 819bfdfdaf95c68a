#!/usr/bin/env bats
# mt-shard build against the numpy oracle tests/data/megatron_oracle.py: random Megatron
# .bin/.idx token datasets (written here with numpy: empty sequences, multi-sequence documents),
# random splits, blends, sequence lengths, seeds and sample counts; every array of the HDF5 index
# (document/sample/shuffle index per component, dataset/dataset-sample index per blend) must equal
# what Megatron-Core's BlendedMegatronDatasetBuilder would build, values and dtypes.
# MT_BIN selects the build (default build/bin); MT_SHARD_ORACLE_CASES the number of random runs.

load common

setup_file() {
  export HELPER="$BATS_FILE_TMPDIR/shard_oracle.py"
  cat >"$HELPER" <<'PYTHON'
import json
import os
import sys

import h5py
import numpy

sys.path.insert(0, os.environ["ORACLE_DIR"])
import megatron_oracle as mo  # noqa: E402
from write_megatron_idx import write_megatron_idx  # noqa: E402

SPLITS = ["969,30,1", "98,2,0", "1,1,1", "90,5,5", "8,1,1", "80,20", "949,50,1", "0.7 0.2 0.1"]


def write_megatron(prefix, rng):
    """Megatron's .bin/.idx (indexed_dataset.py): uint16 tokens, random document structure."""
    documents = int(rng.integers(8, 300))
    lengths, doc_indices = [], [0]
    for _ in range(documents):
        for _ in range(int(rng.choice([1, 1, 1, 2, 3]))):
            length = 0 if rng.random() < 0.08 else int(rng.integers(1, int(rng.choice([20, 100, 400]))))
            lengths.append(length)
        doc_indices.append(len(lengths))
    lengths = numpy.array(lengths, dtype=numpy.int32)
    tokens = rng.integers(0, 1000, size=int(lengths.sum())).astype(numpy.uint16)
    write_megatron_idx(prefix, tokens, lengths, doc_indices)
    return lengths


def megatron_sizes(c):
    """training.py get_train_valid_test_num_samples (train_iters = train_samples // gbs)."""
    gbs = c["global_batch_size"]
    iters = c["train_samples"] // gbs
    return [c["train_samples"], (iters // c["eval_interval"] + 1) * c["eval_iters"] * gbs, c["eval_iters"] * gbs]


def gpt(c, lengths, rng_pair, num_samples):
    return mo.gpt_indices(lengths, rng_pair[0], rng_pair[1], c["seq_length"], c["seed"], num_samples, True, True)


def blended(c, lengths_of, prefixes, weights, split_ranges, sizes, i):
    """_build_blended_dataset_splits for split i over several prefixes (or one weighted one)."""
    if weights is not None:
        w = mo.normalize(weights)
        target = mo.get_size_per_split_per_dataset(w, sizes)
        buffer = mo.get_size_per_split_per_dataset(w, sizes, surplus=mo.MID_LEVEL_DATASET_SURPLUS)
    components = []
    for k, p in enumerate(prefixes):
        components.append(gpt(c, lengths_of[p], split_ranges[k], None if weights is None else buffer[k][i]))
    lens = [x["sample_index"].shape[0] - 1 for x in components]
    if weights is not None:
        size = sum(t[i] for t in target)
        di, dsi = mo.build_blending_indices(mo.normalize(w), size)
    else:
        size = min(sizes[i], sum(lens))
        if not all(n > 0 for n in lens):
            raise mo.MegatronFailure("assert weights > 0")
        di, dsi = mo.build_blending_indices(mo.normalize(lens), size)
    return components, (di, dsi)


def expected(c):
    """Per split: None (not built) or (components, blend arrays or None)."""
    lengths_of = {p: c["lengths"][p] for p in c["lengths"]}
    for p in lengths_of:
        lengths_of[p] = numpy.array(lengths_of[p], dtype=numpy.int32)
    sizes = megatron_sizes(c)
    out = [None, None, None]
    if c.get("data_path"):
        prefixes, weights = c["data_path"]["prefixes"], c["data_path"]["weights"]
        for i in range(3):
            if sizes[i] == 0:
                continue  # mt-shard builds no split of size 0 (Megatron would build one epoch)
            ranges = [mo.split_ranges(c["split"], len(lengths_of[p]))[i] for p in prefixes]
            if ranges[0] is None:
                continue
            if len(prefixes) == 1 and weights is None:
                out[i] = ([gpt(c, lengths_of[prefixes[0]], ranges[0], sizes[i])], None)
            else:
                out[i] = blended(c, lengths_of, prefixes, weights, ranges, sizes, i)
    else:
        for i, key in enumerate(["train_data_path", "valid_data_path", "test_data_path"]):
            blend = c.get(key)
            if blend is None or sizes[i] == 0:
                continue
            prefixes, weights = blend["prefixes"], blend["weights"]
            ranges = [(0, len(lengths_of[p])) for p in prefixes]
            if len(prefixes) == 1:
                out[i] = ([gpt(c, lengths_of[prefixes[0]], ranges[0], sizes[i])], None)
            else:
                spoof = [0, 0, 0]
                spoof[i] = sizes[i]
                out[i] = blended(c, lengths_of, prefixes, weights, ranges, spoof, i)
    return out


def blend_words(blend):
    if blend["weights"] is None:
        return blend["prefixes"]
    words = []
    for w, p in zip(blend["weights"], blend["prefixes"]):
        words += [repr(float(w)), p]
    return words


def make(seed, directory):
    """A random run whose every split Megatron can build; prints mt-shard's arguments."""
    rng = numpy.random.default_rng(seed)
    while True:
        n = int(rng.integers(1, 4))
        lengths = {}
        prefixes = []
        for k in range(n):
            prefix = os.path.join(directory, "data_%d_%d" % (seed, k))
            lengths[prefix] = write_megatron(prefix, rng).tolist()
            prefixes.append(prefix)
        c = {"lengths": lengths, "seq_length": int(rng.choice([4, 8, 16, 32, 64])),
             "seed": int(rng.choice([1234, int(rng.integers(0, 2**32))])),
             "split": SPLITS[int(rng.integers(0, len(SPLITS)))],
             "global_batch_size": int(rng.choice([1, 2, 4, 8])), "eval_interval": int(rng.integers(1, 50)),
             "eval_iters": int(rng.choice([0, 1, 2, 5]))}
        c["train_samples"] = int(rng.integers(c["global_batch_size"], 4000))
        kind = rng.random()
        if kind < 0.75 or n == 1:
            weights = None
            if n > 1 and rng.random() < 0.7 or n == 1 and rng.random() < 0.25:
                weights = [float(x) for x in rng.random(n) + 0.05]
            c["data_path"] = {"prefixes": prefixes, "weights": weights}
        else:
            keys = ["train_data_path", "valid_data_path", "test_data_path"]
            for i, key in enumerate(keys):
                chosen = [prefixes[j] for j in range(n) if rng.random() < 0.6] or [prefixes[i % n]]
                weights = [float(x) for x in rng.random(len(chosen)) + 0.05] if rng.random() < 0.6 else None
                c[key] = {"prefixes": chosen, "weights": weights}
        try:
            exp = expected(c)
        except mo.MegatronFailure:
            continue
        # mt-shard refuses a split with fewer tokens than one sample (Megatron would loop epochs)
        too_short = False
        for split in exp:
            if split is not None:
                for comp in split[0]:
                    too_short |= comp["num_tokens_per_epoch"] < c["seq_length"] + 1
        if too_short or sum(x["document_index"].size for s in exp if s for x in s[0]) > 400000:
            continue
        break
    with open(os.path.join(directory, "case_%d.json" % seed), "w") as f:
        json.dump(c, f)
    args = ["--seq-length", str(c["seq_length"]), "--seed", str(c["seed"]), "--split", c["split"],
            "--train-samples", str(c["train_samples"]), "--global-batch-size", str(c["global_batch_size"]),
            "--eval-interval", str(c["eval_interval"]), "--eval-iters", str(c["eval_iters"])]
    for key, flag in [("data_path", "--data-path"), ("train_data_path", "--train-data-path"),
                      ("valid_data_path", "--valid-data-path"), ("test_data_path", "--test-data-path")]:
        if c.get(key):
            args += [flag] + blend_words(c[key])
    print("\n".join(args))


def same(name, got, want):
    if got.dtype != want.dtype:
        raise SystemExit("%s: dtype %s, Megatron's is %s" % (name, got.dtype, want.dtype))
    if got.shape != want.shape or not numpy.array_equal(got, want):
        bad = "shape %s vs %s" % (got.shape, want.shape) if got.shape != want.shape else \
            "first difference at %d" % int(numpy.argmax(got.reshape(-1) != want.reshape(-1)))
        raise SystemExit("%s differs from Megatron's: %s" % (name, bad))


def check(case_json, index_path):
    with open(case_json) as f:
        c = json.load(f)
    exp = expected(c)
    compared = 0
    with h5py.File(index_path, "r") as h:
        for i, name in enumerate(["train", "valid", "test"]):
            if exp[i] is None:
                if name in h:
                    raise SystemExit("%s: built by mt-shard, not by Megatron" % name)
                continue
            if name not in h:
                raise SystemExit("%s: missing from %s" % (name, index_path))
            components, blend = exp[i]
            group = h[name]
            if bool(group.attrs["blended"]) != (blend is not None):
                raise SystemExit("%s: blended = %s" % (name, group.attrs["blended"]))
            for k, want in enumerate(components):
                g = group["component_%d" % k]
                for key in ["document_index", "sample_index", "shuffle_index"]:
                    same("%s/component_%d/%s" % (name, k, key), g[key][()], want[key])
                    compared += 1
                for key in ["num_epochs", "num_tokens_per_epoch"]:
                    if int(g.attrs[key]) != int(want[key]):
                        raise SystemExit("%s/component_%d: %s %s vs %s" % (name, k, key, g.attrs[key], want[key]))
                if bool(g.attrs["separate_final_epoch"]) != bool(want["separate_final_epoch"]):
                    raise SystemExit("%s/component_%d: separate_final_epoch differs" % (name, k))
            if "component_%d" % len(components) in group:
                raise SystemExit("%s: more components than Megatron's" % name)
            if blend is not None:
                same(name + "/dataset_index", group["dataset_index"][()], blend[0])
                same(name + "/dataset_sample_index", group["dataset_sample_index"][()], blend[1])
                compared += 2
    print("compared %d arrays" % compared)


def write(prefix, seed, max_sequences):
    rng = numpy.random.default_rng(seed)
    while len(write_megatron(prefix, rng)) > max_sequences:
        pass


def single_weighted(directory):
    """--data-path 1.0 X: a blend of one prefix; writes X and the case, prints the arguments."""
    prefix = os.path.join(directory, "one")
    lengths = write_megatron(prefix, numpy.random.default_rng(7))
    c = {"lengths": {prefix: lengths.tolist()}, "seq_length": 8, "seed": 99, "split": "90,5,5",
         "global_batch_size": 2, "eval_interval": 10, "eval_iters": 1, "train_samples": 200,
         "data_path": {"prefixes": [prefix], "weights": [1.0]}}
    with open(os.path.join(directory, "case_w.json"), "w") as f:
        json.dump(c, f)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(int(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "single_weighted":
        single_weighted(sys.argv[2])
    else:
        check(sys.argv[2], sys.argv[3])
PYTHON
}

setup() {
  mt_load_libs
  export ORACLE_DIR="$MT_ROOT/tests/data"
  command -v mt-shard >/dev/null || skip_without_oracle "mt-shard is not built in $MT_BIN"
  /usr/bin/python3 -c 'import numpy, h5py' 2>/dev/null || skip_without_oracle "needs /usr/bin/python3 with numpy and h5py"
}

# One random run: datasets, mt-shard build, comparison with the oracle.
shard_and_check() {
  local seed="$1" dir="$BATS_TEST_TMPDIR"
  mapfile -t args < <(/usr/bin/python3 "$HELPER" make "$seed" "$dir")
  [[ ${#args[@]} -gt 0 ]] || { echo "case $seed: the generator failed"; return 1; }
  run_split mt-shard build "${args[@]}" --output "$dir/index_$seed.h5"
  if [[ $status -ne 0 ]]; then
    echo "case $seed: mt-shard build ${args[*]}: exit $status: $err"
    return 1
  fi
  run_split /usr/bin/python3 "$HELPER" check "$dir/case_$seed.json" "$dir/index_$seed.h5"
  if [[ $status -ne 0 ]]; then
    echo "case $seed: mt-shard build ${args[*]}: $out $err"
    return 1
  fi
}

@test "mt-shard build equals Megatron on random datasets, splits, blends and seeds" {
  local cases="${MT_SHARD_ORACLE_CASES:-24}"
  for ((seed = 1; seed <= cases; ++seed)); do
    shard_and_check "$seed"
  done
}

@test "mt-shard build: a single weighted prefix is a blend of one, with Megatron's surplus" {
  local dir="$BATS_TEST_TMPDIR"
  /usr/bin/python3 "$HELPER" single_weighted "$dir"
  run_split mt-shard build --data-path 1.0 "$dir/one" --seq-length 8 --seed 99 --split 90,5,5 --train-samples 200 \
    --global-batch-size 2 --eval-interval 10 --eval-iters 1 --output "$dir/w.h5"
  assert_equal "$status" 0
  run_split /usr/bin/python3 "$HELPER" check "$dir/case_w.json" "$dir/w.h5"
  echo "$out $err"
  assert_equal "$status" 0
  # 200 train samples ask int(ceil(ceil(200 * 1.0) * 1.005)) = 201 of the one GPTDataset
  run_split /usr/bin/python3 -c "import h5py; print(int(h5py.File('$dir/w.h5')['train/component_0'].attrs['num_samples']))"
  assert_equal "$out" 201
}

@test "mt-shard build: a split left empty by the rounding is an error, not a hang" {
  local dir="$BATS_TEST_TMPDIR"
  # 969,30,1 of fewer than 60 sequences leaves the test split [round(0.999 n), n) empty
  /usr/bin/python3 "$HELPER" write "$dir/tiny" 3 59
  run_split mt-shard build --data-path "$dir/tiny" --seq-length 4 --train-samples 10 --eval-iters 1 --output "$dir/x.h5"
  assert_equal "$status" 1
  [[ "$err" == *"empty"* ]]
  [[ ! -e "$dir/x.h5" ]]
}

@test "mt-shard build: zero blend weights are a usage error naming the weight (BlendedDataset asserts every weight > 0)" {
  local dir="$BATS_TEST_TMPDIR"
  /usr/bin/python3 "$HELPER" write "$dir/a" 1 100000
  run_split mt-shard build --data-path 0 "$dir/a" 0 "$dir/a" --seq-length 4 --train-samples 10 --output "$dir/x.h5"
  assert_equal "$status" 2
  [[ "$err" == *"--data-path: every blend weight must be positive and finite (got 0)"* ]] || fail "$err"
}
