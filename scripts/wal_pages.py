#!/usr/bin/env python3
"""Which b-trees a live journal's commits write: pages per commit, by table or index.

Usage: scripts/wal_pages.py DATA_DIR/journal.db [--last N]

Copies the journal and its WAL (while the broker runs, e.g. during a load phase), reads
the WAL's frames of its current generation (SQLite file format §4.1-4.3: a frame whose
"database size" field is set ends a commit), and maps each frame's page number to the
b-tree that owns it with the `dbstat` virtual table of the copy. Prints the mean number
of pages per commit for each b-tree over the last N commits. Reads only; the journal
itself is never opened.
"""

import argparse
import collections
import shutil
import sqlite3
import struct
import sys
import tempfile
from pathlib import Path


def commits(wal: bytes) -> list[list[int]]:
    """The page numbers of each committed transaction in `wal`, oldest first."""
    if len(wal) < 32:
        return []
    magic, _version, page_size, _seq, salt1, salt2, _c1, _c2 = struct.unpack(">8I", wal[:32])
    if magic & ~1 != 0x377F0682 or page_size < 512:
        return []
    out, pending, at = [], [], 32
    while at + 24 + page_size <= len(wal):
        page, db_size, s1, s2 = struct.unpack(">4I", wal[at:at + 16])
        if (s1, s2) != (salt1, salt2):
            break
        pending.append(page)
        if db_size:
            out.append(pending)
            pending = []
        at += 24 + page_size
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("journal", type=Path)
    p.add_argument("--last", type=int, default=200, help="commits to average over")
    args = p.parse_args()
    if not args.journal.is_file():
        print(f"{args.journal}: no such journal file", file=sys.stderr)
        return 2
    wal_path = Path(str(args.journal) + "-wal")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "journal.db"
        shutil.copyfile(args.journal, copy)
        if wal_path.exists():
            shutil.copyfile(wal_path, Path(str(copy) + "-wal"))
        wal = Path(str(copy) + "-wal").read_bytes() if wal_path.exists() else b""
        found = commits(wal)[-args.last:]
        if not found:
            print("no committed frames in the WAL (it was just checkpointed): try again")
            return 1
        try:
            con = sqlite3.connect(copy)
            owner = dict((page, name) for name, page in
                         con.execute("SELECT name, pageno FROM dbstat"))
            con.close()
        except sqlite3.Error as e:
            print(f"{args.journal}: cannot read it as a SQLite database ({e})", file=sys.stderr)
            return 2
    per_tree = collections.Counter()
    for pages in found:
        for page in pages:
            per_tree[owner.get(page, f"page {page} (free or new)")] += 1
    total = sum(len(c) for c in found)
    print(f"{len(found)} commits, {total / len(found):.1f} pages per commit")
    for name, n in per_tree.most_common():
        print(f"{n / len(found):7.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
