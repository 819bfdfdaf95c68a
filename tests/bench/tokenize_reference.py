#!/usr/bin/env python3
"""Reference side of tests/bench/bench_tokenize.sh: tiktoken and HF tokenizers speed on a corpus.

Subcommands (each prints one JSON object per measurement on stdout):
  throughput --impl tiktoken|hf --tokenizer gpt2|cl100k --threads N --input FILE
      Encodes FILE cut into line chunks (whole lines, about --chunk-bytes each). tiktoken: a loop
      of encode_ordinary for 1 thread, encode_ordinary_batch(num_threads=N) otherwise. HF:
      encode_batch with RAYON_NUM_THREADS=N (set here before tokenizers is imported). Reports the
      median of --runs timings (tokenizer loading excluded) as MB/s (1 MB = 10^6 input bytes).
  count --tokenizer gpt2|cl100k --input FILE
      tiktoken's id count for FILE as one text (to check mt-tokenize's output against).
  scaling --tokenizer gpt2|cl100k
      tiktoken encode_ordinary time for runs of 10^5 and 10^6 letters, spaces and digits.
  make-jsonl --input TXT --output JSONL
      Cuts a text into {"text": ...} documents of whole lines (about --doc-bytes each) whose
      concatenation is the text, for the preprocess benchmark.
There is no HF tokenizer.json for cl100k_base here: --impl hf --tokenizer cl100k builds one from
the tiktoken ranks (byte-level BPE, merges recovered from the ranks, Meta/HF's pattern, whole
pieces looked up first as tiktoken does) and caches it next to the input (--cache).
Needs tiktoken and tokenizers (bench_tokenize.sh makes a venv with them).
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
                  r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
# The same split in Oniguruma syntax (HF's LLaMA-3 tokenizer.json pattern), for the HF cl100k build.
CL100K_HF_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                     r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
RANK_FILES = {"gpt2": "r50k_base/r50k_base.tiktoken", "cl100k": "cl100k_base/cl100k_base.tiktoken"}


def tokenizer_dir(args):
    return Path(args.data) / "tokenizers"


def tiktoken_encoding(name, tok_dir):
    import tiktoken
    import tiktoken.load
    ranks = tiktoken.load.load_tiktoken_bpe(str(tok_dir / RANK_FILES[name]))
    if name == "gpt2":
        return tiktoken.Encoding("r50k_base", pat_str=R50K_PATTERN, mergeable_ranks=ranks,
                                 special_tokens={"<|endoftext|>": 50256})
    return tiktoken.Encoding("cl100k_base", pat_str=CL100K_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 100257})


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def hf_cl100k_json(tok_dir, cache):
    """An HF tokenizer.json equivalent to tiktoken cl100k_base (ordinary text only)."""
    if cache and cache.is_file():
        return cache.read_text(encoding="utf-8")
    import tiktoken.load
    ranks = tiktoken.load.load_tiktoken_bpe(str(tok_dir / RANK_FILES["cl100k"]))
    b2u = bytes_to_unicode()
    to_str = lambda b: "".join(b2u[x] for x in b)  # noqa: E731
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:  # BPE with the ranks below this one: it must end in two parts
            best = None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < rank and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        assert len(parts) == 2, token
        merges.append([to_str(parts[0]), to_str(parts[1])])
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": CL100K_HF_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {to_str(t): r for t, r in ranks.items()}, "merges": merges},
    }
    text = json.dumps(spec, ensure_ascii=False)
    if cache:
        cache.write_text(text, encoding="utf-8")
    return text


def line_chunks(text, chunk_bytes):
    chunks, cur, size = [], [], 0
    for line in text.splitlines(keepends=True):
        cur.append(line)
        size += len(line)
        if size >= chunk_bytes:
            chunks.append("".join(cur))
            cur, size = [], 0
    if cur:
        chunks.append("".join(cur))
    return chunks


def timed(fn, runs):
    times, result = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, result


def cmd_throughput(args):
    if args.impl == "hf":
        os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before tokenizers starts its pool
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
    tok_dir = tokenizer_dir(args)
    data = Path(args.input).read_bytes()
    text = data.decode("utf-8")
    chunks = line_chunks(text, args.chunk_bytes)
    if args.impl == "tiktoken":
        enc = tiktoken_encoding(args.tokenizer, tok_dir)
        if args.threads == 1:
            fn = lambda: sum(len(enc.encode_ordinary(c)) for c in chunks)  # noqa: E731
        else:
            fn = lambda: sum(map(len, enc.encode_ordinary_batch(chunks, num_threads=args.threads)))  # noqa: E731
    else:
        import tokenizers
        if args.tokenizer == "gpt2":
            tok = tokenizers.Tokenizer.from_file(str(tok_dir / "gpt2-hf/tokenizer.json"))
            tok.encode_special_tokens = True
        else:
            cache = Path(args.cache) if args.cache else None
            tok = tokenizers.Tokenizer.from_str(hf_cl100k_json(tok_dir, cache))
        fn = lambda: sum(len(e.ids) for e in tok.encode_batch(chunks, add_special_tokens=False))  # noqa: E731
    fn()  # warm-up (thread pools, caches)
    median, times, tokens = timed(fn, args.runs)
    print(json.dumps({"impl": "tiktoken" if args.impl == "tiktoken" else "hf-tokenizers", "tokenizer": args.tokenizer,
                      "threads": args.threads, "bytes": len(data), "chunks": len(chunks), "tokens": tokens,
                      "seconds": [round(t, 4) for t in times], "median_s": round(median, 4),
                      "mb_per_s": round(len(data) / 1e6 / median, 3)}), flush=True)


def cmd_count(args):
    enc = tiktoken_encoding(args.tokenizer, tokenizer_dir(args))
    text = Path(args.input).read_bytes().decode("utf-8")
    print(json.dumps({"impl": "tiktoken", "tokenizer": args.tokenizer, "tokens": len(enc.encode_ordinary(text))}))


def cmd_scaling(args):
    enc = tiktoken_encoding(args.tokenizer, tokenizer_dir(args))
    for kind, ch in (("letters", "a"), ("spaces", " "), ("digits", "7")):
        t = {}
        for n in (10**5, 10**6):
            text = ch * n
            t[n] = timed(lambda: enc.encode_ordinary(text), args.runs)[0]
        print(json.dumps({"impl": "tiktoken", "tokenizer": args.tokenizer, "run": kind, "t_1e5": round(t[10**5], 5),
                          "t_1e6": round(t[10**6], 5), "ratio": round(t[10**6] / t[10**5], 2)}), flush=True)


def cmd_make_jsonl(args):
    text = Path(args.input).read_bytes().decode("utf-8")
    with open(args.output, "w", encoding="utf-8") as f:
        for doc in line_chunks(text, args.doc_bytes):
            f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT / "data"), help="the data folder (default: the repository's data/)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("throughput")
    p.add_argument("--impl", choices=["tiktoken", "hf"], required=True)
    p.add_argument("--tokenizer", choices=["gpt2", "cl100k"], required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--input", required=True)
    p.add_argument("--chunk-bytes", type=int, default=8192)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--cache", help="where to keep the built HF cl100k tokenizer.json")
    p = sub.add_parser("count")
    p.add_argument("--tokenizer", choices=["gpt2", "cl100k"], required=True)
    p.add_argument("--input", required=True)
    p = sub.add_parser("scaling")
    p.add_argument("--tokenizer", choices=["gpt2", "cl100k"], required=True)
    p.add_argument("--runs", type=int, default=3)
    p = sub.add_parser("make-jsonl")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--doc-bytes", type=int, default=16384)
    args = ap.parse_args()
    {"throughput": cmd_throughput, "count": cmd_count, "scaling": cmd_scaling, "make-jsonl": cmd_make_jsonl}[args.cmd](args)


if __name__ == "__main__":
    main()
