"""Read a stored audit chain from PostgreSQL and check it by the chain rules, a part at a time.

This module imports nothing of Django or the apps, only psycopg and `casehub_verify` (the chain
rules), so that `python -m audit.scan` starts quickly: `audit.chain.check_chain`
runs it as a worker process that checks one part of a long chain while the app checks another,
all parts read in one snapshot of the database (see `audit.chain`). The worker reads a job
(JSON) on stdin and writes the verifier's state (JSON) on stdout.

Rows are read with a server-side cursor as plain values: `time` written by the server in the
form `casehub_verify.format_time` gives a UTC time, `data` as its stored JSON text, decoded by
json.loads as the model's JSON field decodes it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import psycopg
from psycopg import sql

from casehub_verify import ChainVerifier

FETCH_ROWS = 5000  # rows fetched at a time from the server-side cursor
# format_time(t) of a UTC datetime t: ISO 8601, microseconds, "+00:00".
TIME_AS_HASHED = "to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"')"


def scan(
    conn: psycopg.Connection[Any],
    table: str,
    verifier: ChainVerifier,
    start: int | None = None,
    stop: int | None = None,
) -> None:
    """Check the stored events of verifier's chain with start <= seq < stop, in seq order.

    Runs in the connection's current transaction (a server-side cursor needs one).
    """
    chain = verifier.chain
    where = [sql.SQL("chain = %s")]
    params: list[Any] = [chain]
    if start is not None:
        where.append(sql.SQL("seq >= %s"))
        params.append(start)
    if stop is not None:
        where.append(sql.SQL("seq < %s"))
        params.append(stop)
    query = sql.SQL(
        "SELECT seq, {time}, actor_kind, actor_label, action, data::text, prev_hash, hash "
        "FROM {table} WHERE {where} ORDER BY seq"
    ).format(
        time=sql.SQL(TIME_AS_HASHED.format("time")),
        table=sql.Identifier(table),
        where=sql.SQL(" AND ").join(where),
    )
    with conn.cursor(name="casehub_audit_scan") as cursor:
        cursor.execute(query, params)
        # fetchmany builds a batch's rows at once; iterating the cursor costs a call a row
        while rows := cursor.fetchmany(FETCH_ROWS):
            verifier.add_stored_rows(rows)


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Check one part of a chain in the snapshot the job names; return the verifier's state."""
    with psycopg.connect(job["conninfo"], autocommit=False) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        # before any query of the transaction: the snapshot the app's check reads too
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(job["snapshot"])))
        if job.get("role"):
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(job["role"])))
        after = job["after"]
        verifier = ChainVerifier.resumed(job["chain"], None if after is None else tuple(after))
        scan(conn, job["table"], verifier, job["start"], job["stop"])
        conn.rollback()
    return verifier.state()


def main() -> int:
    """Run the job read from stdin, write the result to stdout; exit 0, or 1 on an error."""
    job = json.load(sys.stdin)
    json.dump(run_job(job), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
