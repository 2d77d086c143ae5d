"""The code that runs inside Spark: PySpark only, never Django (checked by import-linter and
by ``tests/integration/reports/test_job.py``), so it runs the same on a driver with no broker
settings.

Its input is the Parquet files of :mod:`spark_jobs.export`; its output plain Python values
that :mod:`spark_jobs.runner` stores as Django models.
"""
