"""Usage reports (issue 25): export and PySpark job time and peak memory for a day of N events.

For each size a fresh PostgreSQL database gets one day of generated usage events (made by
PostgreSQL itself, ``generate_series``), then ``manage.py runreport --again`` reports it, as
an operator would, while its process tree (the Python driver and Spark's JVM) is sampled for
resident memory. The same day is then recomputed in plain SQL on PostgreSQL as a reference,
and its totals checked against the report's. ``--standalone`` runs the job on a standalone
Spark master with two workers started from the pyspark package instead of ``local[*]``.

    python -m bench reports                               # 1M, 10M, 30M on local[*]
    python -m bench reports --events 1000000 --standalone
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date, timedelta
from pathlib import Path

from .isolated import PG_ADMIN_URL, _create_pg_database, _drop_pg_database, base_env

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "reports-notes.md"
DAY = date(2026, 1, 15)
ACCOUNTS = 200


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", default="1000000,10000000,30000000",
                        help="comma-separated day sizes (default 1M,10M,30M)")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--standalone", action="store_true",
                        help="start a standalone master and 2 workers (pyspark's spark-class)")
    parser.add_argument("--driver-memory", default="3g")
    parser.add_argument("--no-sql", action="store_true", help="skip the SQL reference")


# --------------------------------------------------------------------------- data


def _generate(url: str, n: int) -> float:
    """``n`` events of DAY (and the spill-over of ACKs into the next day) by SQL; seconds."""
    import psycopg

    pubs, acks, expires, dead = int(n * 0.45), int(n * 0.40), int(n * 0.05), int(n * 0.05)
    sessions = max(1, (n - pubs - acks - expires - dead) // 2)
    d = f"TIMESTAMPTZ '{DAY} 00:00:00+00'"
    # A publish's time is a function of its smuid i, so its ACK (i ms to 60 s later) needs
    # no join to know it.
    pub_at = f"{d} + ((i * 7919) % 86000) * INTERVAL '1 second' + (i % 1000) * INTERVAL '1 ms'"
    t = "broker_usageevent"
    cols = "(at, kind, account, topic, smuid, bytes, peer, detail)"
    chunk = 1_000_000
    statements = []
    for lo in range(1, pubs + 1, chunk):
        hi = min(pubs, lo + chunk - 1)
        statements.append(
            f"INSERT INTO {t} {cols} SELECT {pub_at}, 'publish', 'acct' || (i % {ACCOUNTS}), "
            f"'/t' || (i % 10) || '/s' || (i % 97) || CASE WHEN i % 3 = 0 THEN '/leaf' "
            f"ELSE '' END, i, (i * 13) % 10000, '', jsonb_build_object('door', CASE WHEN "
            f"i % 5 = 0 THEN 'qqp' ELSE 'smqp' END, 'to', 1 + i % 3) "
            f"FROM generate_series({lo}::bigint, {hi}) i")
    for lo in range(1, acks + 1, chunk):
        hi = min(acks, lo + chunk - 1)
        statements.append(
            f"INSERT INTO {t} {cols} SELECT {pub_at} + ((i * 31) % 60000 + 1) * "
            f"INTERVAL '1 ms', 'ack', 'acct' || ((i + 7) % {ACCOUNTS}), '', i, 0, '', '{{}}' "
            f"FROM generate_series({lo}::bigint, {hi}) i")
    statements.append(
        f"INSERT INTO {t} {cols} SELECT {pub_at} + INTERVAL '60 s', 'expire', '', '', i, 0, "
        f"'', '{{}}' FROM generate_series({pubs - expires + 1}::bigint, {pubs}) i")
    statements.append(
        f"INSERT INTO {t} {cols} SELECT {pub_at} + INTERVAL '90 s', 'dead', '', '', i, 0, '', "
        f"jsonb_build_object('account_id', 1 + i % {ACCOUNTS}, 'reason', CASE WHEN i % 4 = 0 "
        f"THEN 'no longer allowed' ELSE 'max retries' END) "
        f"FROM generate_series({acks + 1}::bigint, {acks + dead}) i")
    statements.append(
        f"INSERT INTO {t} {cols} SELECT {d} + ((i * 104729) % 80000) * INTERVAL '1 second' "
        f"+ CASE WHEN k = 1 THEN INTERVAL '0' ELSE ((i % 3600) + 1) * INTERVAL '1 second' END, "
        f"CASE WHEN k = 1 THEN 'login' ELSE 'logout' END, 'acct' || (i % {ACCOUNTS}), '', "
        f"NULL, 0, '', '{{}}' FROM generate_series(1::bigint, {sessions}) i, "
        f"generate_series(1, 2) k")
    t0 = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql)
        conn.execute(f"VACUUM ANALYZE {t}")
    return time.monotonic() - t0


# --------------------------------------------------------------------------- measuring


def _tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def _run_report(env: dict[str, str], master: str) -> tuple[float, int, str]:
    """runreport's wall seconds, peak RSS of its process tree, output."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runreport", "--date", str(DAY), "--again",
         "--master", master], env=env, cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.5):
            peak = max(peak, _tree_rss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    done.set()
    sampler.join()
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"runreport failed:\n{out[-4000:]}")
    return wall, peak, out


