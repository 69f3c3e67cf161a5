#!/usr/bin/env python3
"""Write the committed seed corpus of the fuzz targets (fuzz/seeds/TARGET/*): a few
well-formed inputs each, so the fuzzer starts past the first checks. Run from anywhere."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field_varint(num, n):
    return varint(num << 3) + varint(n)


def field_bytes(num, b):
    return varint(num << 3 | 2) + varint(len(b)) + b


def shard_id(ino, stripe, index, version):
    return (field_varint(1, ino) + field_varint(2, stripe) + field_varint(3, index)
            + field_varint(4, version))


def request(method, body, bulk=b""):
    return struct.pack("<IIHH", len(body), len(bulk), method, 0) + body + bulk


def reply(method, body, bulk=b"", status=0, kind=0):
    # The header's last two bytes choose the reply type to decode (see wire::check_frames).
    return struct.pack("<IIBBH", len(body), len(bulk), status, kind, method) + body + bulk


def write(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


sid = shard_id(42, 7, 3, 9)
# wire_frames: byte 0 even = requests, odd = replies.
write("wire_frames", "meta-lookup", b"\0" + request(1, field_varint(1, 1) + field_bytes(2, b"a")))
write("wire_frames", "readdir-then-getattr",
      b"\0" + request(12, field_varint(1, 1) + field_varint(3, 100) + field_varint(4, 1))
      + request(2, field_varint(1, 1)))
write("wire_frames", "chunk-write-bulk", b"\0" + request(1, field_bytes(1, sid), b"x" * 300))
write("wire_frames", "chunk-read", b"\0" + request(2, field_bytes(1, sid) + field_varint(3, 4096)))
write("wire_frames", "chunk-delete",
      b"\0" + request(3, field_bytes(1, sid) + field_bytes(1, shard_id(43, 0, 0, 1))
                      + field_varint(2, 5) + field_bytes(3, b"c0ffee")))
write("wire_frames", "reply-read-bulk", b"\1" + reply(2, field_varint(2, 300), b"y" * 300))
write("wire_frames", "reply-error", b"\1" + reply(1, b"no such file", status=1, kind=1))

# shard_file: byte 0 = options (1: fix the fixed part's checksum, 2: expect the named shard).
def shard_file(ino, stripe, index, version, data):
    nblocks = (len(data) + 65535) // 65536
    header_len = (96 + 32 * nblocks + 4095) // 4096 * 4096
    fixed = (b"CAIRNSHD" + struct.pack("<HHIQQIIQQII", 1, 0, header_len, ino, stripe, index, 0,
                                       version, len(data), 65536, nblocks))
    head = fixed + b"\0" * 32 + b"\0" * (32 * nblocks)
    return head + b"\0" * (header_len - len(head)) + data


write("shard_file", "fixed-up", b"\3" + shard_file(42, 7, 3, 9, b"d" * 5000))
write("shard_file", "two-blocks", b"\3" + shard_file(1, 0, 0, 1, b"e" * 70000))
write("shard_file", "empty", b"\1" + shard_file(42, 7, 3, 9, b""))

# config: first line the file (\x01 for newlines), then env / --set lines.
write("config", "meta", b'listen = "127.0.0.1:9400"\x01data_dir = "/var/lib/cairn"\x01ec = "4+2"\n'
      b'SYNC_MODE=commit\nraft_election_ms=300')
write("config", "chunk", b'meta = "127.0.0.1:9400"\x01ssd_capacity = 8388608\n'
      b'QUEUE_DEPTH=64\nio_engine=pread')
write("config", "replicas", b'raft_id = 1\x01replicas = ["1=127.0.0.1:9400", "2=127.0.0.1:9401"]\n')

# meta_requests: records of (method byte, u16 length, protobuf request); the method numbers are
# the match arms of fuzz_targets/meta_requests.rs. A new namespace hands out inodes 2, 3, ...
def meta(method, body):
    return bytes([method]) + struct.pack("<H", len(body)) + body


def entry(parent, name, *rest):
    return field_varint(1, parent) + field_bytes(2, name) + b"".join(rest)


stripe = (field_varint(1, 0) + field_varint(2, 5) + field_varint(3, 5000) + field_varint(4, 5000))
write("meta_requests", "tree",
      meta(4, entry(1, b"d", field_varint(3, 0o755)))                         # mkdir /d -> 2
      + meta(3, entry(2, b"f", field_varint(3, 0o100644)))                     # create /d/f -> 3
      + meta(18, field_varint(1, 3) + field_varint(2, 5000) + field_bytes(3, stripe))  # commit
      + meta(8, field_varint(1, 3) + field_varint(2, 1) + field_bytes(3, b"g"))  # link /g
      + meta(7, entry(2, b"f", field_varint(3, 1), field_bytes(4, b"h")))      # rename to /h
      + meta(9, entry(1, b"s", field_bytes(3, b"d/f")))                        # symlink /s
      + meta(13, field_varint(1, 3) + field_bytes(2, b"user.a") + field_bytes(3, b"v"))
      + meta(2, field_varint(1, 3) + field_varint(5, 100))                     # truncate
      + meta(5, entry(1, b"g"))                                                # unlink /g
      + meta(6, entry(1, b"d"))                                                # rmdir /d
      + meta(11, field_varint(1, 1) + field_varint(3, 100) + field_varint(4, 1)))
write("meta_requests", "rename-into-itself",
      meta(4, entry(1, b"a", field_varint(3, 0o755)))                          # /a -> 2
      + meta(4, entry(2, b"b", field_varint(3, 0o755)))                        # /a/b -> 3
      + meta(7, entry(1, b"a", field_varint(3, 3), field_bytes(4, b"x")))      # /a into /a/b
      + meta(7, entry(2, b"b", field_varint(3, 1), field_bytes(4, b"a"), field_varint(5, 2))))
write("meta_requests", "open-unlink-release",
      meta(24, b"")                                                            # client 1
      + meta(3, entry(1, b"f", field_varint(3, 0o100644), field_varint(20, 1), field_varint(21, 1),
                      field_varint(23, 1)))
      + meta(5, entry(1, b"f"))
      + meta(20, field_varint(1, 1) + field_varint(2, 2) + field_varint(3, 7) + field_varint(6, 99))
      + meta(17, field_varint(1, 1) + field_varint(2, 2) + field_varint(3, 1)))
