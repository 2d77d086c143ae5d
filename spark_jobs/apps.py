from django.apps import AppConfig


class SparkJobsConfig(AppConfig):
    name = "spark_jobs"
    verbose_name = "Usage reports"
