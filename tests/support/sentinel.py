"""A Redis master, a replica and three Sentinels of the test's own, on free loopback ports
(``redis-server`` and ``redis-server --sentinel``; nothing touches the machine's Redis)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.conftest import free_ports
from tests.support.timing import scaled


@dataclass
class SentinelSet:
    master_name: str
    sentinels: list[tuple[str, int]]
    redis_ports: list[int]
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {"REDIS_SENTINELS": ",".join(f"{h}:{p}" for h, p in self.sentinels),
                "REDIS_MASTER_NAME": self.master_name, "REDIS_URL": "redis://ignored/0"}

    def sentinel(self) -> redis.Redis:
        host, port = self.sentinels[0]
        return redis.Redis(host, port, socket_timeout=scaled(3), decode_responses=True)

    def master_port(self) -> int:
        return int(self.sentinel().sentinel_get_master_addr_by_name(self.master_name)[1])

    def redis(self, port: int) -> redis.Redis:
        return redis.Redis("127.0.0.1", port, socket_timeout=scaled(3), decode_responses=True)


def _wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


@contextmanager
def sentinel_set(base: Path, master_name: str = "smqp") -> Iterator[SentinelSet]:
    server = shutil.which("redis-server")
    assert server, "redis-server is needed (make services installs it)"
    every = free_ports(5)
    ports, s_ports = every[:2], every[2:]
    result = SentinelSet(master_name, [("127.0.0.1", p) for p in s_ports], ports)
    with ExitStack() as stack:
        def start(port: int, argv: list[str]) -> None:
            log = (base / f"redis-{port}.log").open("w")
            stack.callback(log.close)
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            result.procs[port] = proc
            stack.callback(lambda: (proc.kill(), proc.wait()))
            _wait_port(port)

        for i, port in enumerate(ports):
            start(port, [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                         "--appendonly", "no", "--dir", str(base),
                         *(["--replicaof", "127.0.0.1", str(ports[0])] if i else [])])
        for port in s_ports:
            conf = base / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {base}\n"
                f"sentinel monitor {master_name} 127.0.0.1 {ports[0]} 2\n"
                f"sentinel down-after-milliseconds {master_name} 1000\n"
                f"sentinel failover-timeout {master_name} 5000\n")
            start(port, [server, str(conf), "--sentinel"])
        # The Sentinels know the replica (through the master's INFO) before a test fails over.
        deadline = time.monotonic() + scaled(30)
        while time.monotonic() < deadline:
            replicas = result.sentinel().sentinel_slaves(master_name)
            if replicas and all(r.get("is_disconnected") is False for r in replicas):
                break
            time.sleep(0.2)
        yield result
