"""The nightly usage report of one day, computed by Spark from the exported Parquet files.

Every event becomes one *fact* (its hour, account, topic, door and the counters it adds to);
facts are summed per (hour, account, topic, door) first, which leaves few rows however many
events there were, and only those are spread over the report's dimensions (the whole server,
each account, each door, each exact topic and each topic subtree) and summed again per hour
and per day (one GROUPING SETS pass).

Attribution: a publish counts for its publisher, topic and door, its ``receivers`` as
delivered (deliveries made when it was stored); an ACK for the account that ACKed and the
door it ACKed through, the topic and size of the message it ACKs (joined on smuid with the
publish event, of this day or an earlier one), its latency is ACK time minus publish time;
an expiry and a dead letter for the message's topic, publisher and the door it was published
through (a dead letter: for the account it died for).

Latency percentiles use Spark's ``percentile_approx`` with :data:`ACCURACY`: the value
returned for percentile p is a latency of the data whose rank is within ``n / ACCURACY`` of
``p * n`` (exact for days with fewer ACKs per topic than ACCURACY).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from .schema import DEFAULT_DOOR, EVENTS_FILE, META_FILE, PRIOR_FILE, UNKNOWN_TOPIC

ACCURACY = 10_000
PERCENTILES = (0.5, 0.95, 0.99)
METRICS = ("published", "delivered", "acked", "expired", "dead", "republished",
           "bytes_in", "bytes_out")
TOP = 10


def session(master: str = "local[*]", app: str = "smqp-usage-report",
            shuffle_partitions: int = 8, driver_memory: str | None = None,
            java_options: str | None = None) -> SparkSession:
    """A Spark session for the reports: UTC (hours are UTC hours), no web UI and no console
    progress bars, few shuffle partitions (the aggregated data is small; 200 would cost
    more than the work). ``java_options`` go to the driver's JVM, which PySpark starts here,
    and to the executors' (``SPARK_JAVA_OPTIONS``)."""
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a line per gateway call otherwise
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions)))
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    if java_options:
        builder = (builder.config("spark.driver.extraJavaOptions", java_options)
                   .config("spark.executor.extraJavaOptions", java_options))
    return builder.getOrCreate()


def _facts(events: DataFrame, prior: DataFrame) -> DataFrame:
    """One row per counted event: hour, account, topic, door, the METRICS, latency_ms."""
    pubs = (events.where(F.col("kind") == "publish")
            .select("smuid", "at", "account", "topic", "bytes", "door")
            .unionByName(prior.select("smuid", "at", "account", "topic", "bytes", "door"))
            .dropDuplicates(["smuid"])
            .select(F.col("smuid").alias("p_smuid"), F.col("at").alias("p_at"),
                    F.col("account").alias("p_account"), F.col("topic").alias("p_topic"),
                    F.col("bytes").alias("p_bytes"), F.col("door").alias("p_door")))
    counted = events.where(F.col("kind").isin("publish", "republish", "ack", "expire", "dead"))
    joined = counted.join(pubs, counted.smuid == pubs.p_smuid, "left")
    kind = F.col("kind")

    def when(k: str, value: Any) -> Any:
        return F.when(kind == k, value).otherwise(F.lit(0)).cast("long")

    def nonempty(c: str) -> Any:
        return F.when(F.col(c) != "", F.col(c))

    account = (F.when(kind == "dead", F.coalesce(F.col("dead_account"), F.lit("")))
               .when(kind == "expire", F.coalesce(F.col("p_account"), F.col("account")))
               .otherwise(F.col("account")))
    topic = F.coalesce(nonempty("topic"), F.col("p_topic"), F.lit(UNKNOWN_TOPIC))
    # Publishes and ACKs name the door that took them; an expiry or a dead letter is the
    # fate of a message, counted for the door it came in by.
    door = F.coalesce(
        F.when(kind.isin("expire", "dead"), F.coalesce(nonempty("p_door"), nonempty("door")))
        .otherwise(nonempty("door")),
        F.lit(DEFAULT_DOOR))
    latency = F.when((kind == "ack") & F.col("p_at").isNotNull(),
                     (F.unix_micros(F.col("at")) - F.unix_micros(F.col("p_at"))) / 1000.0)
    return joined.select(
        F.hour("at").alias("hour"),
        account.alias("account"),
        topic.alias("topic"),
        door.alias("door"),
        when("publish", 1).alias("published"),
        when("publish", F.coalesce(F.col("receivers"), F.lit(0))).alias("delivered"),
        when("ack", 1).alias("acked"),
        when("expire", 1).alias("expired"),
        when("dead", 1).alias("dead"),
        when("republish", 1).alias("republished"),
        when("publish", F.col("bytes")).alias("bytes_in"),
        when("ack", F.coalesce(F.col("p_bytes"), F.lit(0))).alias("bytes_out"),
        latency.alias("latency_ms"),
        F.coalesce(F.col("reason"), F.lit("")).alias("reason"),
        kind.alias("kind"),
    )


