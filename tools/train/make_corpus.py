#!/usr/bin/env python3
"""Builds the training corpus of the embedded default model from Debian packages with public-domain or
permissive licences, and records every source with its package version, licence and checksum.

Run on Debian 12 (here, not on the GPU host):  python3 tools/train/make_corpus.py --out build/corpus
Needs (pinned):  apt-get install sword-text-web=426.0-1 sword-comm-mhcc=2.0-1 wordnet-base=1:3.0-37 \
                 python3.11-doc=3.11.2-6+deb12u9 diatheke=1.9.0+dfsg-4+b4
Output: train.txt and heldout.txt (documents separated by a blank line) and sources.json. A document is
held out when the SHA-256 of its text is 0 mod 50 (about 2%, deterministic, independent of order).
"""
import argparse, glob, hashlib, html, json, os, re, subprocess, sys

PACKAGES = {
    "sword-text-web": ("426.0-1", "Public domain (World English Bible)"),
    "sword-comm-mhcc": ("2.0-1", "Public domain (Matthew Henry's Concise Commentary)"),
    "wordnet-base": ("1:3.0-37", "WordNet 3.0 licence (permissive, BSD-style; Princeton University)"),
    "python3.11-doc": ("3.11.2-6+deb12u9", "PSF License Version 2 (Python documentation sources)"),
    "diatheke": ("1.9.0+dfsg-4+b4", "GPL-2 tool used only to read the SWORD modules (not in the corpus)"),
}

BOOKS_OT = ["Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth", "I Samuel",
            "II Samuel", "I Kings", "II Kings", "I Chronicles", "II Chronicles", "Ezra", "Nehemiah", "Esther", "Job",
            "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon", "Isaiah", "Jeremiah", "Lamentations", "Ezekiel",
            "Daniel", "Hosea", "Joel", "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah",
            "Haggai", "Zechariah", "Malachi"]
BOOKS_NT = ["Matthew", "Mark", "Luke", "John", "Acts", "Romans", "I Corinthians", "II Corinthians", "Galatians",
            "Ephesians", "Philippians", "Colossians", "I Thessalonians", "II Thessalonians", "I Timothy",
            "II Timothy", "Titus", "Philemon", "Hebrews", "James", "I Peter", "II Peter", "I John", "II John",
            "III John", "Jude", "Revelation of John"]
VERSE_REF = re.compile(r"^((?:I{1,3} )?[A-Z][A-Za-z ]+?) (\d+):(\d+): ?", re.M)


def check_packages():
    missing = []
    for pkg, (version, _) in PACKAGES.items():
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True)
        if r.returncode != 0 or r.stdout != version:
            missing.append(f"{pkg}={version}")
    if missing:
        sys.exit("make_corpus.py: install first: apt-get install --no-install-recommends " + " ".join(missing))


def diatheke(module, key, fmt):
    r = subprocess.run(["diatheke", "-b", module, "-f", fmt, "-k", key], capture_output=True, text=True,
                       errors="replace")
    return r.stdout


def clean_space(s):
    return re.sub(r"\s+", " ", s).strip()


def bible_documents():
    """World English Bible: one document per chapter. The module's OSIS marks some word pairs as adjacent
    <w> elements with no space between them ("God</w><w>created"); a space is restored there."""
    docs = []
    for book in BOOKS_OT + BOOKS_NT:
        osis = diatheke("engWEB2015eb", book, "OSIS")
        osis = re.sub(r"(?<=[A-Za-z,;.])</w><w([^>]*)>(?=[A-Za-z])", r"</w> <w\1>", osis)
        text = re.sub(r"<[^>]+>", "", osis)
        text = html.unescape(text).replace("(engWEB2015eb)", "")
        chapters = {}
        for m in re.finditer(r"^(?:I{1,3} )?[A-Z][A-Za-z ]+? (\d+):(\d+): (.*)$", text, re.M):
            chapters.setdefault(int(m.group(1)), []).append(clean_space(m.group(3)))
        for ch in sorted(chapters):
            body = " ".join(v for v in chapters[ch] if v)
            if body:
                docs.append(f"{book.replace('Revelation of John', 'Revelation')} {ch}\n{body}")
    return docs


