"""`finetune ingest postgresql+psycopg://...` against a real PostgreSQL server started by the test.

Skipped cleanly where the server binaries (initdb, pg_ctl) or the psycopg driver are not installed."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from finetune.errors import DataError
from finetune.ingest.options import IngestOptions
from finetune.ingest.pipeline import ingest

INITDB, PG_CTL, PSQL = shutil.which("initdb"), shutil.which("pg_ctl"), shutil.which("psql")
pytestmark = pytest.mark.skipif(not (INITDB and PG_CTL and PSQL), reason="PostgreSQL server binaries not installed")


def _as_server_user(cmd: list[str]) -> list[str]:
    """initdb refuses to run as root: use the `postgres` account there."""
    if os.geteuid() != 0:
        return cmd
    if not shutil.which("runuser"):
        pytest.skip("running as root without runuser: cannot start PostgreSQL")
    return ["runuser", "-u", "postgres", "--", *cmd]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def pg_url(tmp_path_factory):
    pytest.importorskip("psycopg")
    base = tmp_path_factory.mktemp("pg")
    data = base / "data"
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
        os.chmod(base, 0o755)
        for parent in list(base.parents)[:3]:  # let the postgres user traverse to the data dir
            os.chmod(parent, os.stat(parent).st_mode | 0o711)
    port = _free_port()
    run = lambda cmd: subprocess.run(_as_server_user(cmd), capture_output=True, text=True, timeout=60)  # noqa: E731
    init = run([INITDB, "-D", str(data), "-U", "ft", "--auth=trust", "-E", "UTF8", "--no-sync"])
    if init.returncode != 0:
        pytest.skip(f"initdb failed: {init.stderr.strip()[:200]}")
    start = run([PG_CTL, "-D", str(data), "-l", str(base / "log"), "-w", "-o",
                 f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off", "start"])
    if start.returncode != 0:
        pytest.skip(f"pg_ctl start failed: {start.stderr.strip()[:200]}")
    try:
        sql = ("CREATE TABLE faq (id serial PRIMARY KEY, q text, a text);"
               "INSERT INTO faq (q, a) VALUES ('What is DPO?', 'Direct preference optimization.'),"
               "('Null?', NULL), ('Quotes?', 'It''s fine; really.');")
        subprocess.run([PSQL, "-h", "127.0.0.1", "-p", str(port), "-U", "ft", "-d", "postgres", "-c", sql],
                       check=True, capture_output=True, timeout=30)
        yield f"postgresql+psycopg://ft@127.0.0.1:{port}/postgres"
    finally:
        run([PG_CTL, "-D", str(data), "-m", "immediate", "stop"])


def test_postgres_url_query_to_records(tmp_path, pg_url):
    out = tmp_path / "faq.jsonl"
    acct = ingest([pg_url], out, IngestOptions(query="SELECT q, a FROM faq ORDER BY id",
                                               mapping=(("instruction", "q"), ("output", "a"))))
    assert acct.records_in == 3 and acct.dropped == {"empty_field": 1}
    lines = out.read_text().splitlines()
    assert '"instruction": "What is DPO?"' in lines[0] and "It's fine; really." in lines[1]


def test_postgres_url_is_read_only(tmp_path, pg_url):
    with pytest.raises(DataError, match="read-only transaction"):
        ingest([pg_url], tmp_path / "o.jsonl",
               IngestOptions(query="SELECT nextval('faq_id_seq') AS q", template="{q}"))
    acct = ingest([pg_url], tmp_path / "o.jsonl", IngestOptions(table="faq", template="{q}"))
    assert acct.records_in == 3  # nothing was deleted


def test_postgres_unknown_table_is_a_clear_error(tmp_path, pg_url):
    with pytest.raises(DataError, match='relation "nope" does not exist'):
        ingest([pg_url], tmp_path / "o.jsonl", IngestOptions(table="nope", template="{q}"))
