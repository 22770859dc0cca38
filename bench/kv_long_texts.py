#!/usr/bin/env python3
"""Held-out long texts for `specnode kv-eval` (issue 40: 2k, 8k and 16-32k tokens).

The project tunes the KV store on tests/data/kv-eval (its own short texts); these are
texts it never tunes on, taken from what every machine that runs the project has, so no
download is needed and every session measures the same bytes:

  apache-2.0.txt       the Apache License 2.0 (Debian base-files,
                       /usr/share/common-licenses/Apache-2.0): legal prose, ~2.5k tokens
  gpl-3.0.txt          the GNU GPL v3 (/usr/share/common-licenses/GPL-3): ~8k tokens
  python-reference.txt the Python Language Reference's topics, as pydoc ships them
                       (pydoc_data.topics of the running interpreter, topics in sorted
                       order): prose with code, >100k tokens; kv-eval --max-tokens cuts it
                       (16384 / 32768)

Each file's SHA-256 is printed so that a table can name the exact text (pydoc's topics
change between Python versions; the licences do not).

usage: bench/kv_long_texts.py [--out DIR]   (default ~/.cache/specnode/kv-long)
"""

import argparse
import hashlib
import os
import sys

LICENCES = {
    "apache-2.0.txt": "/usr/share/common-licenses/Apache-2.0",
    "gpl-3.0.txt": "/usr/share/common-licenses/GPL-3",
}


def python_reference() -> str:
    import pydoc_data.topics as topics  # part of the standard library

    return "\n\n".join(topics.topics[k].strip() for k in sorted(topics.topics)) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=os.path.expanduser("~/.cache/specnode/kv-long"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    texts = {}
    for name, path in LICENCES.items():
        try:
            with open(path, encoding="utf-8") as f:
                texts[name] = f.read()
        except OSError as e:
            print(f"kv_long_texts: cannot read {path} ({e.strerror}); it comes with Debian's "
                  "base-files", file=sys.stderr)
            return 1
    texts["python-reference.txt"] = python_reference()
    for name, text in texts.items():
        out = os.path.join(args.out, name)
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        print(f"{out}\t{len(text)} chars\tsha256 {digest}")
    print(f"python {sys.version.split()[0]} (pydoc topics)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