def commentary_documents():
    """Matthew Henry's Concise Commentary. diatheke repeats a section's text for every verse it covers
    (and this module's index is partly unreadable, which repeats whole books), so the text is split into
    paragraphs and each distinct paragraph is kept once, in first-seen order, grouped 8 per document."""
    paras, seen = [], set()
    for book in BOOKS_OT + BOOKS_NT:
        data = VERSE_REF.sub("\n", diatheke("MHCC", book, "plain")).replace("(MHCC)", "")
        for p in re.split(r"\n+|\s*\* Verses? [\d\-, ]+\*\s*", data):
            p = clean_space(p)
            if len(p) < 80:
                continue
            h = hashlib.sha256(p.encode()).digest()
            if h not in seen:
                seen.add(h)
                paras.append(p)
    return ["\n".join(paras[i:i + 8]) for i in range(0, len(paras), 8)]


def wordnet_documents():
    """WordNet 3.0 glosses as 'lemma, lemma: gloss' lines, 100 synsets per document."""
    lines = []
    for pos in ("noun", "verb", "adj", "adv"):
        with open(f"/usr/share/wordnet/data.{pos}", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("  ") or "|" not in line:
                    continue  # licence header
                head, gloss = line.split("|", 1)
                fields = head.split()
                n = int(fields[3], 16)
                lemmas = [re.sub(r"\(.*\)$", "", fields[4 + 2 * i]).replace("_", " ") for i in range(n)]
                lines.append(f"{', '.join(lemmas)}: {gloss.strip()}")
    return ["\n".join(lines[i:i + 100]) for i in range(0, len(lines), 100)]


def python_doc_documents():
    """The reStructuredText sources of the Python 3.11 documentation, one document per file, with markup
    reduced to its text: roles (:func:`x` -> x), directive lines and heading underlines dropped."""
    docs = []
    root = "/usr/share/doc/python3.11/html/_sources"
    for path in sorted(glob.glob(f"{root}/**/*.rst.txt", recursive=True)):
        out = []
        for line in open(path, encoding="utf-8", errors="replace"):
            line = line.rstrip()
            if re.match(r"^\s*\.\. ", line) or re.match(r"^\s*:[a-z-]+:", line):
                continue
            if re.match(r"^([=\-~^*#+\"'`])\1{3,}$", line.strip()):
                continue
            line = re.sub(r":[a-z:]+:`~?!?([^`<]*?)(?: <[^>]*>)?`", r"\1", line)
            line = line.replace("``", "").replace("**", "")
            out.append(line)
        text = re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()
        if len(text) > 200:
            docs.append(text)
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    check_packages()
    os.makedirs(args.out, exist_ok=True)
    sources = [("sword-text-web", bible_documents), ("sword-comm-mhcc", commentary_documents),
               ("wordnet-base", wordnet_documents), ("python3.11-doc", python_doc_documents)]
    train, heldout, record = [], [], []
    for pkg, fn in sources:
        docs = [d.replace("\r", "") for d in fn()]
        blob = "\n\n".join(docs).encode()
        version, licence = PACKAGES[pkg]
        record.append({"package": pkg, "version": version, "licence": licence, "documents": len(docs),
                       "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()})
        for d in docs:
            (heldout if int(hashlib.sha256(d.encode()).hexdigest(), 16) % 50 == 0 else train).append(d)
        print(f"{pkg}: {len(docs)} documents, {len(blob) / 1e6:.2f} MB", file=sys.stderr)
    for name, docs in (("train.txt", train), ("heldout.txt", heldout)):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.write("\n\n".join(docs) + "\n")
    files = {name: hashlib.sha256(open(os.path.join(args.out, name), "rb").read()).hexdigest()
             for name in ("train.txt", "heldout.txt")}
    with open(os.path.join(args.out, "sources.json"), "w") as f:
        json.dump({"sources": record, "files_sha256": files, "heldout_rule": "sha256(document) % 50 == 0"}, f,
                  indent=2)
    print(f"train {sum(map(len, train)) / 1e6:.2f} MB, heldout {sum(map(len, heldout)) / 1e6:.2f} MB",
          file=sys.stderr)


if __name__ == "__main__":
    main()
