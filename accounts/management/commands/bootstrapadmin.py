"""``manage.py bootstrapadmin``: on a fresh database, create the superuser ``admin`` with a
random password kept in ``var/admin-password`` (mode 0600), so ``make run`` ends with a
working admin login. Does nothing once any superuser exists."""

from __future__ import annotations

import os
import secrets

from django.conf import settings
from django.core.management.base import BaseCommand

from accounts.models import Account


class Command(BaseCommand):
    help = "Create the first superuser (admin) with a random password if there is none."
    # A one-shot operator command: `manage.py check` and runbroker run the checks.
    requires_system_checks: list[str] = []

    def handle(self, *args, **options) -> None:
        path = settings.VAR_DIR / "admin-password"
        if Account.objects.filter(is_superuser=True).exists():
            if path.exists():
                self.stdout.write(f"admin login: admin / the password in {path}")
            return
        password = secrets.token_urlsafe(12)
        account = Account(username="admin", is_superuser=True, is_staff=True)
        account.set_password(password)
        account.save()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(password + "\n")
        self.stdout.write(f"created superuser admin; password {password} (kept in {path})")
