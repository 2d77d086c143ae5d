"""Shared fixtures. ``broker_server`` runs the real listener (``manage.py runsmqp``) as a
subprocess on a free port, against a database of its own, on SQLite and on PostgreSQL."""

from __future__ import annotations

import contextlib
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

from tests.support.timing import SLOWDOWN, scaled

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("SMQP_TEST_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config) -> None:
    """``SMQP_TEST_SLOWDOWN`` scales the pytest-timeout limit (tests/support/timing.py).
    Without xdist (``-p no:xdist``) its ``xdist_group`` marker is declared here, so that a
    module marking itself still runs under ``--strict-markers``."""
    if not config.pluginmanager.hasplugin("xdist"):
        config.addinivalue_line("markers", "xdist_group(name): run with xdist's loadgroup")
    config.pluginmanager.register(_LoadGroupCheck(), "smqp-loadgroup-check")
    if SLOWDOWN != 1 and config.getoption("timeout", None) is None:
        ini = config.getini("timeout")
        if ini:
            config.option.timeout = float(ini) * SLOWDOWN


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items) -> None:
    """A test that uses a module-scoped fixture (a broker or stack for the module, started
    once per backend) runs on the worker that runs the module's other tests on that backend:
    ``--dist loadgroup`` (``make test``) then starts that broker once, not once per worker
    that happened to get one of its tests. And ``SMQP_TEST_SLOWDOWN`` scales the per-test
    ``timeout`` marks."""
    # Without xdist (``-p no:xdist``: the cluster tests) there is nothing to group.
    grouping = config.pluginmanager.hasplugin("xdist")
    for item in items:
        group = _module_group(item) if grouping else None
        if group and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    if SLOWDOWN == 1:
        return
    for item in items:
        mark = item.get_closest_marker("timeout")
        if mark is not None and mark.args:
            item.add_marker(pytest.mark.timeout(scaled(mark.args[0]), **mark.kwargs),
                            append=False)


class _LoadGroupCheck:
    """Refuse to run when ``--dist loadgroup`` is on but the groups did not reach the node
    ids, which is all xdist's scheduler reads: each module broker would then start on every
    worker that gets one of its tests, silently (pytest 9.2 with xdist 3.8: pytest-xdist#1386)."""

    @pytest.hookimpl(trylast=True)  # after xdist's own hook has written the groups into node ids
    def pytest_collection_modifyitems(self, config, items) -> None:
        if not getattr(config.option, "loadgroup", False):  # set on xdist workers only
            return
        lost = [item.nodeid for item in items if item.get_closest_marker("xdist_group")
                and "@" not in item.nodeid.rsplit("]", 1)[-1]]
        if lost:
            message = (f"--dist loadgroup: {len(lost)} grouped tests lost their group (e.g. "
                       f"{lost[0]}): this pytest and pytest-xdist do not work together "
                       "(pyproject.toml pins pytest)")
            # On a worker, xdist reports only that it crashed: say why on the terminal too.
            os.write(2, f"\nERROR: {message}\n".encode())
            raise pytest.UsageError(message)


