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
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedcache import disk
from fedcache.errors import FedcacheError
from fedcache.flower.config import SERVER_ENV, FlowerRun
from fedcache.flower.shard import SERVER
from fedcache.paths import SUMMARY

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


def self_signed(directory: Path | str) -> Certs:
    """A throw-away CA and a server certificate for 127.0.0.1 / localhost (loopback trials only)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory = Path(directory)
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
    # Each whole or not at all (a full disk): a certificate cut short is read as a bad one, not as a full disk.
    disk.write_atomic(paths.ca, ca.public_bytes(pem), "the loopback CA certificate")
    disk.write_atomic(paths.cert, cert.public_bytes(pem), "the SuperLink's certificate")
    _write_private(paths.key, key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


def _write_private(path: Path, data: bytes) -> None:
    """A private key, unencrypted: created readable by its owner only (written 0644 and then chmod-ed, another user
    could open it in between and read it through that descriptor later), whole or not at all. The new key is a new
    file renamed over the old one: a descriptor another user holds on the old file never sees the new key."""
    disk.write_atomic(path, data, "the private key", mode=0o600)


def node_keys(directory: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's authentication key pair (EC P-384, OpenSSH format, as `flwr supernode register` reads)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = directory / name, directory / f"{name}.pub"
    _write_private(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                              serialization.NoEncryption()))
    disk.write_atomic(public, key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH),
                      "the SuperNode's public key")
    return private, public


@dataclass
class LocalDeployment:
    workdir: Path
    shards: list[Path]  # one SuperNode per client shard
    certs: Certs | None = None  # None: --insecure
    auth: bool = False  # SuperNode authentication: only nodes whose keys were registered may connect (needs certs)
    server_shard: Path | None = None  # default: the server/ directory beside the client shards
    port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    registered: dict[int, Path] = field(default_factory=dict)  # client -> its SuperNode's key, registered with this SuperLink

    def __post_init__(self) -> None:
        if self.auth and not self.certs:
            raise FedcacheError("SuperNode authentication needs TLS: give certs as well")
        if self.server_shard is None and self.shards:
            self.server_shard = Path(self.shards[0]).parent / SERVER

    @property
    def runs(self) -> Path:
        """The server's FEDCACHE_FLOWER_RUNS: each run writes run-<run id>/ here."""
        return self.workdir / "runs"

    @property
    def env(self) -> dict[str, str]:
        # Flower starts its helper processes (flower-superexec, flwr-serverapp, flwr-clientapp) by name.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        return {**os.environ, "PATH": path, "FLWR_HOME": str(self.workdir / "flwr-home"), "FLWR_TELEMETRY_ENABLED": "0"}

    def superlink_env(self) -> dict[str, str]:
        """The SuperLink's environment, which its ServerApp processes inherit: the server's own paths."""
        return {**self.env, SERVER_ENV["deploy.server_shard"]: str(self.server_shard), SERVER_ENV["deploy.out"]: str(self.runs)}

    def superlink_command(self) -> list[str]:
        tls = (["--ssl-ca-certfile", str(self.certs.ca), "--ssl-certfile", str(self.certs.cert),
                "--ssl-keyfile", str(self.certs.key)] if self.certs else ["--insecure"])
        auth = ["--enable-supernode-auth"] if self.auth else []
        return [_bin("flower-superlink"), *tls, *auth, "--host", HOST, "--port", str(self.port),
                "--disable-runtime-dependency-installation"]

    def supernode_command(self, shard: Path, runtime_port: int, key: Path | None = None) -> list[str]:
        tls = ["--root-certificates", str(self.certs.ca)] if self.certs else ["--insecure"]
        auth = ["--auth-supernode-private-key", str(key)] if key else []
        return [_bin("flower-supernode"), *tls, *auth, "--superlink", f"{HOST}:{self.port}", "--host", HOST,
                "--port", str(runtime_port), "--node-config", f"shard={json.dumps(str(shard))}"]

    def __enter__(self) -> "LocalDeployment":
        try:
            self._write_connection()
            self._spawn("superlink", self.superlink_command(), self.superlink_env())
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

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        with open(self.log(name), "ab") as fh:  # the child keeps its own descriptor
            self.procs[name] = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env or self.env,
                                                start_new_session=True, cwd=self.workdir)

    def start_node(self, i: int) -> None:
        """Client i's SuperNode; with auth, its key is made and registered with the SuperLink first (started again,
        it keeps its key, and so its node id)."""
        key = self.registered.get(i)
        if self.auth and key is None:
            key, public = node_keys(self.workdir / "keys", f"node{i}")
            self.flwr(["supernode", "register", str(public), CONNECTION])
            self.registered[i] = key
        self._spawn(f"node{i}", self.supernode_command(self.shards[i], free_port(), key))

    def start_unregistered_node(self, name: str, shard: Path) -> None:
        """A SuperNode with a key the SuperLink never registered (with auth it must be refused)."""
        key, _ = node_keys(self.workdir / "keys", name)
        self._spawn(name, self.supernode_command(shard, free_port(), key))

    def flwr(self, args: list[str], timeout: float = 60) -> str:
        """A `flwr` CLI command against this SuperLink; its output, or a FedcacheError with it."""
        proc = subprocess.run([_bin("flwr"), *args], env=self.env, cwd=self.workdir, capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)
        if proc.returncode != 0:
            raise FedcacheError(f"flwr {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        return proc.stdout

    def kill_node(self, i: int) -> None:
        _kill(self.procs.pop(f"node{i}"))

    def stop(self) -> None:
        for name in list(self.procs):
            _kill(self.procs.pop(name))

    def flwr_run_command(self, app: Path, run: FlowerRun) -> list[str]:
        overrides = " ".join(f"{k}={json.dumps(v)}" for k, v in run.to_config().items())
        return [_bin("flwr"), "run", str(app), CONNECTION, "--run-config", overrides, "--stream"]

    def run_dirs(self) -> set[Path]:
        return set(self.runs.glob("run-*"))

    def run(self, app: Path, run: FlowerRun, timeout: float) -> tuple[dict, Path]:
        """`flwr run` to the end; returns the server's summary.json and the run's directory."""
        before = self.run_dirs()
        proc = subprocess.run(self.flwr_run_command(app, run), env=self.env, cwd=self.workdir, capture_output=True,
                              text=True, timeout=timeout, start_new_session=True)
        new = sorted(self.run_dirs() - before)
        if len(new) != 1 or not (new[0] / SUMMARY).exists():
            raise FedcacheError(f"{_server_error(proc.stdout + proc.stderr)}the Flower run wrote no summary "
                                f"(flwr exited {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
        return json.loads((new[0] / SUMMARY).read_text()), new[0]


_SERVER_ERROR = re.compile(r"^fedcache\.[\w.]*Error: (.+)$", re.MULTILINE)


def _server_error(output: str) -> str:
    """The ServerApp's own fedcache error, to lead the message: flwr buries it in a streamed traceback."""
    found = _SERVER_ERROR.findall(output)
    return f"{found[-1]}\n\n" if found else ""


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
