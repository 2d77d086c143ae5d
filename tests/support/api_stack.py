"""A real broker for the REST API tests: a fresh database, the SMQP listener and Daphne
(the REST door) on it, and a bearer token per account (``manage.py token``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.conftest import (
    BrokerProcess,
    accounts_script,
    daphne,
    fresh_database,
    listener,
    run_manage,
)
from tests.support.smqp_session import Session
from tests.support.timing import scaled


@dataclass
class ApiStack:
    http: str
    smqp: BrokerProcess
    env: dict[str, str]
    tokens: dict[str, str] = field(default_factory=dict)

    def client(self, user: str = "root") -> httpx.Client:
        return httpx.Client(base_url=self.http + "/api/v1/", timeout=scaled(60),
                            headers={"Authorization": f"Bearer {self.tokens[user]}"})

    def session(self, user: str = "root") -> Session:
        return Session(self.smqp.host, self.smqp.port, user)

    def token(self, user: str, name: str = "tests") -> str:
        return run_manage(self.env, "token", "create", user, name).stdout.strip()


@contextmanager
def api_stack(backend: str, base: Path, setup: str = "",
              users: tuple[str, ...] = ("root", "bob", "alice"),
              extra_env: dict[str, str] | None = None) -> Iterator[ApiStack]:
    with fresh_database(backend, base, extra_env) as env:
        # The accounts, the setup and a token each in one process (a start costs ~2 s of CPU).
        out = run_manage(env, "shell", "--no-imports", "-c",
                         accounts_script(*users) + setup + _tokens_script(users)).stdout
        tokens = dict(line.split()[1:3] for line in out.splitlines()
                      if line.startswith("TOKEN "))
        # Both start after the setup: their caches hold it from the start.
        with listener(env, base, name=f"api-{backend}") as smqp, daphne(env, base) as url:
            yield ApiStack(url, smqp, env, tokens)


def _tokens_script(users: tuple[str, ...], name: str = "tests") -> str:
    """Python for ``manage.py shell``: ``manage.py token create USER NAME`` for each user,
    printed as ``TOKEN user text`` lines."""
    return (
        "\nimport io as _io\n"
        "from django.core.management import call_command as _call\n"
        f"for _user in {list(users)!r}:\n"
        "    _out = _io.StringIO()\n"
        f"    _call('token', 'create', _user, {name!r}, stdout=_out)\n"
        "    print('TOKEN', _user, _out.getvalue().strip())\n"
    )