SQL_REFERENCE = """
WITH e AS (SELECT * FROM broker_usageevent WHERE at >= %(s)s AND at < %(e)s),
p AS (SELECT DISTINCT ON (smuid) smuid, at, account, topic, bytes FROM broker_usageevent
      WHERE kind = 'publish' AND at < %(e)s
        AND smuid IN (SELECT smuid FROM e WHERE kind IN ('ack', 'expire', 'dead'))),
f AS (
  SELECT extract(hour FROM e.at)::int AS h,
         CASE WHEN e.kind = 'dead' THEN coalesce(e.detail->>'account_id', '')
              WHEN e.kind = 'expire' THEN coalesce(p.account, e.account)
              ELSE e.account END AS account,
         coalesce(nullif(e.topic, ''), p.topic, '(unknown)') AS topic,
         coalesce(nullif(e.detail->>'door', ''), 'smqp') AS door,
         (e.kind = 'publish')::int AS published,
         CASE WHEN e.kind = 'publish' THEN coalesce((e.detail->>'to')::int, 0) ELSE 0 END
           AS delivered,
         (e.kind = 'ack')::int AS acked, (e.kind = 'expire')::int AS expired,
         (e.kind = 'dead')::int AS dead,
         CASE WHEN e.kind = 'publish' THEN e.bytes ELSE 0 END AS bytes_in,
         CASE WHEN e.kind = 'ack' THEN coalesce(p.bytes, 0) ELSE 0 END AS bytes_out,
         CASE WHEN e.kind = 'ack' AND p.at IS NOT NULL
              THEN extract(epoch FROM e.at - p.at) * 1000 END AS latency_ms
  FROM e LEFT JOIN p ON p.smuid = e.smuid
  WHERE e.kind IN ('publish', 'republish', 'ack', 'expire', 'dead')),
small AS (SELECT h, account, topic, door, sum(published) published, sum(delivered) delivered,
                 sum(acked) acked, sum(expired) expired, sum(dead) dead,
                 sum(bytes_in) bytes_in, sum(bytes_out) bytes_out
          FROM f GROUP BY h, account, topic, door),
spread AS (
  SELECT 'total' dim, '' key, small.* FROM small
  UNION ALL SELECT 'account', account, small.* FROM small
  UNION ALL SELECT 'door', door, small.* FROM small
  UNION ALL SELECT 'topic', topic, small.* FROM small
  UNION ALL SELECT 'subtree', array_to_string((string_to_array(topic, '/'))[1:n], '/'), small.*
            FROM small, generate_series(2, cardinality(string_to_array(topic, '/'))) n)
SELECT dim, key, h, sum(published), sum(delivered), sum(acked), sum(expired), sum(dead),
       sum(bytes_in), sum(bytes_out)
FROM spread GROUP BY GROUPING SETS ((dim, key, h), (dim, key))
"""
SQL_LATENCY = """
WITH e AS (SELECT * FROM broker_usageevent WHERE at >= %(s)s AND at < %(e)s AND kind = 'ack'),
p AS (SELECT DISTINCT ON (smuid) smuid, at, topic FROM broker_usageevent
      WHERE kind = 'publish' AND at < %(e)s AND smuid IN (SELECT smuid FROM e))
SELECT p.topic, count(*), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
       (ORDER BY extract(epoch FROM e.at - p.at) * 1000)
FROM e JOIN p ON p.smuid = e.smuid GROUP BY p.topic
"""


def _sql_reference(url: str) -> tuple[float, dict[str, int]]:
    import psycopg

    bounds = {"s": f"{DAY} 00:00:00+00", "e": f"{DAY + timedelta(days=1)} 00:00:00+00"}
    t0 = time.monotonic()
    with psycopg.connect(url) as conn:
        conn.execute("SET work_mem = '256MB'")
        rows = conn.execute(SQL_REFERENCE, bounds).fetchall()
        conn.execute(SQL_LATENCY, bounds).fetchall()
    seconds = time.monotonic() - t0
    total = next(r for r in rows if r[0] == "total" and r[2] is None)
    return seconds, {"rows": len(rows), "published": int(total[3]), "acked": int(total[5]),
                     "dead": int(total[7])}


