from django.apps import AppConfig


class ApiConfig(AppConfig):
    """The REST door (../shared/design/REST-API.md): DRF views over the broker's services."""

    name = "api"
    verbose_name = "REST API"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_delete, post_save

        from .models import ApiToken
        from .tokens import forget_checked

        # A token or an account saved or deleted here is read again at once (elsewhere
        # within SMQP_API_TOKEN_CACHE_SECONDS).
        for model in (ApiToken, get_user_model()):
            post_save.connect(forget_checked, sender=model, dispatch_uid=f"api-{model}-save")
            post_delete.connect(forget_checked, sender=model,
                                dispatch_uid=f"api-{model}-delete")
