"""``runreport --master spark://…`` on a Spark standalone cluster of the broker nodes
(deploy/local.py ``start_spark``: the master on the first node, a worker on each), run on
another node as an operator would. The report's files (the exported day, the job's result)
are on SMQP_REPORTS_DIR, one directory every node reads: the driver writes the input there,
the executors on the workers read it and write their result beside it."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime, time

import psycopg
import pytest

from deploy.local import FRONT, HUB, SPARK_PORTS
from tests.support.smqp_session import Session
from tests.support.timing import scaled

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.timeout(900)]

TOPIC = "/fan"


@pytest.fixture(scope="module")
def spark(cluster):
    cluster.start_spark()
    try:
        yield cluster.spark_master
    finally:
        cluster.stop_spark()


def test_runreport_on_a_spark_standalone_cluster_of_the_nodes(cluster, spark):
    with Session(HUB, FRONT["smqp"], "pub", timeout=60) as s:
        for i in range(20):
            assert s.publish(TOPIC, f"report-{i}").code == 200
    day = datetime.now(UTC).date()
    driver = cluster.nodes[1]
    out = cluster.manage_on(driver, "runreport", "--date", day.isoformat(), "--partial",
                            "--again", "--master", spark)
    print(out)
    assert f"running the Spark job on {spark}" in out
    assert "events reported" in out

    start = datetime.combine(day, time(0), tzinfo=UTC)
    with psycopg.connect(cluster.database_url) as db:
        report_id, state, master, until, error = db.execute(
            "SELECT id, state, master, until, error FROM spark_jobs_usagereport "
            "WHERE day = %s", (day,)).fetchone()
        assert (state, error) == ("done", ""), error
        assert master == spark
        # Computed by the executors: the day's publishes to the topic, as the store has them.
        (published,) = db.execute(
            "SELECT published FROM spark_jobs_usagerow WHERE report_id = %s AND dim = 'topic' "
            "AND key = %s AND hour IS NULL", (report_id, TOPIC)).fetchone()
        (stored,) = db.execute(
            "SELECT count(*) FROM broker_usageevent WHERE kind = 'publish' AND topic = %s "
            "AND at >= %s AND at < %s", (TOPIC, start, until)).fetchone()
    assert published == stored >= 20

    # The job ran on the workers: the application is the master's, with an executor on each
    # node's worker (each left its directory in the worker's work dir).
    url = f"http://{cluster.nodes[0].addr}:{SPARK_PORTS['master_ui']}/json/"
    with urllib.request.urlopen(url, timeout=scaled(10)) as reply:
        apps = json.load(reply)["completedapps"]
    assert [a["name"] for a in apps].count("smqp-usage-report") >= 1, apps
    ran_on = [n.name for n in cluster.nodes
              if any((cluster.base / n.name / "spark-work").glob("app-*/*"))]
    assert ran_on == [n.name for n in cluster.nodes], ran_on
