from django.apps import AppConfig


class TopicsConfig(AppConfig):
    name = "topics"
    verbose_name = "Topics"

    def ready(self) -> None:
        from . import signals  # noqa: F401