def _module_group(item) -> str | None:
    """``path::param-param`` for a test that uses a module-scoped fixture (the params are
    those of its module-scoped fixtures, e.g. the backend), else None."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    params = getattr(getattr(item, "callspec", None), "params", {})
    scoped, ids = False, []
    for name in item.fixturenames:
        defs = info.name2fixturedefs.get(name)
        if defs and defs[-1].scope == "module":
            scoped = True
            if name in params:
                ids.append(str(params[name]))
    if not scoped:
        return None
    return item.nodeid.split("::", 1)[0] + ("::" + "-".join(ids) if ids else "")


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
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=scaled(300),
    )
    if check and result.returncode != 0:
        command = " ".join(args)
        raise AssertionError(f"manage.py {command} failed:\n{result.stdout}\n{result.stderr}")
    return result


def query_database(env: dict[str, str], sql: str, params: tuple = ()) -> list[tuple]:
    """The rows of one SQL query on the database of ``env`` (its ``DATABASE_URL``), read
    straight from this process: a check of what a server stored, without the ~2 s of CPU a
    ``manage.py shell`` start costs. ``%s`` placeholders on both backends."""
    url = env["DATABASE_URL"]
    if url.startswith("sqlite:///"):
        import sqlite3

        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"),
                                                timeout=scaled(30))) as conn:
            return conn.execute(sql.replace("%s", "?"), params).fetchall()
    with _postgres(env) as conn:
        return conn.execute(sql, params).fetchall()


def _postgres(env: dict[str, str], autocommit: bool = False):
    """A psycopg connection to the PostgreSQL database of ``env``."""
    import psycopg

    url = env["DATABASE_URL"].replace("postgres://", "postgresql://", 1)
    return psycopg.connect(url, autocommit=autocommit)


def execute_database(env: dict[str, str], sql: str, params: tuple = ()) -> None:
    """One statement that returns no rows (an UPDATE), committed, on PostgreSQL."""
    with _postgres(env, autocommit=True) as conn:
        conn.execute(sql, params)


@contextmanager
def rows_locked(env: dict[str, str], sql: str, params: tuple = ()) -> Iterator[None]:
    """The rows a ``SELECT ... FOR UPDATE`` picks on the PostgreSQL database of ``env``,
    locked by a connection of this process until the block ends: a server's UPDATE of them
    hangs meanwhile, as on a database that stopped answering."""
    with _postgres(env) as conn:
        conn.execute(sql, params)
        try:
            yield
        finally:
            conn.rollback()


def base_env(var_dir: Path, database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SMQP_", "DJANGO_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="broker.settings",
        SMQP_VAR_DIR=str(var_dir),
        DATABASE_URL=database_url,
        REDIS_URL=os.environ.get("SMQP_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"),
        SMQP_CHANNEL_PREFIX=f"smqp-e2e-{uuid.uuid4().hex[:8]}",
        SMQP_CACHE_PREFIX=f"smqp-e2e-{uuid.uuid4().hex[:8]}",
        # A Celery queue of its own: a test's worker runs its own beat's tasks, not those of
        # brokers other tests run beside it on the same Redis database.
        SMQP_CELERY_QUEUE=f"smqp-e2e-{uuid.uuid4().hex[:8]}",
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
    deadline = time.monotonic() + scaled(60)
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
            proc.wait(timeout=scaled(timeout))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` different free ports on loopback, for one test's servers. All are bound at
    once: the kernel may hand out a port again as soon as its socket is closed, and a loaded
    run once gave runbroker the same port for HTTP and SMQP (Daphne: "Address already in
    use")."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


@contextmanager
def daphne(env: dict[str, str], base: Path, log_name: str = "daphne.log",
           timeout: float = 60) -> Iterator[str]:
    """Daphne serving ``broker.asgi_server`` (the admin, REST, XMPP), as ``runbroker`` starts it,
    logging to ``base/log_name``; yields its base URL once the admin login page answers."""
    port = free_port()
    log_path = base / log_name
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
             "broker.asgi_server:application"],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + scaled(timeout)
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
    urls, pg_names = {}, []
    for backend in ("sqlite", "postgres"):
        (base / backend).mkdir(exist_ok=True)
        url, pg_name = _copy_template(backend, base / backend, _template(backend))
        urls[backend] = url
        pg_names += [pg_name] if pg_name else []
        # Both accounts in one process: each ``manage.py`` start costs ~2 s of CPU.
        manage_many(base_env(base / backend, url),
                    ("createaccount", "bob", "--password", "pw"),
                    ("createaccount", "jtegen", "--password", "rowe7kuy"))
    yield urls
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        for name in pg_names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
def fresh_database(backend: str, base: Path, extra_env: dict[str, str] | None = None,
                   setup: str = "", accounts: tuple[str, ...] = ()) -> Iterator[dict[str, str]]:
    """A new, migrated database for ``backend`` (dropped afterwards): the environment of a
    process that uses it (``base_env`` plus ``extra_env``). It is a copy of this process's
    migrated template (see :func:`_template`), not a new ``migrate``. ``setup`` (Python for
    ``manage.py shell``) has been run in it: once per test process, in the template, so a
    test that needs a fresh database made by the same setup pays no process start for it.
    ``accounts`` (made by :func:`accounts_script`) are in the template too, the same way."""
    with _database_copy(backend, base, extra_env, accounts=accounts, setup=setup) as env:
        yield env


@contextmanager
def fresh_listener(backend: str, base: Path, extra_env: dict[str, str] | None = None,
                   setup: str = "") -> Iterator[BrokerProcess]:
    """A listener on a database of its own (``backend``), with the superuser ``root`` and
    the plain accounts ``bob``, ``alice`` and ``jtegen`` (password ``pw``); ``extra_env``
    adds settings for it. ``setup`` (Python for ``manage.py shell``, ``Account`` in scope)
    is in the database before the listener starts (made once per test process in a template,
    see :func:`fresh_database`): the listener's caches hold it from the start."""
    accounts = ("root", "bob", "alice", "jtegen")
    with _database_copy(backend, base, extra_env, accounts, setup) as env, \
            listener(env, base, name=f"fresh-{backend}") as broker:
        broker.extra["backend"] = backend
        yield broker


