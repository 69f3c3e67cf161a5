#!/usr/bin/env python3
"""bench/ml/tf_loader.py ROOT --format imagenet|wds|tfrecord|npz: a real tf.data pipeline over a
bench/ml/gen.py dataset: TFRecordDataset files interleaved with parallel reads, JPEG files read
with tf.io.read_file, both decoded with tf.io.decode_jpeg; tar shards and .npz volumes (which
TensorFlow has no reader for) through parallel interleaved generators and numpy_function. Every
sample's bytes are checked against the manifest. One line per epoch, as torch_loader.py."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import common  # noqa: E402

# Fixed parallelism, autotuning off: with tf.data's autotuner the same pipeline ran at one of
# a few fixed rates (≈ 1160, 580 or 290 images/s on ext4 and Cairn alike, whatever the
# filesystem), which measured TensorFlow, not the filesystem. Decoding gets one call per core.
DECODE = os.cpu_count() or 1


def crop(image):
    return tf.image.resize_with_crop_or_pad(image, common.CROP, common.CROP)


def jpeg_files(args):
    paths = common.files(args.root, "imagenet")
    labels = [common.image_label(p) for p in paths]

    def read(path, label):
        return tf.io.read_file(path), label, path

    def decode(jpeg, label, path):
        return crop(tf.io.decode_jpeg(jpeg, channels=3)), label, jpeg, path

    # Reads and decodes are separate stages: --workers files are read at once (each read waits on
    # the filesystem, not on a core), decoding gets what the cores can give.
    return (
        tf.data.Dataset.from_tensor_slices((paths, labels))
        .shuffle(len(paths), reshuffle_each_iteration=True)
        .map(read, num_parallel_calls=max(args.workers, 1), deterministic=False)
        .map(decode, num_parallel_calls=DECODE, deterministic=False)
    )


def tfrecords(args):
    paths = common.files(args.root, "tfrecord")
    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        jpeg = example["image/encoded"]
        return crop(tf.io.decode_jpeg(jpeg, channels=3)), example["image/class/label"], jpeg, tf.constant("")

    return (
        tf.data.Dataset.from_tensor_slices(paths)
        .shuffle(len(paths), reshuffle_each_iteration=True)
        .interleave(
            lambda p: tf.data.TFRecordDataset(p, buffer_size=8 << 20),
            cycle_length=max(args.workers, 1),
            num_parallel_calls=max(args.workers, 1),
            deterministic=False,
        )
        .map(parse, num_parallel_calls=DECODE, deterministic=False)
    )


def tar_shards(args):
    paths = common.files(args.root, "wds")
    signature = (
        tf.TensorSpec([], tf.string),
        tf.TensorSpec([], tf.int64),
        tf.TensorSpec([], tf.string),
    )

    def shard(path):
        return tf.data.Dataset.from_generator(
            lambda p: ((jpeg, label, key) for key, jpeg, label in common.tar_samples(p.decode())),
            output_signature=signature,
            args=(path,),
        )

    def decode(jpeg, label, key):
        return crop(tf.io.decode_jpeg(jpeg, channels=3)), label, jpeg, key

    return (
        tf.data.Dataset.from_tensor_slices(paths)
        .shuffle(len(paths), reshuffle_each_iteration=True)
        .interleave(
            shard, cycle_length=max(args.workers, 1), num_parallel_calls=max(args.workers, 1), deterministic=False
        )
        .map(decode, num_parallel_calls=DECODE, deterministic=False)
    )


def volumes(args):
    paths = common.files(args.root, "npz")

    def load(path):
        with np.load(path.decode()) as data:
            return data["x"], data["y"]

    def read(path):
        x, y = tf.numpy_function(load, [path], (tf.float32, tf.uint8))
        return x, y, path

    return (
        tf.data.Dataset.from_tensor_slices(paths)
        .shuffle(len(paths), reshuffle_each_iteration=True)
        .map(read, num_parallel_calls=max(args.workers, 1), deterministic=False)
    )


def main():
    args = common.parse_args("TensorFlow")
    tf.config.threading.set_inter_op_parallelism_threads(max(args.workers, 1))
    build = {"imagenet": jpeg_files, "tfrecord": tfrecords, "wds": tar_shards, "npz": volumes}[args.format]
    dataset = build(args).batch(args.batch).prefetch(2)
    options = tf.data.Options()
    options.autotune.enabled = False
    # A read blocks its thread for the filesystem's latency: --workers reads in flight need that
    # many threads besides the decoders (tf.data's default pool has one per core).
    options.threading.private_threadpool_size = max(args.workers, 1) + DECODE
    dataset = dataset.with_options(options)

    def checks(batch):
        if args.format == "npz":
            xs, ys, paths = (t.numpy() for t in batch)
            for x, y, path in zip(xs, ys, paths):
                raw = x.tobytes() + y.tobytes()
                yield common.image_key(path.decode()), common.sha256(raw), int(y.sum()), len(raw)
            return
        _, labels, jpegs, keys = (t.numpy() for t in batch)
        for label, jpeg, key in zip(labels, jpegs, keys):
            digest = common.sha256(jpeg)
            key = key.decode()
            if args.format == "imagenet":
                key = common.image_key(key)
            yield key or digest, digest, int(label), len(jpeg)

    common.Epochs(args, "tf").run(lambda: (list(checks(batch)) for batch in dataset))


if __name__ == "__main__":
    main()
