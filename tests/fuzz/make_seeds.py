#!/usr/bin/python3
# Writes the seed corpora of the fuzz targets (tests/fuzz/<target>/seeds/) from the repository's
# test files, cut small so that the fuzzers run fast: texts of the tokenizer goldens' edge cases
# and llama.cpp's test vectors, JSONL lines of the goldens, Megatron .bin/.idx pairs written by
# tests/tools/make_token_dataset.py, safetensors files with the tensor names of
# tests/golden/hf (and a cut copy of the real one), tokenizer files cut down from data/tokenizers
# and tests/golden (the first 256 + M entries of GPT-2's encoder.json with its first M merges, a
# tiktoken rank file, a tokenizer.json with the first ids of llama3_style_tokenizer.json, the
# SentencePiece models, a WordPiece vocabulary), and a checkpoint of a tiny model written by
# mt-train --save-init (MT_BIN names the build's bin directory; without it that seed is kept).
# Usage: MT_BIN=build/bin tests/fuzz/make_seeds.py   (Debian's python3 and numpy; run from anywhere)
import base64
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FUZZ = os.path.join(ROOT, "tests", "fuzz")


def seeds_dir(target):
    path = os.path.join(FUZZ, target, "seeds")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def write(directory, name, data):
    with open(os.path.join(directory, name), "wb") as out:
        out.write(data)


def read(relative, mode="rb"):
    with open(os.path.join(ROOT, relative), mode) as f:
        return f.read()


def golden_texts(limit):
    texts = []
    for line in read("tests/golden/tokenizer/edge_cases.jsonl", "r").splitlines():
        texts.append(json.loads(line)["text"].encode("utf-8", "surrogatepass"))
    return texts[:limit]


def bpe_encode_seeds():
    out = seeds_dir("bpe_encode")
    texts = golden_texts(40)
    for name in ("ggml-vocab-gpt-2.gguf.inp", "ggml-vocab-llama-bpe.gguf.inp"):
        texts += [t.encode() for t in read("data/tokenizers/testvectors/" + name, "r").split("\n__ggml_vocab_test__\n")]
    for i, text in enumerate(texts):
        write(out, f"text-{i:03d}", bytes([i % 3]) + text[:512])


def jsonl_seeds():
    out = seeds_dir("jsonl")
    lines = read("tests/golden/tokenizer/edge_cases.jsonl").splitlines()[:30]
    lines += read("tests/golden/deepseek/torture.jsonl").splitlines()[:10]
    lines += [b'{"text": ["one", "two"], "title": "t"}', b'{"text": "\\ud800 lone", "title": ""}',
              b'{"text": "caf\xc3\xa9 \xff bad"}\r']
    for i, line in enumerate(lines):
        write(out, f"line-{i:03d}", line[:1024])


def megatron_idx_seeds():
    out = seeds_dir("megatron_idx")
    make = os.path.join(ROOT, "tests", "tools", "make_token_dataset.py")
    cases = {"two-docs": (100, 0, "[[[1,2,3],[4,5]],[[6,7,8,9]]]"), "empty-doc": (100, -1, "[[], [[5]]]"),
             "counting": (70000, 3, "counting:3:8:1"), "none": (10, -1, "[]")}
    with tempfile.TemporaryDirectory() as work:
        for name, (vocab, eod, spec) in cases.items():
            prefix = os.path.join(work, name)
            subprocess.run([sys.executable, make, prefix, "bin", str(vocab), str(eod), spec], check=True)
            index = open(prefix + ".idx", "rb").read()
            write(out, name, struct.pack("<I", len(index)) + index + open(prefix + ".bin", "rb").read())


def safetensors_file(tensors, metadata):
    header, offset, data = {}, 0, b""
    sizes = {"F32": 4, "BF16": 2, "F16": 2}
    for name, dtype, shape in tensors:
        count = 1
        for d in shape:
            count *= d
        blob = bytes((i * 7 + len(name)) % 251 for i in range(count * sizes[dtype]))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        data += blob
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds():
    out = seeds_dir("safetensors")
    real = read("tests/golden/hf/default-config/gpt2/model.safetensors")
    size = struct.unpack("<Q", real[:8])[0]
    header = json.loads(real[8:8 + size])
    names = [n for n in header if n != "__metadata__"][:4]
    write(out, "gpt2-names-f32", safetensors_file([(n, "F32", [2, 3]) for n in names], {"format": "pt"}))
    write(out, "mixed-dtypes", safetensors_file([("a", "BF16", [4]), ("b", "F16", [2, 2]), ("c", "F32", [])], None))
    write(out, "empty", safetensors_file([], {}))
    write(out, "gpt2-header-cut", real[:8 + size + 64])