def manage_many(env: dict[str, str], *commands: tuple[str, ...]) -> str:
    """Several management commands (each an argument tuple) in one ``manage.py`` process, in
    order, stopping at the first that fails: one Python start instead of one per command.
    Returns what they wrote to stdout."""
    script = (
        "import sys\n"
        "from django.core.management import call_command\n"
        f"for args in {[list(c) for c in commands]!r}:\n"
        "    call_command(*args, stdout=sys.stdout, stderr=sys.stderr)\n"
    )
    return run_manage(env, "shell", "--no-imports", "-c", script).stdout


# Migrated template databases, built once per test process (xdist worker) and copied for each
# fresh database: a SQLite file copy or a PostgreSQL ``CREATE DATABASE ... TEMPLATE`` takes well
# under a second, where ``migrate`` in a new process takes 4-10 s of a loaded 2-core machine.
# The key is (backend, accounts, the settings account creation reads, and with a setup script
# every setting the test adds, see _template_key); migrations read no SMQP_* setting, so one
# migrated template serves every ``extra_env``.
_TEMPLATES: dict[tuple, str] = {}
_TEMPLATE_PG_NAMES: list[str] = []
_TEMPLATE_ROOT: list[Path] = []
# Settings that differ per process by design, not per database: a template made with one
# value serves every other (the channel and cache prefixes, a Celery queue of the test's own).
_PER_PROCESS_SETTINGS = ("SMQP_CHANNEL_PREFIX", "SMQP_CACHE_PREFIX", "SMQP_CELERY_QUEUE")


