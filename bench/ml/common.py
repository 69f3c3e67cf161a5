"""What the PyTorch and TensorFlow loaders share: arguments, the dataset's files, the minimal
TFRecord/Example reader (for the framework that has none), checking every sample against the
manifest, timing epochs with an emulated accelerator, and the result lines."""
import argparse
import glob
import hashlib
import json
import os
import struct
import sys
import tarfile
import time

import crc32c

FORMATS = ("imagenet", "wds", "tfrecord", "npz")
CROP = 224  # the training crop every image is cut to, as in ImageNet recipes


def parse_args(framework):
    parser = argparse.ArgumentParser(description=f"Read a bench/ml/gen.py dataset with {framework}, epoch by epoch")
    parser.add_argument("root", help="the dataset (gen.py's ROOT), on the filesystem under test")
    parser.add_argument("--format", choices=FORMATS, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4, help="loader processes (torch) or parallel reads (tf.data)")
    parser.add_argument("--batch", type=int, default=0, help="samples per batch (default 64 images, 2 volumes)")
    parser.add_argument(
        "--compute-ms", type=float, default=0.0,
        help="emulated accelerator: sleep this long per batch, as MLPerf Storage does, and report utilisation",
    )
    parser.add_argument("--drop-caches", action="store_true", help="drop the page cache before the first epoch (root)")
    parser.add_argument("--label", default="", help="the filesystem's name in the result lines")
    parser.add_argument("--first-epoch", type=int, default=1, help="number of the first epoch in the result lines")
    parser.add_argument("--epoch-name", default="", help="name every epoch this way instead of epochN")
    parser.add_argument("--results", help="append result lines to this file")
    args = parser.parse_args()
    if not args.batch:
        args.batch = 2 if args.format == "npz" else 64
    return args


def files(root, fmt):
    pattern = {
        "imagenet": "imagenet/*/*.jpg",
        "wds": "wds/*.tar",
        "tfrecord": "tfrecord/*.tfrecord",
        "npz": "npz/*.npz",
    }[fmt]
    found = sorted(glob.glob(os.path.join(root, pattern)))
    if not found:
        sys.exit(f"no {fmt} files under {root} (run bench/ml/gen.py first)")
    return found


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def image_key(path):
    return os.path.splitext(os.path.basename(path))[0]


def image_label(path):
    return int(os.path.basename(os.path.dirname(path)).split("-")[1])


def tar_samples(path):
    """(key, jpeg bytes, label) of a WebDataset-style shard, read as a stream the way webdataset
    does: members of one key are adjacent."""
    current, parts = None, {}
    with tarfile.open(path, "r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, _, suffix = member.name.rpartition(".")
            if key != current and parts:
                yield current, parts["jpg"], int(parts["cls"])
                parts = {}
            current = key
            parts[suffix] = tar.extractfile(member).read()
    if parts:
        yield current, parts["jpg"], int(parts["cls"])


def _unmask(crc):
    rot = (crc - 0xA282EAD8) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def tfrecord_records(path):
    """Every record of a TFRecord file, checking both CRC32Cs the way TensorFlow's reader does."""
    with open(path, "rb") as f:
        while True:
            header = f.read(12)
            if not header:
                return
            if len(header) < 12:
                raise ValueError(f"{path}: truncated record header")
            length, length_crc = struct.unpack("<QI", header)
            if crc32c.crc32c(header[:8]) != _unmask(length_crc):
                raise ValueError(f"{path}: corrupt record length")
            data = f.read(length)
            (data_crc,) = struct.unpack("<I", f.read(4))
            if len(data) != length or crc32c.crc32c(data) != _unmask(data_crc):
                raise ValueError(f"{path}: corrupt record")
            yield data


def _fields(buf):
    """(field number, value) pairs of one protobuf message; value is bytes or an int."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 2:
            length, i = _varint(buf, i)
            yield number, buf[i : i + length]
            i += length
        elif wire == 0:
            value, i = _varint(buf, i)
            yield number, value
        else:
            raise ValueError(f"unexpected protobuf wire type {wire}")


def _varint(buf, i):
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def parse_example(record):
    """(image bytes, label) of a tf.train.Example with image/encoded and image/class/label."""
    out = {}
    for _, features in _fields(record):  # Example.features
        for _, entry in _fields(features):  # Features.feature map entries
            parts = dict(_fields(entry))
            name, feature = parts[1].decode(), parts[2]
            for kind, values in _fields(feature):  # Feature oneof: 1 bytes_list, 3 int64_list
                inner = list(_fields(values))
                if kind == 1:
                    out[name] = inner[0][1]
                elif kind == 3:
                    value = inner[0][1]
                    out[name] = _varint(value, 0)[0] if isinstance(value, bytes) else value
    return out["image/encoded"], out["image/class/label"]


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


class Epochs:
    """Times epochs, emulates the accelerator and checks every sample of each epoch against the
    manifest: each seen exactly once, with the bytes and label gen.py wrote."""

    def __init__(self, args, framework):
        self.args, self.framework = args, framework
        with open(os.path.join(args.root, "manifest.json")) as f:
            self.expected = json.load(f)[args.format]

    def run(self, epoch_batches):
        """epoch_batches(): an iterable of batches, each a list of (key, sha256, label, nbytes)."""
        args = self.args
        if args.drop_caches:
            drop_caches()
        for n in range(args.epochs):
            seen, nbytes, batches = {}, 0, 0
            start = time.perf_counter()
            for batch in epoch_batches():
                for key, digest, label, size in batch:
                    if key in seen:
                        sys.exit(f"{args.format}: sample {key} delivered twice in one epoch")
                    seen[key] = (digest, label)
                    nbytes += size
                batches += 1
                if args.compute_ms:
                    time.sleep(args.compute_ms / 1000)
            seconds = time.perf_counter() - start
            self.check(seen)
            name = args.epoch_name or f"epoch{args.first_epoch + n}"
            au = 100.0 * batches * args.compute_ms / 1000 / seconds if args.compute_ms else 0.0
            line = (
                f"{args.label or '-'} {self.framework} {args.format} {name} {len(seen) / seconds:.1f} "
                f"{nbytes / 2**20 / seconds:.1f} {au:.1f} {seconds:.2f}"
            )
            print(
                f"{self.framework} {args.format} {name}: {len(seen)} samples in {seconds:.2f} s, "
                f"{len(seen) / seconds:.1f} samples/s, {nbytes / 2**20 / seconds:.1f} MiB/s"
                + (f", accelerator utilisation {au:.1f}%" if args.compute_ms else "")
                + ", every sample verified",
                flush=True,
            )
            if args.results:
                with open(args.results, "a") as f:
                    f.write(line + "\n")

    def check(self, seen):
        missing = set(self.expected) - set(seen)
        if missing:
            sys.exit(f"{self.args.format}: {len(missing)} samples never delivered, e.g. {sorted(missing)[:3]}")
        for key, (digest, label) in seen.items():
            want = self.expected.get(key)
            if want is None:
                sys.exit(f"{self.args.format}: unexpected sample {key}")
            if want["sha256"] != digest or want["label"] != label:
                sys.exit(f"{self.args.format}: sample {key} differs from what was written")
