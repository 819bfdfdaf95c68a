#!/usr/bin/env python3
"""Golden ids of Hugging Face post-processor templates (TemplateProcessing), from HF tokenizers.

Writes, next to this script (or --out DIR):
  gpt2_bos_post_processor.json  a TemplateProcessing that puts <|endoftext|> (50256) before every
                                sequence; the test puts it into gpt2-hf/tokenizer.json in place of
                                its ByteLevel post-processor
  llama3_style_tokenizer.json   a small tokenizer.json laid out as LLaMA-3's (Meta-Llama-3-8B):
                                its pre-tokenizer, ignore_merges, the 256 added tokens at 128000..,
                                and its post-processor Sequence[ByteLevel, TemplateProcessing(BOS
                                128000 $A)]; the vocabulary is LLaMA-3's first --llama3-ranks ranks
                                with merges derived from them as transformers' TikTokenConverter does
  templates.jsonl               per text: the ids HF gives with add_special_tokens=True
                                ("gpt2_bos", "llama3_style") and False ("..._plain")
  templates_meta.json           versions, counts, and the cross-check below

Cross-check (nothing of it is committed but its counts): the whole LLaMA-3 vocabulary (128,000
ranks) is turned into a tokenizer.json the same way, and HF's ids for every text are compared with
[128000] + tiktoken's ids over Meta's tokenizer.model; `llama3_full_disagreements` must be 0, which
says the fixture's layout is the real LLaMA-3 tokenizer.json's.

Texts are encoded with encode_special_tokens=True (special-token text stays text, as mt without
--allow-special). Run by regenerate.sh; see README.md.
"""
import argparse
import base64
import json
import sys
from pathlib import Path

import tiktoken
import tiktoken.load
import tokenizers

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests/bench"))
# Meta's llama3 pattern (LLaMA-3's tokenizer.json Split pre-tokenizer uses the same), its special
# tokens, and GPT-2's byte -> character table.
from make_token_goldens import LLAMA3_PATTERN, llama3_specials  # noqa: E402
from tokenize_reference import bytes_to_unicode  # noqa: E402

GPT2_BOS_POST_PROCESSOR = {
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
             {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [50256], "tokens": ["<|endoftext|>"]}},
}

OWN_TEXTS = ["", "Hello world\n", "Hello world", " leading space", "<|begin_of_text|> is text here",
             "two\n\nlines", "naïve café 北京 1234567"]

BYTE_CHARS = bytes_to_unicode()


def byte_level(token):
    return "".join(BYTE_CHARS[b] for b in token)


def vocab_and_merges(ranks):
    """A BPE vocabulary and merge list equivalent to tiktoken ranks: every split of a token into
    two tokens is a merge, ordered by the merged token's rank, then by the parts' ranks (what
    transformers' TikTokenConverter.extract_vocab_merges_from_model produces)."""
    vocab, merges = {}, []
    for token, rank in ranks.items():
        vocab[byte_level(token)] = rank
        splits = []
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                splits.append((ranks[left], ranks[right], left, right))
        splits.sort()
        merges.extend((rank, left, right) for _, _, left, right in splits)
    merges.sort(key=lambda merge: merge[0])
    return vocab, [[byte_level(left), byte_level(right)] for _, left, right in merges]


def llama3_style_tokenizer_json(ranks):
    vocab, merges = vocab_and_merges(ranks)
    bos = {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": token_id, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for name, token_id in llama3_specials().items()],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000],
                                                      "tokens": ["<|begin_of_text|>"]}}}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }


def hf_tokenizer(root):
    tokenizer = tokenizers.Tokenizer.from_str(json.dumps(root))
    tokenizer.encode_special_tokens = True
    return tokenizer


def texts_to_encode():
    texts = list(OWN_TEXTS)
    for name in ("edge_cases.jsonl", "testvectors.jsonl"):
        with open(HERE / name, encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f]
    seen, unique = set(), []
    for text in texts:
        if text not in seen:
            seen.add(text)
            unique.append(text)
    return unique


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT / "data"), help="the data folder (default: the repository's data/)")
    ap.add_argument("--out", default=str(HERE), help="output folder (default: this script's folder)")
    ap.add_argument("--llama3-ranks", type=int, default=2048, help="ranks of LLaMA-3 in the small fixture")
    args, _ = ap.parse_known_args()  # regenerate.sh passes make_token_goldens.py's options too
    tok_dir, out = Path(args.data) / "tokenizers", Path(args.out)

    with open(tok_dir / "gpt2-hf/tokenizer.json", encoding="utf-8") as f:
        gpt2 = json.load(f)
    gpt2["post_processor"] = GPT2_BOS_POST_PROCESSOR
    llama3_ranks = tiktoken.load.load_tiktoken_bpe(str(tok_dir / "llama3/tokenizer.model"))
    small = {token: rank for token, rank in llama3_ranks.items() if rank < args.llama3_ranks}
    llama3_style = llama3_style_tokenizer_json(small)
    references = {"gpt2_bos": hf_tokenizer(gpt2), "llama3_style": hf_tokenizer(llama3_style)}

    texts = texts_to_encode()
    records = []
    for text in texts:
        record = {"text": text}
        for name, tokenizer in references.items():
            record[name] = tokenizer.encode(text, add_special_tokens=True).ids
            record[name + "_plain"] = tokenizer.encode(text, add_special_tokens=False).ids
        records.append(record)

    # The real LLaMA-3 layout with every rank, against tiktoken over Meta's file plus BOS.
    full = hf_tokenizer(llama3_style_tokenizer_json(llama3_ranks))
    meta_llama3 = tiktoken.Encoding("llama3", pat_str=LLAMA3_PATTERN, mergeable_ranks=llama3_ranks,
                                    special_tokens=llama3_specials())
    full_disagreements = sum(full.encode(text).ids != [128000] + meta_llama3.encode_ordinary(text) for text in texts)

    with open(out / "gpt2_bos_post_processor.json", "w", encoding="utf-8") as f:
        json.dump(GPT2_BOS_POST_PROCESSOR, f, indent=1)
        f.write("\n")
    with open(out / "llama3_style_tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(llama3_style, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    with open(out / "templates.jsonl", "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=True, separators=(",", ":")) + "\n")
    meta = {
        "generator": "tests/golden/tokenizer/make_template_goldens.py",
        "tiktoken": tiktoken.__version__,
        "tokenizers": tokenizers.__version__,
        "python": "%d.%d.%d" % sys.version_info[:3],
        "texts": len(records),
        "llama3_style_ranks": args.llama3_ranks,
        "llama3_style_merges": len(llama3_style["model"]["merges"]),
        "llama3_full_disagreements": full_disagreements,
    }
    with open(out / "templates_meta.json", "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(json.dumps(meta, indent=1), file=sys.stderr)
    if full_disagreements:
        sys.exit("make_template_goldens: the full LLaMA-3 layout disagrees with tiktoken + BOS")


if __name__ == "__main__":
    main()
