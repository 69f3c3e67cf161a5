#!/usr/bin/env python3
"""bench/ml/gen.py ROOT: write a training dataset in four formats under ROOT, and ROOT/manifest.json
with the SHA-256 of every sample, so a loader can prove it read each one exactly once, intact.

  imagenet/CLASS/NAME.jpg   ImageNet-like: many ~110 KiB JPEG files in class directories
  wds/shard-NNNNN.tar       WebDataset-style tar shards: KEY.jpg + KEY.cls per sample
  tfrecord/train-NNNNN.tfrecord  TFRecord files of tf.train.Example {image/encoded, image/class/label}
  npz/case-NNNNN.npz        MLPerf Storage unet3d-like volumes: x float32 (S,S,S), y uint8 (S,S,S)

Every JPEG is a real, decodable image (random blocks, encoded by Pillow) made unique by a comment
segment, so no two samples share bytes. TFRecord files are written without TensorFlow (the record
framing and the Example protobuf are simple; CRC32C comes from the `crc32c` package).

  gen.py ROOT [--images 2000] [--classes 10] [--per-shard 256] [--npz 16] [--npz-side 96] [--seed 1]
"""
import argparse
import hashlib
import io
import json
import os
import struct
import tarfile

import crc32c
import numpy as np
from PIL import Image

JPEG_TARGET = 110 << 10  # bytes, like an average ImageNet training image


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def base_jpegs(rng, count):
    """A few distinct JPEGs of about JPEG_TARGET bytes: 8x8-pixel random blocks upscaled and
    noised, at a quality searched so the file lands near the target size."""
    out = []
    for _ in range(count):
        blocks = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
        pixels = np.kron(blocks, np.ones((8, 8, 1), dtype=np.uint8))
        pixels = np.clip(pixels.astype(np.int16) + rng.integers(-24, 24, pixels.shape), 0, 255)
        image = Image.fromarray(pixels.astype(np.uint8), "RGB")
        lo, hi, best = 10, 98, None
        while lo <= hi:
            quality = (lo + hi) // 2
            buf = io.BytesIO()
            image.save(buf, "JPEG", quality=quality)
            best = buf.getvalue()
            if len(best) < JPEG_TARGET:
                lo = quality + 1
            else:
                hi = quality - 1
        out.append(best)
    return out


def unique_jpeg(base, tag, rng):
    """The base JPEG with a comment segment (COM, 0xFFFE) after SOI carrying the sample's tag and
    up to 4 KiB of random filler: a distinct, still decodable file."""
    payload = tag.encode() + b"\0" + rng.bytes(int(rng.integers(0, 4096)))
    segment = b"\xff\xfe" + struct.pack(">H", len(payload) + 2) + payload
    return base[:2] + segment + base[2:]


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number, wire, payload):
    if wire == 2:
        return varint(number << 3 | 2) + varint(len(payload)) + payload
    return varint(number << 3 | wire) + payload


def example(image, label):
    """tf.train.Example {features {feature {"image/encoded": bytes_list} {"image/class/label":
    int64_list}}} in protobuf wire format."""
    bytes_feature = field(1, 2, field(1, 2, image))  # Feature.bytes_list = BytesList{value}
    int64_feature = field(3, 2, field(1, 2, varint(label)))  # Feature.int64_list, packed
    entries = b""
    for key, feature in ((b"image/encoded", bytes_feature), (b"image/class/label", int64_feature)):
        entry = field(1, 2, key) + field(2, 2, feature)  # map entry {key, value}
        entries += field(1, 2, entry)  # Features.feature
    return field(1, 2, entries)  # Example.features


def masked_crc(data):
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(out, record):
    length = struct.pack("<Q", len(record))
    out.write(length + struct.pack("<I", masked_crc(length)) + record + struct.pack("<I", masked_crc(record)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root")
    parser.add_argument("--images", type=int, default=2000, help="JPEG samples (each format holds them all)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--per-shard", type=int, default=256, help="samples per tar shard and per TFRecord file")
    parser.add_argument("--npz", type=int, default=16, help="unet3d-like volumes")
    parser.add_argument("--npz-side", type=int, default=96, help="edge of each cubic volume")
    parser.add_argument("--formats", default="imagenet,wds,tfrecord,npz")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    formats = set(args.formats.split(","))
    rng = np.random.default_rng(args.seed)
    bases = base_jpegs(rng, 16)
    manifest = {}

    samples = []  # (key, label, jpeg bytes) shared by the three image formats
    for i in range(args.images):
        label = i % args.classes
        key = f"{label:03d}-{i:07d}"
        samples.append((key, label, unique_jpeg(bases[i % len(bases)], key, rng)))

    if "imagenet" in formats:
        entries = {}
        for key, label, jpeg in samples:
            rel = f"imagenet/class-{label:03d}/{key}.jpg"
            os.makedirs(os.path.join(args.root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(args.root, rel), "wb") as f:
                f.write(jpeg)
            entries[key] = {"label": label, "sha256": sha256(jpeg)}
        manifest["imagenet"] = entries

    shards = [samples[i : i + args.per_shard] for i in range(0, len(samples), args.per_shard)]
    if "wds" in formats:
        os.makedirs(os.path.join(args.root, "wds"), exist_ok=True)
        entries = {}
        for n, shard in enumerate(shards):
            with tarfile.open(os.path.join(args.root, "wds", f"shard-{n:05d}.tar"), "w", format=tarfile.USTAR_FORMAT) as tar:
                for key, label, jpeg in shard:
                    for suffix, data in (("jpg", jpeg), ("cls", str(label).encode())):
                        info = tarfile.TarInfo(f"{key}.{suffix}")
                        info.size, info.mtime, info.mode = len(data), 0, 0o644
                        tar.addfile(info, io.BytesIO(data))
                    entries[key] = {"label": label, "sha256": sha256(jpeg)}
        manifest["wds"] = entries

    if "tfrecord" in formats:
        os.makedirs(os.path.join(args.root, "tfrecord"), exist_ok=True)
        entries = {}
        for n, shard in enumerate(shards):
            with open(os.path.join(args.root, "tfrecord", f"train-{n:05d}.tfrecord"), "wb") as f:
                for key, label, jpeg in shard:
                    tfrecord(f, example(jpeg, label))
                    entries[sha256(jpeg)] = {"label": label, "sha256": sha256(jpeg)}
        manifest["tfrecord"] = entries  # records carry no key: the image's hash names it

    if "npz" in formats:
        os.makedirs(os.path.join(args.root, "npz"), exist_ok=True)
        entries = {}
        side = args.npz_side
        for n in range(args.npz):
            x = rng.standard_normal((side, side, side), dtype=np.float32)
            y = (x > 1.0).astype(np.uint8)
            key = f"case-{n:05d}"
            np.savez(os.path.join(args.root, "npz", key + ".npz"), x=x, y=y)
            entries[key] = {"label": int(y.sum()), "sha256": sha256(x.tobytes() + y.tobytes())}
        manifest["npz"] = entries

    with open(os.path.join(args.root, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    total = sum(os.path.getsize(os.path.join(d, name)) for d, _, names in os.walk(args.root) for name in names)
    print(f"gen: {args.root}: {', '.join(f'{k} {len(v)} samples' for k, v in manifest.items())}; {total / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
