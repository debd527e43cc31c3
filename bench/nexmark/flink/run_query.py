#!/usr/bin/env python3
"""Runs one Nexmark query of this directory (qN.sql, Flink SQL) on the Flink peer.

    run_query.py QUERY N [the peer's run.py options]

The peer's run.py (../shared/peers/flink) measures the job and prints its RESULT line; this
script only gives it the query: the tables it reads and the sink's columns come from the
file's `-- tables:` and `-- sink:` lines. Every stream gets the same watermark as in Weir's
Nexmark runs (date_time - 4 s), whether the query has windows or not. The RESULT counts the
bids (plus the auctions when both are read): bench/nexmark/run rescales it to every row read.
Runs inside the peer's venv (../shared/peers/flink/setup.sh).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.abspath(os.path.join(HERE, "..", "..", "..", "..", "shared", "peers", "flink"))
sys.path.insert(0, PEER)
import run  # noqa: E402  (the peer's run.py; re-executes this script in its venv)


def load(path):
    """(tables, sink columns, query) of one qN.sql."""
    tables = sink = None
    body = []
    with open(path) as f:
        for line in f.read().splitlines():
            if line.startswith("-- tables:"):
                tables = [t.strip() for t in line.split(":", 1)[1].split(",")]
            elif line.startswith("-- sink:"):
                sink = line.split(":", 1)[1].strip()
            elif not line.startswith("--"):
                body.append(line)
    if not tables or not sink:
        sys.exit(f"{path}: needs a '-- tables:' and a '-- sink:' line")
    return tables, sink, "\n".join(body)


def main():
    for name in sorted(f[:-4] for f in os.listdir(HERE) if f.endswith(".sql")):
        tables, sink, query = load(os.path.join(HERE, f"{name}.sql"))
        run.QUERIES[name] = (tables, False, sink, query)
    for stream in run.COLS:
        run.COLS[stream] += run.WATERMARK
    run.main()


if __name__ == "__main__":
    main()
