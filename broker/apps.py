from django.apps import AppConfig


class BrokerConfig(AppConfig):
    name = "broker"
    verbose_name = "Messaging"

    def ready(self) -> None:
        from broker.heap import freeze_at_exit

        freeze_at_exit()
