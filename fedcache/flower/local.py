"""A real Flower deployment on 127.0.0.1: one SuperLink and one SuperNode per client shard, each
its own process (group), driven with `flwr run`. For tests, the overhead benchmark and trying a
deployment on one machine; the commands are the ones docs/deploy.md shows for real machines.

Every process is started in its own session and killed with its whole group on exit, so the
ClientApp / ServerApp processes Flower spawns go with them.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedcache.errors import FedcacheError
from fedcache.flower.config import FlowerRun

CONNECTION = "loopback"  # the name of the SuperLink connection in $FLWR_HOME/config.toml
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path


def self_signed(directory: Path) -> Certs:
    """A throw-away CA and a server certificate for 127.0.0.1 / localhost (loopback trials only)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedcache loopback CA")])

    def build(subject, public_key, ca: bool):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(public_key)
             .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
             .not_valid_after(now + dt.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            san = [x509.IPAddress(ipaddress.ip_address(HOST)), x509.DNSName("localhost")]
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(ca_key, hashes.SHA256())

    ca = build(ca_name, ca_key.public_key(), True)
    cert = build(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)]), key.public_key(), False)
    pem = serialization.Encoding.PEM
    paths = Certs(directory / "ca.crt", directory / "server.pem", directory / "server.key")
    paths.ca.write_bytes(ca.public_bytes(pem))
    paths.cert.write_bytes(cert.public_bytes(pem))
    paths.key.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


@dataclass
class LocalDeployment:
    workdir: Path
    shards: list[Path]  # one SuperNode per client shard
    certs: Certs | None = None  # None: --insecure
    port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        # Flower starts its helper processes (flower-superexec, flwr-serverapp, flwr-clientapp) by name.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        return {**os.environ, "PATH": path, "FLWR_HOME": str(self.workdir / "flwr-home"), "FLWR_TELEMETRY_ENABLED": "0"}

    def superlink_command(self) -> list[str]:
        tls = (["--ssl-ca-certfile", str(self.certs.ca), "--ssl-certfile", str(self.certs.cert),
                "--ssl-keyfile", str(self.certs.key)] if self.certs else ["--insecure"])
        return [_bin("flower-superlink"), *tls, "--host", HOST, "--port", str(self.port),
                "--disable-runtime-dependency-installation"]

    def supernode_command(self, i: int, runtime_port: int) -> list[str]:
        tls = ["--root-certificates", str(self.certs.ca)] if self.certs else ["--insecure"]
        return [_bin("flower-supernode"), *tls, "--superlink", f"{HOST}:{self.port}", "--host", HOST,
                "--port", str(runtime_port), "--node-config", f"shard={json.dumps(str(self.shards[i]))}"]

    def __enter__(self) -> "LocalDeployment":
        try:
            self._write_connection()
            self._spawn("superlink", self.superlink_command())
            _wait_port(self.port, 60, self.procs["superlink"], self.log("superlink"))
            for i in range(len(self.shards)):
                self.start_node(i)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def _write_connection(self) -> None:
        home = self.workdir / "flwr-home"
        home.mkdir(parents=True, exist_ok=True)
        auth = f'root-certificates = "{self.certs.ca}"' if self.certs else "insecure = true"
        (home / "config.toml").write_text(f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
                                          f'address = "{HOST}:{self.port}"\n{auth}\n')

    def _spawn(self, name: str, cmd: list[str]) -> None:
        with open(self.log(name), "ab") as fh:  # the child keeps its own descriptor
            self.procs[name] = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.env,
                                                start_new_session=True, cwd=self.workdir)

    def start_node(self, i: int) -> None:
        self._spawn(f"node{i}", self.supernode_command(i, free_port()))

    def kill_node(self, i: int) -> None:
        _kill(self.procs.pop(f"node{i}"))

    def stop(self) -> None:
        for name in list(self.procs):
            _kill(self.procs.pop(name))

    def flwr_run_command(self, app: Path, run: FlowerRun) -> list[str]:
        overrides = " ".join(f"{k}={json.dumps(v)}" for k, v in run.to_config().items())
        return [_bin("flwr"), "run", str(app), CONNECTION, "--run-config", overrides, "--stream"]

    def run(self, app: Path, run: FlowerRun, timeout: float) -> dict:
        """`flwr run` to the end; returns the server's summary.json (run.deploy.out must be set)."""
        proc = subprocess.run(self.flwr_run_command(app, run), env=self.env, cwd=self.workdir, capture_output=True,
                              text=True, timeout=timeout, start_new_session=True)
        summary = Path(run.deploy.out) / "summary.json"
        if not summary.exists():
            raise FedcacheError(f"the Flower run wrote no summary (flwr exited {proc.returncode}):\n"
                                f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
        return json.loads(summary.read_text())


def _wait_port(port: int, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FedcacheError(f"the SuperLink exited with code {proc.returncode}; see {log}")
        with socket.socket() as s:
            if s.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.2)
    raise FedcacheError(f"the SuperLink did not listen on {HOST}:{port} within {timeout:g}s; see {log}")


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the process's whole group (a SuperNode's SuperExec and ClientApp processes too)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
