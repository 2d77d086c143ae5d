"""A whole cluster on this machine, from the files in deploy/ (docs/cluster.md):

    python -m deploy.local up [--nodes 3] [--spark]    (make cluster [CLUSTER_ARGS=--spark])
    python -m deploy.local down              (make cluster-stop)
    python -m deploy.local status

Each broker node runs ``manage.py runbroker`` in a network namespace of its own
(``smqpc-n1`` ...) with its own address (10.79.0.11 ...), joined to a bridge ``smqpc0``
(10.79.0.1) where the shared engines listen: etcd, two PostgreSQL members under Patroni (a
primary and a synchronous replica), a Redis master and replica with three Sentinels, and
HAProxy in front of it all. Needs root (network namespaces; PostgreSQL runs as the
``postgres`` user). Nothing here touches the machine's own PostgreSQL or Redis: every engine
listens on the bridge address only, on ports of its own.

Everything started is recorded under the cluster directory (``/tmp/smqp-cluster``, or
``SMQP_CLUSTER_DIR``) and ``down`` stops that, then removes the namespaces and the bridge,
and whatever an earlier run left that its record does not name (:class:`Leftovers`). ``up``
removes such leftovers when they are dead, and refuses to start, naming ``make
cluster-stop``, while a process of theirs still runs. The tests (tests/e2e/cluster/) drive
the same :class:`LocalCluster`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = Path(__file__).resolve().parent
BRIDGE = "smqpc0"
NET = "10.79.0"
HUB = f"{NET}.1"
PREFIX = "smqpc"

# Ports on the hub address (the shared engines and HAProxy's front ends).
ETCD_CLIENT, ETCD_PEER = 23790, 23800
PG_PORTS = {"pg1": 15431, "pg2": 15432}
PATRONI_REST = {"pg1": 18008, "pg2": 18009}
REDIS_PORTS = [16379, 16380]
SENTINEL_PORTS = [26379, 26380, 26381]
FRONT = {"smqp": 7200, "qqp": 2626, "http": 8000, "pg": 5000, "stats": 8404}
# Ports on each node's own address.
NODE_PORTS = {"smqp": 7200, "health": 7210, "http": 8000, "qqp": 2626}
# Spark standalone (``up --spark``): the master on the first node, a worker on every node.
SPARK_PORTS = {"master": 7077, "master_ui": 8080, "worker_ui": 8081}
SPARK_WORKER_CORES, SPARK_WORKER_MEMORY, SPARK_EXECUTOR_MEMORY = 1, "768m", "512m"

MASTER_NAME = "smqp"
DB_NAME, DB_USER, DB_PASSWORD = "smqp", "smqp", "smqp-cluster"
SUPER_PASSWORD, REPL_PASSWORD = "postgres-cluster", "replicator-cluster"
# Quick failure detection for a cluster on one machine (production: ttl 30, loop_wait 10).
PATRONI_TTL, PATRONI_LOOP, PATRONI_RETRY = 10, 2, 4
# Sentinel: a master is down after 1 s without an answer. failover-timeout also bounds an
# election that no Sentinel won (three that ask at once can split their votes): the next try
# waits twice that. 10 s made such a failover take 10-20 s (likely the 15.8 s seen once).
# Production: down-after 5000, failover-timeout 30000 over a real network (docs/cluster.md).
SENTINEL_DOWN_MS, SENTINEL_FAILOVER_MS = 1000, 3000


class ClusterError(RuntimeError):
    pass


# The TLS test's namespace for a peer on another host (tests/e2e/smqp/test_tls.py): one
# this old with no process in it was left by a run that was killed (a live test's is
# younger: it lives for one connection test).
TEST_NS_PREFIX, TEST_NS_STALE_SECONDS = "smqpns", 600


@dataclass
class Leftovers:
    """What an earlier run left on this machine (a cluster of another directory, a run
    killed before its ``down``, a record lost): the cluster's namespaces (with the processes
    still in them), its links (bridge, veths), processes listening on the bridge's network
    (an etcd there would serve the new Patroni an old cluster's keys: the start then fails
    far from its cause), and the TLS test's stale namespaces."""

    namespaces: dict[str, list[int]]
    links: list[str]
    listeners: list[tuple[str, int, str]]  # (address:port, pid, command)
    test_namespaces: list[str]

    @classmethod
    def find(cls) -> Leftovers:
        namespaces, test_namespaces = {}, []
        for name in _netns_names():
            if name.startswith(PREFIX + "-"):
                namespaces[name] = _netns_pids(name)
            elif name.startswith(TEST_NS_PREFIX) and not _netns_pids(name):
                with contextlib.suppress(OSError):
                    age = time.time() - os.stat(f"/run/netns/{name}").st_mtime
                    if age > TEST_NS_STALE_SECONDS:
                        test_namespaces.append(name)
        links = [name for name in _link_names() if name.startswith(PREFIX)]
        return cls(namespaces, links, _listeners(f"{NET}."), test_namespaces)

    @property
    def running(self) -> list[str]:
        """Its live processes, described (empty: nothing of it runs)."""
        return ([f"{command} (pid {pid}) on {address}" for address, pid, command
                 in self.listeners]
                + [f"{len(pids)} processes in namespace {name}"
                   for name, pids in self.namespaces.items() if pids])

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.links or self.listeners or self.test_namespaces)

    def __str__(self) -> str:
        return ", ".join([*self.running, *(f"namespace {n}" for n in self.namespaces),
                          *(f"link {n}" for n in self.links),
                          *(f"namespace {n}" for n in self.test_namespaces)])

    def remove(self, grace: float = 10) -> None:
        """Stop its processes (SIGTERM, SIGKILL after ``grace`` seconds), then remove its
        namespaces and links."""
        pids = {pid for _, pid, _ in self.listeners}
        pids.update(pid for ns_pids in self.namespaces.values() for pid in ns_pids)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(LocalCluster._alive(p) for p in pids):
                time.sleep(0.2)
        for name in [*self.namespaces, *self.test_namespaces]:
            _run("ip", "netns", "del", name, check=False)
        for name in self.links:
            _run("ip", "link", "del", name, check=False)


