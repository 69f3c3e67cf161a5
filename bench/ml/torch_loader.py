#!/usr/bin/env python3
"""bench/ml/torch_loader.py ROOT --format imagenet|wds|tfrecord|npz: a real
torch.utils.data.DataLoader (worker processes, shuffling, batching, pinned collation) over a
bench/ml/gen.py dataset. Images are decoded with Pillow and cut to a 224x224 crop, volumes loaded
with NumPy; every sample's bytes are checked against the manifest. One line per epoch: samples/s,
MiB/s and, with --compute-ms, the emulated accelerator's utilisation."""
import io
import warnings

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

import common


def decode(jpeg):
    """JPEG bytes to a CHW uint8 tensor of the centre crop, the work a training transform does."""
    image = Image.open(io.BytesIO(jpeg)).convert("RGB")
    width, height = image.size
    left, top = (width - common.CROP) // 2, (height - common.CROP) // 2
    image = image.crop((left, top, left + common.CROP, top + common.CROP))
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


class ImageFiles(Dataset):
    """One JPEG file per sample, label from the class directory (torchvision's ImageFolder)."""

    def __init__(self, root):
        self.paths = common.files(root, "imagenet")

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        path = self.paths[i]
        with open(path, "rb") as f:
            jpeg = f.read()
        label = common.image_label(path)
        return decode(jpeg), label, (common.image_key(path), common.sha256(jpeg), label, len(jpeg))


class Shards(IterableDataset):
    """Large sequential files (tar shards or TFRecords), split between workers by file, in a new
    shuffled order every epoch, as webdataset and TFRecord readers for PyTorch do."""

    def __init__(self, root, fmt):
        self.paths, self.fmt, self.epoch = common.files(root, fmt), fmt, 0

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        order = torch.randperm(len(self.paths), generator=torch.Generator().manual_seed(self.epoch)).tolist()
        for i in order[worker::workers]:
            for key, jpeg, label in self.samples(self.paths[i]):
                yield decode(jpeg), label, (key, common.sha256(jpeg), label, len(jpeg))

    def samples(self, path):
        if self.fmt == "wds":
            yield from common.tar_samples(path)
        else:
            for record in common.tfrecord_records(path):
                jpeg, label = common.parse_example(record)
                yield common.sha256(jpeg), jpeg, label


class Volumes(Dataset):
    """unet3d-like .npz volumes: image and mask arrays."""

    def __init__(self, root):
        self.paths = common.files(root, "npz")

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        path = self.paths[i]
        with np.load(path) as data:
            x, y = data["x"], data["y"]
        raw = x.tobytes() + y.tobytes()
        return torch.from_numpy(x), torch.from_numpy(y), (common.image_key(path), common.sha256(raw), int(y.sum()), len(raw))


def collate(items):
    """Stack the tensors as the default collation does; keep the per-sample checks as a list."""
    first, second, checks = zip(*items)
    second = torch.stack(second) if isinstance(second[0], torch.Tensor) else torch.tensor(second)
    return torch.stack(first), second, list(checks)


def main():
    args = common.parse_args("PyTorch")
    torch.set_num_threads(1)
    # More workers than cores is a choice here (workers wait on I/O); don't warn about it.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    if args.format == "imagenet":
        dataset = ImageFiles(args.root)
    elif args.format == "npz":
        dataset = Volumes(args.root)
    else:
        dataset = Shards(args.root, args.format)
    shuffle = not isinstance(dataset, IterableDataset)
    loader = DataLoader(
        dataset,
        batch_size=args.batch,
        shuffle=shuffle,
        num_workers=args.workers,
        collate_fn=collate,
        persistent_workers=False,
        prefetch_factor=2 if args.workers else None,
    )

    def batches():
        if isinstance(dataset, Shards):
            dataset.epoch += 1
        for _, _, checks in loader:
            yield checks

    common.Epochs(args, "torch").run(batches)


if __name__ == "__main__":
    main()
