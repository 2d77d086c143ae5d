"""Every account gets its account topic ``/accounts/<name>`` the moment it is created."""

from django.db.models.signals import post_save
from django.dispatch import receiver

from .models import Account


@receiver(post_save, sender=Account, dispatch_uid="accounts.create_account_topic")
def create_account_topic(sender, instance: Account, created: bool, raw: bool = False, **kwargs):
    if raw:
        return
    from broker.services.accounts import ensure_account_topic

    ensure_account_topic(instance)
