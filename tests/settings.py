"""Settings for the test run: the project's own settings, pointed at test-only Redis state."""

import os

os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("SMQP_CHANNEL_PREFIX", "smqp-test")
os.environ.setdefault("SMQP_CACHE_PREFIX", "smqp-test")
# Fewer PBKDF2 rounds keep hundreds of logins fast; the algorithm and format are unchanged.
os.environ.setdefault("SMQP_PBKDF2_ITERATIONS", "4096")
# The report jobs' JVMs with the quick JIT compiler only: a test's Spark job, a few seconds
# long, then takes ~40% less CPU; the results are the same.
os.environ.setdefault("SPARK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")

from broker.settings import *  # noqa: F403