def _usage(facts: DataFrame, out_dir: str) -> list[dict[str, Any]]:
    """Per dimension and key, per hour and for the whole day (hour None)."""
    sums = [F.sum(m).alias(m) for m in METRICS]
    small = facts.groupBy("hour", "account", "topic", "door").agg(*sums)
    parts = F.split(F.col("topic"), "/")
    # "/a/b/c" -> "/a", "/a/b", "/a/b/c" (a topic path starts with "/": parts[0] is "").
    prefixes = F.when(
        F.col("topic").startswith("/") & (F.size(parts) > 1),
        F.transform(F.sequence(F.lit(2), F.size(parts)),
                    lambda i: F.concat_ws("/", F.slice(parts, 1, i))),
    ).otherwise(F.array(F.col("topic")))
    dims = F.concat(
        F.array(
            F.struct(F.lit("total").alias("dim"), F.lit("").alias("key")),
            F.struct(F.lit("account").alias("dim"), F.col("account").alias("key")),
            F.struct(F.lit("door").alias("dim"), F.col("door").alias("key")),
            F.struct(F.lit("topic").alias("dim"), F.col("topic").alias("key")),
        ),
        F.transform(prefixes, lambda p: F.struct(F.lit("subtree").alias("dim"),
                                                 p.alias("key"))),
    )
    spread = small.select(F.explode(dims).alias("d"), "hour", *METRICS).select(
        F.col("d.dim").alias("dim"), F.col("d.key").alias("key"), "hour", *METRICS)
    spread.createOrReplaceTempView("usage_spread")
    sums_sql = ", ".join(f"SUM({m}) AS {m}" for m in METRICS)
    result = spread.sparkSession.sql(
        f"SELECT dim, key, hour, {sums_sql} FROM usage_spread "
        "GROUP BY GROUPING SETS ((dim, key, hour), (dim, key))")
    # Tens of thousands of rows or more (hours x keys): through a Parquet file and pyarrow,
    # many times faster than collect(), which converts row by row over py4j.
    path = os.path.join(out_dir, "usage-result.parquet")
    result.write.mode("overwrite").parquet(path)
    return pq.read_table(path).to_pylist()


def _latency(facts: DataFrame) -> list[dict[str, Any]]:
    """publish→ACK latency per topic, and over every topic (topic "")."""
    acks = facts.where(F.col("latency_ms").isNotNull())
    pct = F.percentile_approx("latency_ms", list(PERCENTILES), ACCURACY)
    aggs = [F.count("*").alias("count"), pct.alias("p"), F.max("latency_ms").alias("max")]
    rows = acks.groupBy("topic").agg(*aggs).collect()
    rows += acks.agg(*aggs).where(F.col("count") > 0).withColumn("topic", F.lit("")).collect()
    return [{"topic": r["topic"], "count": r["count"], "p50": r["p"][0], "p95": r["p"][1],
             "p99": r["p"][2], "max": r["max"]} for r in rows]


def _dead(facts: DataFrame) -> list[dict[str, Any]]:
    rows = (facts.where(F.col("kind") == "dead").groupBy("reason", "topic")
            .agg(F.count("*").alias("count")).collect())
    return [r.asDict() for r in rows]


def _peaks(events: DataFrame, kinds: tuple[str, str], at_start: int) -> dict[str, Any]:
    """The most open at once over the day and in each hour: ``at_start`` open when the day
    began, +1 per event of kinds[0], -1 per event of kinds[1], in event order."""
    up, down = kinds
    deltas = events.where(F.col("kind").isin(up, down)).select(
        "id", "at", F.hour("at").alias("hour"),
        F.when(F.col("kind") == up, 1).otherwise(-1).alias("delta"))
    # One ordered window over the day's logins or subscriptions: few rows next to the
    # message events, so one partition is fine here.
    level = deltas.withColumn(
        "level", F.sum("delta").over(Window.orderBy("at", "id")
                                     .rowsBetween(Window.unboundedPreceding, 0)) + at_start)
    per_hour = {r["hour"]: (r["peak"], r["last"]) for r in level.groupBy("hour").agg(
        F.max("level").alias("peak"),
        F.max_by("level", F.struct("at", "id")).alias("last")).collect()}
    hours, current = [], at_start
    for hour in range(24):
        peak, last = per_hour.get(hour, (current, current))
        hours.append(max(peak, current))  # open when the hour began count too
        current = last
    return {"day": max(hours), "hours": hours, "end": current}


def _top(usage: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Top topics by messages published, accounts by messages published and ACKed."""
    day = [r for r in usage if r["hour"] is None]
    top: list[dict[str, Any]] = []
    ranked = {
        "topic": sorted(((r["published"], r["key"]) for r in day if r["dim"] == "topic"),
                        key=lambda t: (-t[0], t[1])),
        "account": sorted(((r["published"] + r["acked"], r["key"]) for r in day
                           if r["dim"] == "account" and r["key"]),
                          key=lambda t: (-t[0], t[1])),
    }
    for what, items in ranked.items():
        for rank, (value, key) in enumerate([i for i in items if i[0] > 0][:TOP], 1):
            top.append({"what": what, "rank": rank, "key": key, "value": value})
    return top


def compute(spark: SparkSession, input_dir: str) -> dict[str, Any]:
    """The report of the day exported to ``input_dir``, as plain values."""
    with open(os.path.join(input_dir, META_FILE)) as f:
        meta = json.load(f)
    events = spark.read.parquet(os.path.join(input_dir, EVENTS_FILE))
    prior = spark.read.parquet(os.path.join(input_dir, PRIOR_FILE))
    facts = _facts(events, prior).cache()
    try:
        usage = _usage(facts, input_dir)
        result = {
            "events": meta["events"],
            "usage": usage,
            "latency": _latency(facts),
            "dead": _dead(facts),
            "top": _top(usage),
            "sessions": _peaks(events, ("login", "logout"), meta["sessions_at_start"]),
            "subscribers": _peaks(events, ("subscribe", "unsubscribe"),
                                  meta["subscribers_at_start"]),
        }
    finally:
        facts.unpersist()
    return result
