from django.apps import AppConfig


class UalConfig(AppConfig):
    name = "ual"
    verbose_name = "User Access Lists"
