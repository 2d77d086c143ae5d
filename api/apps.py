from django.apps import AppConfig


class ApiConfig(AppConfig):
    """The REST door (../shared/design/REST-API.md): DRF views over the broker's services."""

    name = "api"
    verbose_name = "REST API"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import schema  # noqa: F401  (registers the bearer scheme with drf-spectacular)
