"""`bench.writer_schema`: a recorded ppa1q stream replayed on each variant stores the very rows
the schema as it is stores (else its prices compare different writes), and `norowid` is a
`jobs` table without its primary key's index. Small N; never a speed."""

from __future__ import annotations

import pickle
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

from bench.writer_schema import VARIANTS, fresh, replay, statements

REPO = Path(__file__).resolve().parents[2]


def test_every_variant_stores_the_same_rows(tmp_path: Path) -> None:
    out = tmp_path / "ppa.pkl"
    subprocess.run(
        [sys.executable, "-m", "bench.writer_split", "record", str(out), "--jobs", "2000"],
        cwd=REPO, capture_output=True, timeout=300, check=True,
    )  # fmt: skip
    log = pickle.loads(out.read_bytes())["log"]
    _s, _p, stored = replay(statements(log, "rowid"), "rowid")
    assert len(stored) == 2000 and all(row[2] == "completed" and row[7] for row in stored)
    for variant in VARIANTS[1:]:
        changed = statements(log, variant)
        # `norowid` runs the same statements on another table; the others other statements.
        assert (changed == log) == (variant == "norowid"), variant
        assert replay(changed, variant)[2] == stored, variant
    done = subprocess.run(
        [sys.executable, "-m", "bench.writer_schema", str(out), "--variant", "norowid"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert re.search(r"^norowid: statements µs/job [0-9.]+; pages \d+; rows 2000$", done.stdout,
                     re.M), done.stdout  # fmt: skip


def test_norowid_drops_the_primary_keys_index(tmp_path: Path) -> None:
    def indexes(variant: str) -> set[str]:
        conn = fresh(tmp_path / f"{variant}.db", variant)
        with conn:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE tbl_name = 'jobs'")
            names = {name for (name,) in rows}
        conn.close()
        return names

    plain, norowid = indexes("rowid"), indexes("norowid")
    assert plain - norowid == {"sqlite_autoindex_jobs_1"}
    assert norowid - plain == set()
    conn = sqlite3.connect(tmp_path / "norowid.db")
    try:
        (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'jobs'").fetchone()
    finally:
        conn.close()
    assert sql.endswith("WITHOUT ROWID")
