"""tests/server/owners.py - the owner the server writes to disk for an API key (server/auth.c
auth_owner), recomputed from the outside: the salted PBKDF2 form and the unsalted FNV form of
versions before owner.salt (test_journal_grpc.py owners, test_finetune.py)."""
import hashlib

OWNER_ROUNDS = 25000  # server/auth.c AUTH_OWNER_ITERATIONS: changing it gives every key another owner


def owner_of(key, salt_dir):
    """The owner the server derives for key: "key-" and 32 hex digits of PBKDF2-HMAC-SHA256 of the
    key with the installation's salt (salt_dir/owner.salt, 32 hex digits)."""
    salt = bytes.fromhex((salt_dir / "owner.salt").read_text().strip())
    return "key-" + hashlib.pbkdf2_hmac("sha256", key.encode(), salt, OWNER_ROUNDS, 16).hex()


def legacy_owner_of(key):
    """The owner versions before owner.salt wrote: FNV-1a 64 of "shardlm-owner:" and the key,
    from the offset basis that code used (1469598103934665603, a digit short of FNV's)."""
    h = 1469598103934665603
    for c in b"shardlm-owner:" + key.encode():
        h = ((h ^ c) * 0x100000001b3) & 0xffffffffffffffff
    return "key-%016x" % h
