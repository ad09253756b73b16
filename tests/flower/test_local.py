"""The loopback deployment's helpers that need no running Flower process."""
import stat

from fedcache.flower.local import node_keys, self_signed


def test_private_keys_are_readable_by_their_owner_only(tmp_path):
    certs = self_signed(str(tmp_path / "certs"))  # a str, as one types it, or a Path
    private, _ = node_keys(tmp_path / "keys", "node0")
    assert stat.S_IMODE(certs.key.stat().st_mode) == stat.S_IMODE(private.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in certs.key.read_bytes() and certs.ca.exists() and certs.cert.exists()