def tokenizer_json_seed():
    source = json.loads(read("tests/golden/tokenizer/llama3_style_tokenizer.json"))
    vocab = {token: i for token, i in source["model"]["vocab"].items() if i < 300}
    merges = []
    for merge in source["model"]["merges"]:
        a, b = merge if isinstance(merge, list) else merge.split(" ")
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(merge)
    source["model"]["vocab"] = vocab
    source["model"]["merges"] = merges
    source["added_tokens"] = [{**t, "id": 300 + i} for i, t in enumerate(source["added_tokens"][:2])]
    source["post_processor"] = None
    return json.dumps(source, ensure_ascii=False).encode()


def gpt2_seed(merge_count):
    encoder = json.loads(read("data/tokenizers/gpt2/encoder.json"))
    kept = {token: i for token, i in encoder.items() if i < 256 + merge_count}
    kept["<|endoftext|>"] = 256 + merge_count
    merges = read("data/tokenizers/gpt2/vocab.bpe").split(b"\n")
    return json.dumps(kept, ensure_ascii=False).encode() + b"\0" + b"\n".join(merges[:1 + merge_count]) + b"\n"


def tokenizer_files_seeds():
    out = seeds_dir("tokenizer_files")
    write(out, "0-tokenizer-json", b"\0" + tokenizer_json_seed())
    rank_file = b"".join(base64.b64encode(bytes([b])) + b" %d\n" % b for b in range(256))
    write(out, "1-tiktoken-bytes", b"\1" + rank_file + base64.b64encode(b"ab") + b" 256\n")
    write(out, "1-tiktoken-r50k-start", b"\1" + b"\n".join(read("data/tokenizers/r50k_base/r50k_base.tiktoken").split(b"\n")[:300]))
    megatron = [{"rank": b, "token_bytes": base64.b64encode(bytes([b])).decode(), "token_str": chr(b)} for b in range(256)]
    write(out, "1-megatron-json", b"\1" + json.dumps(megatron).encode())
    write(out, "2-identity-1k-model", b"\2" + read("tests/golden/sentencepiece/identity_1k.model"))
    vocab = read("tests/golden/wordpiece/vocab-cased.txt").split(b"\n")
    write(out, "3-wordpiece-vocab", b"\3" + b"\n".join(vocab[:400]) + b"\n")
    write(out, "4-gpt2-files", b"\4" + gpt2_seed(100))


def checkpoint_metadata_seeds():
    mt_bin = os.environ.get("MT_BIN")
    if not mt_bin:
        print("make_seeds: MT_BIN not set, the checkpoint seed is kept as it is", file=sys.stderr)
        return
    out = seeds_dir("checkpoint_metadata")
    tiny = ["--byte-data", os.path.join(ROOT, "data/demo/tinyshakespeare.txt"), "--num-layers", "1", "--hidden-size", "8",
            "--num-attention-heads", "2", "--seq-length", "8", "--max-position-embeddings", "8", "--micro-batch-size", "1",
            "--global-batch-size", "1", "--train-iters", "1"]
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([os.path.join(mt_bin, "mt-train"), *tiny, "--save-init", os.path.join(work, "init.h5"),
                        "--save", os.path.join(work, "save"), "--save-interval", "1"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        write(out, "tiny-init", open(os.path.join(work, "init.h5"), "rb").read())
        write(out, "tiny-iter-1-with-optimizer", open(os.path.join(work, "save", "iter_0000001", "checkpoint.h5"), "rb").read())


def main():
    bpe_encode_seeds()
    jsonl_seeds()
    megatron_idx_seeds()
    safetensors_seeds()
    tokenizer_files_seeds()
    checkpoint_metadata_seeds()


if __name__ == "__main__":
    main()
