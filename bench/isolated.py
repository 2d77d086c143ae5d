"""Start an isolated SMQP broker for a benchmark.

:func:`isolated_broker` creates a temp dir and a fresh database (SQLite in the temp dir, or a
new PostgreSQL database), an environment with unique Redis prefixes, migrates, lets the caller
seed data through ``manage.py``, starts ``manage.py runsmqp`` on a free port and yields a
:class:`RunningBroker`. On exit it stops the server (SIGTERM), keeps the server log when it
shows problems (or when asked to), drops the PostgreSQL database, removes the Redis keys under
its prefixes and deletes the temp dir.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("SMQP_BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("SMQP_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
BACKENDS = ("sqlite", "postgres")

LISTENING = re.compile(r"SMQP listening on ([\d.]+):(\d+)")
# Log lines that suggest the server had trouble during the run.
PROBLEM = re.compile(r"Traceback|\bERROR\b|\bCRITICAL\b|\bException\b|\bWARNING\b")


class BrokerSetupError(RuntimeError):
    """The isolated broker could not be prepared or started."""


@dataclass
class BrokerEnv:
    """The environment of an isolated broker, before and while it runs."""

    backend: str
    env: dict[str, str]
    var_dir: Path
    database_url: str

    def manage(self, *args: str, check: bool = True,
               timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run ``manage.py ARGS`` in this broker's environment."""
        result = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        )
        if check and result.returncode != 0:
            raise BrokerSetupError(
                f"manage.py {' '.join(args[:2])} failed ({result.returncode}):\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result

    def run_python(self, code: str, *, timeout: float = 600) -> str:
        """Run ``code`` with Django set up (``manage.py shell --no-imports -c``); its stdout."""
        return self.manage("shell", "--no-imports", "-c", code, timeout=timeout).stdout


@dataclass
class RunningBroker(BrokerEnv):
    """A running ``manage.py runsmqp`` listener and where to reach it."""

    host: str = ""
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    #: Set by the caller to keep the server log even when it shows no problems.
    keep_log: bool = False
    #: After exit: where the server log was copied (None if it was not kept).
    saved_log: Path | None = None
    #: After exit: log lines that suggest trouble (tracebacks, ERROR, WARNING ...).
    log_problems: list[str] = field(default_factory=list)
    #: After exit: the server's exit code.
    returncode: int | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        """The server's stdout/stderr so far."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds the server process has used (Linux /proc), or None."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError, AssertionError):
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks


def base_env(var_dir: Path, database_url: str) -> dict[str, str]:
    """The process environment of an isolated broker (as the e2e tests use, own prefixes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SMQP_", "DJANGO_"))}
    tag = uuid.uuid4().hex[:8]
    env.update(
        DJANGO_SETTINGS_MODULE="broker.settings",
        SMQP_VAR_DIR=str(var_dir),
        DATABASE_URL=database_url,
        REDIS_URL=REDIS_URL,
        SMQP_CHANNEL_PREFIX=f"smqp-bench-{tag}",
        SMQP_CACHE_PREFIX=f"smqp-bench-cache-{tag}",
        SMQP_SERVER_CONTEXT="bench.example.net",
        SMQP_PBKDF2_ITERATIONS="4096",
        SMQP_SHUTDOWN_GRACE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def check_services(backends: tuple[str, ...]) -> None:
    """Raise :class:`BrokerSetupError` when Redis (or PostgreSQL, if needed) is down."""
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=3).ping()
    except Exception as exc:
        raise BrokerSetupError(f"Redis is not reachable at {REDIS_URL}: {exc}") from exc
    if "postgres" in backends:
        import psycopg

        try:
            with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
                pass
        except Exception as exc:
            raise BrokerSetupError(
                f"PostgreSQL is not reachable at {PG_ADMIN_URL}: {exc}") from exc


def _create_pg_database() -> tuple[str, str]:
    import psycopg

    name = f"smqp_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name, name


def pg_checkpoint() -> None:
    """``CHECKPOINT`` on the benchmark's PostgreSQL server; returns when it is done."""
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def _drop_pg_database(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _drop_redis_keys(env: dict[str, str]) -> None:
    """Best effort: delete the keys this broker left under its channel and cache prefixes."""
    import redis

    with contextlib.suppress(Exception):
        client = redis.Redis.from_url(REDIS_URL, socket_timeout=3)
        for prefix in (env["SMQP_CHANNEL_PREFIX"], env["SMQP_CACHE_PREFIX"]):
            keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start:start + 500])


def _start(broker: RunningBroker, startup_timeout: float) -> None:
    assert broker.log_path is not None
    with broker.log_path.open("wb") as log:
        broker.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runsmqp", "--host", "127.0.0.1",
             "--port", "0"],
            env=broker.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        match = LISTENING.search(broker.log())
        if match:
            broker.host, broker.port = match[1], int(match[2])
            return
        if broker.proc.poll() is not None:
            break
        time.sleep(0.05)
    raise BrokerSetupError(f"runsmqp did not start:\n{broker.log()}")


def _stop(broker: RunningBroker, timeout: float = 30) -> None:
    proc = broker.proc
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            broker.log_problems.append(f"(runsmqp ignored SIGTERM for {timeout:g} s; killed)")
    broker.returncode = proc.returncode


@contextlib.contextmanager
def isolated_broker(backend: str, *, setup: Callable[[BrokerEnv], None] | None = None,
                    log_dir: Path | None = None, log_name: str = "server",
                    extra_env: dict[str, str] | None = None,
                    startup_timeout: float = 60) -> Iterator[RunningBroker]:
    """An SMQP broker of its own on ``backend`` (``sqlite`` or ``postgres``).

    ``setup`` runs after ``migrate`` and before the listener starts (seed accounts, topics).
    When the server log shows problems, or ``broker.keep_log`` is set, the log is copied to
    ``log_dir/<log_name>.log`` on exit and ``broker.saved_log`` names it.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    var_dir = Path(tempfile.mkdtemp(prefix=f"smqp-bench-{backend}-"))
    pg_name: str | None = None
    broker: RunningBroker | None = None
    env: dict[str, str] | None = None
    try:
        if backend == "postgres":
            url, pg_name = _create_pg_database()
        else:
            url = f"sqlite:///{var_dir / 'bench.sqlite3'}"
        env = base_env(var_dir, url)
        env.update(extra_env or {})
        broker = RunningBroker(backend, env, var_dir, url, log_path=var_dir / "runsmqp.log")
        broker.manage("migrate", "--noinput")
        if setup is not None:
            setup(broker)
        _start(broker, startup_timeout)
        yield broker
    finally:
        if broker is not None:
            _stop(broker)
            text = broker.log()
            broker.log_problems.extend(
                line for line in text.splitlines() if PROBLEM.search(line))
            if text and log_dir is not None and (broker.log_problems or broker.keep_log):
                log_dir.mkdir(parents=True, exist_ok=True)
                broker.saved_log = log_dir / f"{log_name}.log"
                shutil.copyfile(broker.log_path, broker.saved_log)  # type: ignore[arg-type]
        if pg_name is not None:
            _drop_pg_database(pg_name)
        if env is not None:
            _drop_redis_keys(env)
        shutil.rmtree(var_dir, ignore_errors=True)
