"""Shared fixtures. ``broker_server`` runs the real listener (``manage.py runsmqp``) as a
subprocess on a free port, against a database of its own, on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("SMQP_TEST_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(autouse=True)
def _fresh_topic_tree():
    """Test transactions roll back without commit hooks: start each test from the database."""
    from topics import tree

    tree.reset()
    yield
    tree.reset()


@dataclass
class BrokerProcess:
    """A running ``runsmqp`` and the environment it was started with."""

    host: str
    port: int
    env: dict[str, str]
    proc: subprocess.Popen
    var_dir: Path
    log_path: Path
    extra: dict = field(default_factory=dict)

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run_manage(self.env, *args, check=check)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None


def run_manage(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    if check and result.returncode != 0:
        command = " ".join(args)
        raise AssertionError(f"manage.py {command} failed:\n{result.stdout}\n{result.stderr}")
    return result


def base_env(var_dir: Path, database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SMQP_", "DJANGO_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="broker.settings",
        SMQP_VAR_DIR=str(var_dir),
        DATABASE_URL=database_url,
        REDIS_URL=os.environ.get("SMQP_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"),
        SMQP_CHANNEL_PREFIX=f"smqp-e2e-{uuid.uuid4().hex[:8]}",
        SMQP_CACHE_PREFIX=f"smqp-e2e-{uuid.uuid4().hex[:8]}",
        SMQP_SERVER_CONTEXT="test.example.net",
        SMQP_PBKDF2_ITERATIONS="4096",
        SMQP_SHUTDOWN_GRACE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def accounts_script(*names: str) -> str:
    """Python for ``manage.py shell -c`` that creates accounts with the password ``pw``;
    ``root`` is a superuser (and staff), the others plain accounts."""
    return (
        "from accounts.models import Account\n"
        f"for name in {list(names)!r}:\n"
        "    a = Account(username=name, is_superuser=name == 'root', is_staff=name == 'root')\n"
        "    a.set_password('pw')\n"
        "    a.save()\n"
    )


def start_listener(env: dict[str, str], var_dir: Path, *extra_args: str,
                   name: str = "smqp") -> BrokerProcess:
    log_path = var_dir / f"{name}-{uuid.uuid4().hex[:6]}.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runsmqp", "--host", "127.0.0.1",
         "--port", "0", *extra_args],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        match = re.search(r"SMQP listening on ([\d.]+):(\d+)", log_path.read_text())
        if match:
            return BrokerProcess(match[1], int(match[2]), env, proc, var_dir, log_path)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"runsmqp did not start:\n{log_path.read_text()}")


def stop_process(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM (the server's own clean stop), then SIGKILL if it has not ended in time."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def daphne(env: dict[str, str], base: Path, log_name: str = "daphne.log",
           timeout: float = 60) -> Iterator[str]:
    """Daphne serving ``broker.asgi`` (the admin, REST, XMPP), as ``runbroker`` starts it,
    logging to ``base/log_name``; yields its base URL once the admin login page answers."""
    port = free_port()
    log_path = base / log_name
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
             "broker.asgi:application"],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/admin/login/", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("daphne did not start:\n" + log_path.read_text())
            time.sleep(0.2)
        yield url
    finally:
        stop_process(proc)


def stop_listener(broker: BrokerProcess) -> None:
    stop_process(broker.proc)


@contextmanager
def listener(env: dict[str, str], var_dir: Path, *extra_args: str,
             name: str = "smqp") -> Iterator[BrokerProcess]:
    """:func:`start_listener`, and :func:`stop_listener` on the way out (a listener the
    test killed meanwhile is fine)."""
    broker = start_listener(env, var_dir, *extra_args, name=name)
    try:
        yield broker
    finally:
        stop_listener(broker)


def _pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
            return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def database_urls(tmp_path_factory) -> Iterator[dict[str, str]]:
    """A fresh, migrated database per backend: SQLite always, PostgreSQL as well. `make test`
    starts PostgreSQL when it is down, so a missing server is an error here, not a skip."""
    import psycopg

    base = tmp_path_factory.mktemp("db")
    urls = {"sqlite": f"sqlite:///{base / 'e2e.sqlite3'}"}
    if not _pg_available():
        raise RuntimeError(f"PostgreSQL is not reachable at {PG_ADMIN_URL} (make test starts it)")
    dbname = f"smqp_e2e_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    urls["postgres"] = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + dbname
    for backend, url in urls.items():
        env = base_env(base / backend, url)
        (base / backend).mkdir(exist_ok=True)
        run_manage(env, "migrate", "--noinput")
        run_manage(env, "createaccount", "bob", "--password", "pw")
        run_manage(env, "createaccount", "jtegen", "--password", "rowe7kuy")
    yield urls
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def broker_server(request, database_urls, tmp_path_factory) -> Iterator[BrokerProcess]:
    """The real listener on a free port, once per backend for the whole session."""
    var_dir = tmp_path_factory.mktemp(f"var-{request.param}")
    env = base_env(var_dir, database_urls[request.param])
    broker = start_listener(env, var_dir)
    broker.extra["backend"] = request.param
    yield broker
    stop_listener(broker)


@pytest.fixture
def fresh_var(tmp_path) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir=tmp_path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _fresh_database(backend: str, base: Path) -> tuple[str, str | None]:
    """A new empty database for ``backend``: (url, postgres name to drop or None)."""
    if backend == "sqlite":
        return f"sqlite:///{base / 'fresh.sqlite3'}", None
    import psycopg

    if not _pg_available():
        raise RuntimeError(f"PostgreSQL is not reachable at {PG_ADMIN_URL} (make test starts it)")
    dbname = f"smqp_fresh_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + dbname, dbname


@contextmanager
def fresh_database(backend: str, base: Path,
                   extra_env: dict[str, str] | None = None) -> Iterator[dict[str, str]]:
    """A new, migrated database for ``backend`` (dropped afterwards): the environment of a
    process that uses it (``base_env`` plus ``extra_env``)."""
    import psycopg

    url, pg_name = _fresh_database(backend, base)
    env = {**base_env(base, url), **(extra_env or {})}
    try:
        run_manage(env, "migrate", "--noinput")
        yield env
    finally:
        if pg_name:
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')


@contextmanager
def fresh_listener(backend: str, base: Path,
                   extra_env: dict[str, str] | None = None) -> Iterator[BrokerProcess]:
    """A listener on a database of its own (``backend``), with the superuser ``root`` and
    the plain accounts ``bob``, ``alice`` and ``jtegen`` (password ``pw``); ``extra_env``
    adds settings for it."""
    with fresh_database(backend, base, extra_env) as env:
        run_manage(env, "shell", "--no-imports", "-c",
                   accounts_script("root", "bob", "alice", "jtegen"))
        with listener(env, base, name=f"fresh-{backend}") as broker:
            broker.extra["backend"] = backend
            yield broker


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def fresh_broker(request, tmp_path_factory) -> Iterator[BrokerProcess]:
    """:func:`fresh_listener` for one test module, on each backend."""
    with fresh_listener(request.param, tmp_path_factory.mktemp(f"fresh-{request.param}")) as b:
        yield b
