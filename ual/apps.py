from django.apps import AppConfig


class UalConfig(AppConfig):
    name = "ual"
    verbose_name = "User Access Lists"

    def ready(self) -> None:
        from . import signals

        signals.connect_membership_signal()
