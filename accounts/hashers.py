"""Password hashing: Django's PBKDF2-SHA256, with an operator-settable iteration count.

The algorithm name stays ``pbkdf2_sha256`` so every stored hash remains readable by stock
Django, and SCRAM-SHA-256 can be served from the same salt, iteration count and derived key.
"""

from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher


class SMQPPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    def __init__(self) -> None:
        configured = getattr(settings, "SMQP_PBKDF2_ITERATIONS", None)
        if configured:
            # SCRAM (RFC 7677, and the scramp library) refuses fewer than 4096 rounds.
            self.iterations = max(int(configured), 4096)