def _report_totals(url: str) -> dict[str, object]:
    import psycopg

    with psycopg.connect(url) as conn:
        report = conn.execute(
            "SELECT id, events, export_seconds, job_seconds FROM spark_jobs_usagereport "
            "WHERE day = %s", [DAY]).fetchone()
        total = conn.execute(
            "SELECT published, acked, dead FROM spark_jobs_usagerow WHERE report_id = %s "
            "AND dim = 'total' AND hour IS NULL", [report[0]]).fetchone()
        rows = conn.execute("SELECT count(*) FROM spark_jobs_usagerow WHERE report_id = %s",
                            [report[0]]).fetchone()[0]
    return {"events": report[1], "export": report[2], "job": report[3], "rows": rows,
            "published": total[0], "acked": total[1], "dead": total[2]}


# --------------------------------------------------------------------------- standalone


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def _start_standalone(log_dir: Path) -> tuple[str, list[subprocess.Popen]]:
    """A master on a free port and two 1-core workers; returns its URL and the processes."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    master_log = log_dir / "master.log"
    procs = [subprocess.Popen(
        [_spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
         "--port", str(port), "--webui-port", "0"], env=env,
        stdout=master_log.open("w"), stderr=subprocess.STDOUT)]
    url = f"spark://127.0.0.1:{port}"
    for i in range(2):
        procs.append(subprocess.Popen(
            [_spark_class(), "org.apache.spark.deploy.worker.Worker", "--cores", "1",
             "--memory", "2g", "--webui-port", "0", "--work-dir", str(log_dir / f"w{i}"), url],
            env=env, stdout=(log_dir / f"worker{i}.log").open("w"), stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 120
    while len(re.findall("Registering worker", master_log.read_text())) < 2:
        if time.monotonic() > deadline:
            raise RuntimeError(f"standalone workers did not register:\n{master_log.read_text()}")
        time.sleep(1)
    return url, procs


def main(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.events.split(",") if s]
    lines = [f"## python -m bench reports --events {args.events}"
             f"{' --standalone' if args.standalone else ''} ({time.strftime('%Y-%m-%d %H:%M')}"
             " UTC; shared, loaded 2-core machine)", "",
             "| events | master | generate s | export s | job s | runreport wall s | peak RSS MB "
             "| job s per M events | SQL reference s | totals match |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    cluster: list[subprocess.Popen] = []
    work = Path(tempfile.mkdtemp(prefix="bench-reports-"))
    master = args.master
    try:
        if args.standalone:
            master, cluster = _start_standalone(work)
            print(f"standalone master {master} with 2 workers", flush=True)
        for n in sizes:
            url, name = _create_pg_database()
            try:
                env = {**base_env(work / name, url), "SPARK_DRIVER_MEMORY": args.driver_memory,
                       "SMQP_USAGE_RETENTION_DAYS": "100000",
                       "SMQP_REPORTS_DIR": str(work / "exports"),
                       "SMQP_BEAT_SCHEDULER": "celery.beat:PersistentScheduler"}
                (work / name).mkdir(parents=True, exist_ok=True)
                subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], env=env,
                               cwd=ROOT, check=True, capture_output=True)
                gen = _generate(url, n)
                print(f"{n:,} events generated in {gen:.1f} s", flush=True)
                wall, peak, _ = _run_report(env, master)
                got = _report_totals(url)
                print(f"  export {got['export']:.1f} s, job {got['job']:.1f} s, wall {wall:.1f} "
                      f"s, peak RSS {peak / 2**20:.0f} MB", flush=True)
                sql_s, ref = (None, {}) if args.no_sql else _sql_reference(url)
                match = "-" if not ref else str(all(
                    ref[k] == got[k] for k in ("published", "acked", "dead", "rows")))
                if ref:
                    print(f"  SQL reference {sql_s:.1f} s; totals {ref} vs report "
                          f"{ {k: got[k] for k in ('published', 'acked', 'dead', 'rows')} }",
                          flush=True)
                lines.append(
                    f"| {got['events']:,} | {master} | {gen:.1f} | {got['export']:.1f} | "
                    f"{got['job']:.1f} | {wall:.1f} | {peak / 2**20:.0f} | "
                    f"{got['job'] / (got['events'] / 1e6):.2f} | "
                    f"{'-' if sql_s is None else f'{sql_s:.1f}'} | {match} |")
            finally:
                _drop_pg_database(name)
    finally:
        for proc in reversed(cluster):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    text = "\n".join(lines) + "\n\n"
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(text)
    return 0


__all__ = ["PG_ADMIN_URL", "add_arguments", "main"]