def _netns_names() -> list[str]:
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _netns_pids(name: str) -> list[int]:
    return [int(p) for p in _run("ip", "netns", "pids", name, check=False).stdout.split()]


def _link_names() -> list[str]:
    """The links of the root namespace ("smqpc-n1@if2" is a veth named smqpc-n1)."""
    out = _run("ip", "-o", "link", "show", check=False).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()
            if line.count(":") >= 2]


def _listeners(prefix: str) -> list[tuple[str, int, str]]:
    """(address:port, pid, command) of the TCP sockets listening on addresses starting with
    ``prefix`` in the root namespace (``ss``)."""
    found = []
    out = _run("ss", "-Htlnp", check=False).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 6 or not fields[3].startswith(prefix):
            continue
        for command, pid in re.findall(r'\("([^"]*)",pid=(\d+)', fields[5]):
            found.append((fields[3], int(pid), command))
    return found


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise ClusterError(f"{' '.join(argv)}: {result.stderr.strip() or result.stdout}")
    return result


def _render(template: str, **values: object) -> str:
    return string.Template((DEPLOY / template).read_text()).substitute(
        {k: str(v) for k, v in values.items()})


def _wait(condition, timeout: float, what: str, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            value = condition()
            if value:
                return value
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def http_status(url: str, timeout: float = 3) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _pg_bin_dir() -> str:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "postgres").exists():
            return str(candidate)
    found = shutil.which("postgres") or shutil.which("pg_ctl")
    if found:
        return str(Path(found).parent)
    raise ClusterError("no PostgreSQL server binaries (make cluster installs postgresql)")


def _spark_home() -> str:
    """Spark as PySpark ships it (bin/spark-class; the pip package has no sbin scripts but
    spark-daemon.sh, so the master and the workers are started by their classes)."""
    import pyspark

    return os.path.dirname(pyspark.__file__)