def _template_key_env(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The settings that account creation reads (the password hash and its context)."""
    return tuple(sorted((k, v) for k, v in env.items()
                        if k in ("SMQP_PBKDF2_ITERATIONS", "SMQP_SERVER_CONTEXT")))


def _template_key(backend: str, accounts: tuple[str, ...], extra_env: dict[str, str] | None,
                  setup: str) -> tuple:
    """Accounts read the password settings only; a setup script may read any setting, so a
    template made by one is keyed by every setting the test adds (but the per-process ones)."""
    if not _TEMPLATE_ROOT:
        _TEMPLATE_ROOT.append(Path(tempfile.mkdtemp(prefix="smqp-templates-")))
    probe = {**base_env(_TEMPLATE_ROOT[0], ""), **(extra_env or {})}
    settings = _template_key_env(probe) if accounts or setup else ()
    if setup:
        settings = tuple(sorted({**dict(settings), **{
            k: v for k, v in (extra_env or {}).items() if k not in _PER_PROCESS_SETTINGS}}
            .items()))
    return (backend, accounts, settings, setup)


def _template(backend: str, accounts: tuple[str, ...] = (),
              extra_env: dict[str, str] | None = None, setup: str = "") -> str:
    """The URL of this process's template for ``backend``: migrated, with ``accounts`` (made
    by :func:`accounts_script`) when given, then ``setup`` run in it (Python for ``manage.py
    shell``). Built on first use, each layer copied from the one below, so a setup costs one
    process start per test process."""
    key = _template_key(backend, accounts, extra_env, setup)
    if key in _TEMPLATES:
        return _TEMPLATES[key]
    base = Path(tempfile.mkdtemp(prefix=f"{backend}-", dir=_TEMPLATE_ROOT[0]))
    if setup:
        url, pg_name = _copy_template(backend, base, _template(backend, accounts, extra_env))
        env = {**base_env(base, url), **dict(key[2])}
        script = ("from accounts.models import Account\n" + setup) if accounts else setup
        run_manage(env, "shell", "--no-imports", "-c", script)
    elif accounts:
        url, pg_name = _copy_template(backend, base, _template(backend))
        env = {**base_env(base, url), **dict(key[2])}
        run_manage(env, "shell", "--no-imports", "-c", accounts_script(*accounts))
    else:
        url, pg_name = _fresh_database(backend, base)
        run_manage(base_env(base, url), "migrate", "--noinput")
    if pg_name:
        _TEMPLATE_PG_NAMES.append(pg_name)
    _TEMPLATES[key] = url
    return url


def _copy_template(backend: str, base: Path, template_url: str) -> tuple[str, str | None]:
    """A new database for ``backend`` copied from ``template_url``: (url, postgres name to
    drop or None)."""
    base.mkdir(parents=True, exist_ok=True)  # as the ``migrate`` it replaces did (settings)
    if backend == "sqlite":
        import sqlite3

        path = base / "fresh.sqlite3"
        source = sqlite3.connect(template_url.removeprefix("sqlite:///"))
        target = sqlite3.connect(path)
        try:
            source.backup(target)
        finally:
            source.close()
            target.close()
        return f"sqlite:///{path}", None
    import psycopg

    template = template_url.rsplit("/", 1)[1]
    dbname = f"smqp_fresh_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    deadline = time.monotonic() + scaled(30)
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        while True:
            try:
                conn.execute(f'CREATE DATABASE "{dbname}" TEMPLATE "{template}"')
                break
            except psycopg.errors.ObjectInUse:
                # The process that built the template has exited, but its PostgreSQL
                # backend may take a moment to go.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + dbname, dbname


@contextmanager
def _database_copy(backend: str, base: Path, extra_env: dict[str, str] | None,
                   accounts: tuple[str, ...], setup: str = "") -> Iterator[dict[str, str]]:
    import psycopg

    url, pg_name = _copy_template(backend, base,
                                  _template(backend, accounts, extra_env, setup))
    env = {**base_env(base, url), **(extra_env or {})}
    _secret_key(base)
    try:
        yield env
    finally:
        if pg_name:
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')


def _secret_key(var_dir: Path) -> None:
    """Write the var dir's secret key, as the ``migrate`` this copy replaces did: processes
    started together on the copy (a listener and Daphne) then read one key."""
    import secrets

    with contextlib.suppress(FileExistsError), \
            os.fdopen(os.open(var_dir / "secret_key", os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                              0o600), "w") as fh:
        fh.write(secrets.token_urlsafe(50))


def pytest_sessionfinish(session) -> None:
    """Drop this process's template databases."""
    if _TEMPLATE_PG_NAMES:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            for name in _TEMPLATE_PG_NAMES:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    for root in _TEMPLATE_ROOT:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def fresh_broker(request, tmp_path_factory) -> Iterator[BrokerProcess]:
    """:func:`fresh_listener` for one test module, on each backend."""
    with fresh_listener(request.param, tmp_path_factory.mktemp(f"fresh-{request.param}")) as b:
        yield b
