"""tests/server/journal_file.py - the journal file's record framing (server/journal.c: each record
a u32 payload length, a u32 check and the payload, whose first u32 is its type), read from the
outside by test_journal.py and test_journal_grpc.py."""
import struct


def journal_records(data):
    """(offset, payload) of each record in data, in order (a cut last record's payload is shorter
    than its length says)."""
    off = 0
    while off + 8 <= len(data):
        size = struct.unpack_from("<I", data, off)[0]
        yield off, data[off + 8:off + 8 + size]
        off += 8 + size


def record_type(payload):
    return struct.unpack_from("<I", payload)[0]