@dataclass
class Node:
    name: str
    addr: str

    @property
    def netns(self) -> str:
        return f"{PREFIX}-{self.name}"

    @property
    def veth(self) -> str:
        return f"{PREFIX}-{self.name}"  # the bridge side, in the root namespace

    def url(self, port: str, path: str = "") -> str:
        return f"http://{self.addr}:{NODE_PORTS[port]}{path}"


class LocalCluster:
    def __init__(self, base: Path | None = None, nodes: int = 3,
                 extra_env: dict[str, str] | None = None) -> None:
        self.base = Path(base or os.environ.get("SMQP_CLUSTER_DIR", "/tmp/smqp-cluster"))
        self.nodes = [Node(f"n{i}", f"{NET}.{10 + i}") for i in range(1, nodes + 1)]
        self.extra_env = extra_env or {}
        self.state_path = self.base / "state.json"
        self.procs: dict[str, int] = {}

    # --- what clients connect to ---------------------------------------------------------
    @property
    def database_url(self) -> str:
        return (f"postgres://{DB_USER}:{DB_PASSWORD}@{HUB}:{FRONT['pg']}/{DB_NAME}"
                "?connect_timeout=3")

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        return [(HUB, p) for p in SENTINEL_PORTS]

    def node_env(self, node: Node | None = None) -> dict[str, str]:
        """The environment of a broker node (and of a manage.py run against the cluster)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SMQP_", "DJANGO_", "REDIS_", "CELERY_", "DATABASE_"))}
        env.update(
            DJANGO_SETTINGS_MODULE="broker.settings",
            DATABASE_URL=self.database_url,
            REDIS_SENTINELS=",".join(f"{h}:{p}" for h, p in self.sentinels),
            REDIS_MASTER_NAME=MASTER_NAME,
            REDIS_URL="redis://sentinel/0",
            DJANGO_SECRET_KEY=self._secret(),
            DJANGO_ALLOWED_HOSTS="*",
            SMQP_SERVER_CONTEXT="cluster.test",
            SMQP_NODE_NAME=node.name if node else "admin",
            # The SMQP greeting names the node a client reached through HAProxy.
            SMQP_SERVER_IDENT=f"Django SMQP Broker/0.1 {node.name if node else 'admin'}",
            SMQP_VAR_DIR=str(self.base / (node.name if node else "admin")),
            SMQP_REPORTS_DIR=str(self.base / "shared" / "reports"),
            SMQP_HEALTH_PORT=str(NODE_PORTS["health"]),
            # ACKs commit before 310 ACK on the (synchronously replicated) database: a node's
            # local ACK journal would die with the node, and its messages be delivered again.
            SMQP_ACK_JOURNAL="0",
            SMQP_ACK_DURABILITY="full",
            SMQP_XMPP_PLAIN="yes",
            SMQP_PBKDF2_ITERATIONS=os.environ.get("SMQP_PBKDF2_ITERATIONS", "") or "",
            SMQP_SHUTDOWN_GRACE="2",
            PYTHONUNBUFFERED="1",
        )
        if not env["SMQP_PBKDF2_ITERATIONS"]:
            del env["SMQP_PBKDF2_ITERATIONS"]
        env.update(self.extra_env)
        return env

    def _secret(self) -> str:
        path = self.base / "secret_key"
        if not path.exists():
            path.write_text(os.urandom(24).hex())
        return path.read_text().strip()

    # --- bookkeeping -------------------------------------------------------------------
    def _save(self) -> None:
        self.state_path.write_text(json.dumps({"procs": self.procs,
                                               "nodes": [n.name for n in self.nodes]}))

    def _load(self) -> None:
        if self.state_path.exists():
            state = json.loads(self.state_path.read_text())
            self.procs = state.get("procs", {})
            if state.get("nodes"):
                self.nodes = [Node(n, f"{NET}.{10 + int(n[1:])}") for n in state["nodes"]]

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None,
               user: str | None = None) -> int:
        log = (self.base / "logs" / f"{name}.log").open("a")
        # A process run as another user starts in the cluster's own folder (0755): the
        # checkout may sit in a folder only root may enter (a CI job's mktemp -d), and
        # Patroni, run as postgres there, failed its bootstrap on "Permission denied".
        cwd = ROOT
        if user is not None:
            argv = ["runuser", "-u", user, "--", *argv]
            cwd = self.base
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                env=env or os.environ.copy(), start_new_session=True)
        log.close()
        self.procs[name] = proc.pid
        self._save()
        return proc.pid

    def log(self, name: str) -> str:
        path = self.base / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # --- up ------------------------------------------------------------------------------
    def up(self) -> None:
        if os.geteuid() != 0:
            raise ClusterError("the local cluster needs root (network namespaces)")
        for tool in ("ip", "etcd", "patroni", "haproxy", "redis-server"):
            if shutil.which(tool) is None:
                raise ClusterError(f"{tool} is missing (make cluster installs it)")
        if self.state_path.exists():
            self.down()
        self._clear_leftovers()
        self.base.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o755)
        for sub in ("logs", "shared/reports", "redis", "etcd", "haproxy"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        self._save()
        try:
            self._network()
            self._etcd()
            self._patroni()
            self._redis()
            self._haproxy()
            self._database()
            for node in self.nodes:
                self.start_node(node)
            for node in self.nodes:
                self.wait_node_ready(node)
        except BaseException:
            self.down(keep_logs=True)
            raise

    def _clear_leftovers(self) -> None:
        """Another cluster still running here (started from another directory, or its record
        lost) would share the bridge, its addresses and its ports with this one: refused.
        What a killed run left dead is removed."""
        left = Leftovers.find()
        if left.running:
            raise ClusterError(
                "an earlier local cluster is still running: " + "; ".join(left.running)
                + ". Stop it first with `make cluster-stop` (python -m deploy.local down).")
        if left:
            print(f"removing what an earlier run left: {left}", file=sys.stderr)
            left.remove()
            if Leftovers.find():
                raise ClusterError(f"could not remove what an earlier run left "
                                   f"({Leftovers.find()}); try `make cluster-stop`")

    def _network(self) -> None:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{HUB}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        for node in self.nodes:
            _run("ip", "netns", "add", node.netns)
            _run("ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0",
                 "netns", node.netns)
            _run("ip", "link", "set", node.veth, "master", BRIDGE)
            _run("ip", "link", "set", node.veth, "up")
            _run("ip", "-n", node.netns, "addr", "add", f"{node.addr}/24", "dev", "eth0")
            _run("ip", "-n", node.netns, "link", "set", "eth0", "up")
            _run("ip", "-n", node.netns, "link", "set", "lo", "up")

    def _etcd(self) -> None:
        data = self.base / "etcd"
        self._spawn("etcd", [
            "etcd", "--name", "etcd1", "--data-dir", str(data),
            "--listen-client-urls", f"http://{HUB}:{ETCD_CLIENT}",
            "--advertise-client-urls", f"http://{HUB}:{ETCD_CLIENT}",
            "--listen-peer-urls", f"http://{HUB}:{ETCD_PEER}",
            "--initial-advertise-peer-urls", f"http://{HUB}:{ETCD_PEER}",
            "--initial-cluster", f"etcd1=http://{HUB}:{ETCD_PEER}",
            "--initial-cluster-state", "new", "--enable-v2=true"])
        _wait(lambda: http_status(f"http://{HUB}:{ETCD_CLIENT}/health") == 200, 60, "etcd")

    def _patroni(self) -> None:
        bin_dir = _pg_bin_dir()
        pg = pwd.getpwnam("postgres")
        for name in ("pg1", "pg2"):
            home = self.base / name
            home.mkdir(exist_ok=True)
            os.chown(home, pg.pw_uid, pg.pw_gid)
            config = home / "patroni.yml"
            config.write_text(_render(
                "patroni.yml", scope="smqp-local", name=name,
                rest_addr=f"{HUB}:{PATRONI_REST[name]}", etcd_hosts=f"{HUB}:{ETCD_CLIENT}",
                ttl=PATRONI_TTL, loop_wait=PATRONI_LOOP, retry_timeout=PATRONI_RETRY,
                network=f"{NET}.0/24", pg_addr=f"{HUB}:{PG_PORTS[name]}",
                data_dir=home / "data", bin_dir=bin_dir, pgpass=home / "pgpass",
                replication_password=REPL_PASSWORD, superuser_password=SUPER_PASSWORD,
                socket_dir=home))
            os.chown(config, pg.pw_uid, pg.pw_gid)
            self._spawn(f"patroni-{name}", ["patroni", str(config)], user="postgres")
            if name == "pg1":
                _wait(lambda: self.pg_leader() == "pg1", 120, "the first PostgreSQL member")
        _wait(lambda: http_status(f"http://{HUB}:{PATRONI_REST['pg2']}/sync") == 200, 180,
              "the replica to stream synchronously")

    def _redis(self) -> None:
        for i, port in enumerate(REDIS_PORTS):
            conf = self.base / "redis" / f"redis-{port}.conf"
            conf.write_text(_render(
                "redis.conf", addr=HUB, port=port, dir=self.base / "redis",
                replicaof=f"replicaof {HUB} {REDIS_PORTS[0]}" if i else ""))
            self._spawn(f"redis-{port}", ["redis-server", str(conf)])
        for port in SENTINEL_PORTS:
            conf = self.base / "redis" / f"sentinel-{port}.conf"
            conf.write_text(_render(
                "sentinel.conf", addr=HUB, port=port, dir=self.base / "redis",
                master_name=MASTER_NAME, master_addr=HUB, master_port=REDIS_PORTS[0],
                down_after_ms=SENTINEL_DOWN_MS, failover_timeout_ms=SENTINEL_FAILOVER_MS))
            self._spawn(f"sentinel-{port}", ["redis-server", str(conf), "--sentinel"])
        _wait(lambda: self.redis_master() == (HUB, REDIS_PORTS[0]), 60, "Sentinel's master")
        _wait(lambda: self._sentinel("SENTINEL", "REPLICAS", MASTER_NAME), 60,
              "Sentinel to see the replica")

    def _haproxy(self) -> None:
        def servers(port_name: str, check: str) -> str:
            return "\n".join(f"    server {n.name} {n.addr}:{NODE_PORTS[port_name]} {check}"
                             for n in self.nodes)

        cfg = self.base / "haproxy" / "haproxy.cfg"
        cfg.write_text(_render(
            "haproxy.cfg", listen_addr=HUB, global_extra="",
            smqp_port=FRONT["smqp"], qqp_port=FRONT["qqp"], http_port=FRONT["http"],
            pg_port=FRONT["pg"], stats_port=FRONT["stats"],
            smqp_servers=servers("smqp", f"check port {NODE_PORTS['health']}"),
            qqp_servers=servers("qqp", f"check port {NODE_PORTS['health']}"),
            http_servers=servers("http", "check"),
            pg_servers="\n".join(
                f"    server {name} {HUB}:{port} check port {PATRONI_REST[name]}"
                for name, port in PG_PORTS.items())))
        _run("haproxy", "-c", "-q", "-f", str(cfg))
        self._spawn("haproxy", ["haproxy", "-db", "-f", str(cfg)])
        _wait(lambda: self._connects(HUB, FRONT["pg"]), 30, "HAProxy")

    def _database(self) -> None:
        import psycopg

        admin = f"postgres://postgres:{SUPER_PASSWORD}@{HUB}:{FRONT['pg']}/postgres"
        _wait(lambda: psycopg.connect(admin, connect_timeout=3).close() or True, 60,
              "PostgreSQL through HAProxy")
        with psycopg.connect(admin, autocommit=True) as db:
            db.execute(f"CREATE ROLE {DB_USER} LOGIN PASSWORD '{DB_PASSWORD}'")
            db.execute(f"CREATE DATABASE {DB_NAME} OWNER {DB_USER}")
        env = self.node_env()
        Path(env["SMQP_VAR_DIR"]).mkdir(parents=True, exist_ok=True)
        self.manage("migrate", "--noinput")

    def manage(self, *args: str, timeout: float = 600) -> str:
        env = self.node_env()
        Path(env["SMQP_VAR_DIR"]).mkdir(parents=True, exist_ok=True)
        result = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env=env,
                                cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise ClusterError(f"manage.py {' '.join(args)}: {result.stderr[-3000:]}")
        return result.stdout

    def start_node(self, node: Node) -> None:
        env = self.node_env(node)
        Path(env["SMQP_VAR_DIR"]).mkdir(parents=True, exist_ok=True)
        self._spawn(node.name, [
            "ip", "netns", "exec", node.netns, sys.executable, str(ROOT / "manage.py"),
            "runbroker", "--http-host", "0.0.0.0", "--http-port", str(NODE_PORTS["http"]),
            "--smqp-host", "0.0.0.0", "--smqp-port", str(NODE_PORTS["smqp"]),
            "--qqp-port", str(NODE_PORTS["qqp"])], env=env)

    def wait_node_ready(self, node: Node, timeout: float = 300) -> None:
        _wait(lambda: http_status(node.url("health", "/readyz")) == 200
              and http_status(node.url("http", "/readyz")) == 200, timeout,
              f"node {node.name} to be ready (log: {self.base / 'logs' / node.name}.log)",
              interval=0.5)

    # --- Spark standalone -------------------------------------------------------------------
    @property
    def spark_master(self) -> str:
        return f"spark://{self.nodes[0].addr}:{SPARK_PORTS['master']}"

    def spark_env(self, node: Node) -> dict[str, str]:
        """A Spark process on ``node``: its address, its logs and work under the node's
        directory, the broker's Python for the executors' Python workers."""
        env = self.node_env(node)
        env.update(SPARK_HOME=_spark_home(), SPARK_LOCAL_IP=node.addr,
                   SPARK_LOCAL_HOSTNAME=node.addr, SPARK_CONF_DIR=str(self.base / "spark-conf"),
                   SPARK_LOG_DIR=str(self.base / node.name / "spark-logs"),
                   SPARK_WORKER_DIR=str(self.base / node.name / "spark-work"),
                   PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        return env

    def start_spark(self) -> None:
        """A Spark standalone cluster of the nodes (what ``sbin/start-master.sh`` and
        ``start-worker.sh`` run, in the foreground): the master on the first node, a
        worker on each, all in the nodes' namespaces; returns once every worker has
        registered. The report files are on ``shared/reports`` (SMQP_REPORTS_DIR), which
        every node reads: on this machine one directory, on several machines NFS."""
        spark_class = str(Path(_spark_home()) / "bin" / "spark-class")
        first = self.nodes[0]
        conf = self.base / "spark-conf"
        conf.mkdir(exist_ok=True)
        (conf / "spark-defaults.conf").write_text(_render(
            "spark-defaults.conf", executor_memory=SPARK_EXECUTOR_MEMORY))
        self._spawn("spark-master", [
            "ip", "netns", "exec", first.netns, spark_class,
            "org.apache.spark.deploy.master.Master", "--host", first.addr,
            "--port", str(SPARK_PORTS["master"]),
            "--webui-port", str(SPARK_PORTS["master_ui"])], env=self.spark_env(first))
        for node in self.nodes:
            self._spawn(f"spark-worker-{node.name}", [
                "ip", "netns", "exec", node.netns, spark_class,
                "org.apache.spark.deploy.worker.Worker", "--host", node.addr,
                "--cores", str(SPARK_WORKER_CORES), "--memory", SPARK_WORKER_MEMORY,
                "--webui-port", str(SPARK_PORTS["worker_ui"]),
                "--work-dir", str(self.base / node.name / "spark-work"),
                self.spark_master], env=self.spark_env(node))
        _wait(lambda: self.spark_workers() == len(self.nodes), 240,
              f"{len(self.nodes)} Spark workers to register with {self.spark_master}",
              interval=1)

    def stop_spark(self) -> None:
        for name in [n for n in self.procs if n.startswith("spark-")]:
            self._kill_group(name, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(
                self._alive(pid) for n, pid in self.procs.items() if n.startswith("spark-")):
            time.sleep(0.2)
        for name in [n for n in self.procs if n.startswith("spark-")]:
            self._kill_group(name)
            del self.procs[name]
        self._save()

    def spark_workers(self) -> int:
        """How many workers the master counts alive (its web UI's JSON)."""
        url = f"http://{self.nodes[0].addr}:{SPARK_PORTS['master_ui']}/json/"
        with urllib.request.urlopen(url, timeout=3) as reply:
            state = json.load(reply)
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def manage_on(self, node: Node, *args: str, timeout: float = 900) -> str:
        """``manage.py`` run on ``node`` (in its namespace, with its environment), as an
        operator runs ``runreport`` on one of the nodes: a Spark driver there is reached by
        the executors at the node's address."""
        result = subprocess.run(
            ["ip", "netns", "exec", node.netns, sys.executable, str(ROOT / "manage.py"),
             *args], env=self.spark_env(node), cwd=ROOT, capture_output=True, text=True,
            timeout=timeout)
        if result.returncode != 0:
            raise ClusterError(f"manage.py {' '.join(args)} on {node.name}: "
                               f"{result.stdout[-2000:]}{result.stderr[-3000:]}")
        return result.stdout

    # --- what the tests break -------------------------------------------------------------
    def node_pids(self, node: Node) -> list[int]:
        out = _run("ip", "netns", "pids", node.netns, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_node(self, node: Node) -> None:
        """The machine gone: every process of the node at once, SIGKILL."""
        for pid in self.node_pids(node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait(lambda: not self.node_pids(node), 30, f"node {node.name}'s processes to die")

    def cut_link(self, node: Node, up: bool) -> None:
        _run("ip", "link", "set", node.veth, "up" if up else "down")

    def pg_leader(self) -> str | None:
        for name, port in PATRONI_REST.items():
            with contextlib.suppress(OSError):
                if http_status(f"http://{HUB}:{port}/primary", timeout=2) == 200:
                    return name
        return None

    def kill_pg_member(self, name: str) -> None:
        """The member's machine gone: Patroni and its PostgreSQL, SIGKILL."""
        pid_file = self.base / name / "data" / "postmaster.pid"
        postmaster = int(pid_file.read_text().split()[0]) if pid_file.exists() else None
        self._kill_group(f"patroni-{name}")
        if postmaster:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(postmaster), signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(postmaster, signal.SIGKILL)

    def restart_pg_member(self, name: str) -> None:
        self._spawn(f"patroni-{name}", ["patroni", str(self.base / name / "patroni.yml")],
                    user="postgres")

    def _sentinel(self, *command: str):
        import redis

        for host, port in self.sentinels:
            with contextlib.suppress(redis.RedisError):
                return redis.Redis(host, port, socket_timeout=2,
                                   decode_responses=True).execute_command(*command)
        return None

    def redis_master(self) -> tuple[str, int] | None:
        got = self._sentinel("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
        return (got[0], int(got[1])) if got else None

    def kill_redis(self, port: int) -> None:
        self._kill_group(f"redis-{port}")

    def restart_redis(self, port: int, replica_of: tuple[str, int] | None) -> None:
        """A Redis back after its death: a replica of the master Sentinel names now."""
        conf = self.base / "redis" / f"redis-{port}.conf"
        conf.write_text(_render(
            "redis.conf", addr=HUB, port=port, dir=self.base / "redis",
            replicaof=f"replicaof {replica_of[0]} {replica_of[1]}" if replica_of else ""))
        self._spawn(f"redis-{port}", ["redis-server", str(conf)])
        _wait(lambda: self._connects(HUB, port), 30, f"Redis on {port}")

    def lease_holders(self) -> dict[str, str]:
        """Each live cluster lease's holder (broker/store/leases.py), read through HAProxy."""
        import psycopg

        with psycopg.connect(self.database_url) as db:
            return dict(db.execute("SELECT name, holder FROM broker_cluster_lease "
                                   "WHERE expires_at >= now()").fetchall())

    def _kill_group(self, name: str, sig: int = signal.SIGKILL) -> None:
        pid = self.procs.get(name)
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)

    @staticmethod
    def _connects(host: str, port: int) -> bool:
        with socket.create_connection((host, port), timeout=2):
            return True

    # --- down ----------------------------------------------------------------------------
    def down(self, keep_logs: bool = False) -> None:
        """Stop everything recorded, remove the namespaces, the bridge and the directory
        (its logs kept beside it as ``<dir>-logs`` with ``keep_logs``)."""
        self._load()
        for node in self.nodes:  # nodes first: they drain (SIGTERM), then anything left dies
            for pid in self.node_pids(node):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(self.node_pids(n) for n in self.nodes):
            time.sleep(0.2)
        for node in self.nodes:
            for pid in self.node_pids(node):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        postmasters = []
        for name in PG_PORTS:
            pid_file = self.base / name / "data" / "postmaster.pid"
            if pid_file.exists():
                with contextlib.suppress(ValueError, OSError):
                    postmasters.append(int(pid_file.read_text().split()[0]))
        for name in list(self.procs):
            self._kill_group(name, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(self._alive(p) for p in self.procs.values()):
            time.sleep(0.2)
        for name in list(self.procs):
            self._kill_group(name)
        for pid in postmasters:  # a postmaster whose Patroni was killed first
            if self._alive(pid) and "postgres" in self._cmdline(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for node in self.nodes:
            _run("ip", "link", "del", node.veth, check=False)
            _run("ip", "netns", "del", node.netns, check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        # What this record does not name: another directory's cluster, a run killed before
        # its down, the TLS test's stale namespaces (the next up would meet them).
        Leftovers.find().remove()
        self.procs = {}
        kept = self.base.with_name(self.base.name + "-logs")
        shutil.rmtree(kept, ignore_errors=True)
        if keep_logs and (self.base / "logs").exists():
            shutil.copytree(self.base / "logs", kept)
        if self.base.exists():
            shutil.rmtree(self.base, ignore_errors=True)

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A zombie child of ours counts as gone.
        with contextlib.suppress(ChildProcessError, OSError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return False
        return Path(f"/proc/{pid}").exists() and "zombie" not in LocalCluster._status(pid)

    @staticmethod
    def _status(pid: int) -> str:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("State:"):
                    return line.lower()
        return ""

    @staticmethod
    def _cmdline(pid: int) -> str:
        with contextlib.suppress(OSError):
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        return ""

    def describe(self) -> str:
        lines = ["SMQP cluster up:",
                 f"  SMQP            {HUB}:{FRONT['smqp']}   (HAProxy over "
                 f"{', '.join(n.addr for n in self.nodes)})",
                 f"  QQP             {HUB}:{FRONT['qqp']}",
                 f"  HTTP/REST/admin http://{HUB}:{FRONT['http']}/admin/",
                 f"  XMPP WebSocket  ws://{HUB}:{FRONT['http']}/xmpp-websocket",
                 f"  HAProxy stats   http://{HUB}:{FRONT['stats']}/",
                 f"  PostgreSQL      {self.database_url} (leader: {self.pg_leader()})",
                 f"  Redis Sentinels {', '.join(f'{h}:{p}' for h, p in self.sentinels)} "
                 f"(master {self.redis_master()})",
                 *([f"  Spark master    {self.spark_master} (runreport --master "
                    f"{self.spark_master}; web UI http://{self.nodes[0].addr}:"
                    f"{SPARK_PORTS['master_ui']}/)"]
                   if "spark-master" in self.procs else []),
                 f"  logs            {self.base / 'logs'}",
                 "  Stop with: make cluster-stop"]
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--spark", action="store_true",
                        help="also a Spark standalone cluster of the nodes (for runreport)")
    args = parser.parse_args(argv)
    cluster = LocalCluster(nodes=args.nodes)
    if args.action == "down":
        cluster.down()
        print("SMQP cluster stopped and removed.")
        return 0
    if args.action == "status":
        cluster._load()
        if not cluster.procs:
            print("no local cluster")
            return 1
        print(cluster.describe())
        return 0
    try:
        cluster.up()
    except ClusterError as exc:
        print(f"cluster not started: {exc}", file=sys.stderr)
        return 1
    cluster.manage("bootstrapadmin")
    if args.spark:
        try:
            cluster.start_spark()
        except ClusterError as exc:
            print(f"Spark not started: {exc}", file=sys.stderr)
            return 1
    print(cluster.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
