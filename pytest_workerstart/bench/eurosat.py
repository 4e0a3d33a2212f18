"""A EuroSAT-shaped JPEG set built offline from real photographs, and its dataset.

EuroSAT (the seed benchmark's workload) is 27,000 RGB 64x64 JPEGs in 10 class
folders. Nothing can be downloaded here, so each class gets one real photograph
shipped inside scikit-image and its images are random 64x64 crops (with flips)
of it, JPEG-encoded. What matters for worker start is kept: the file count, the
folder layout, the decode + resize pipeline, and an ``ImageFolder`` subclass whose
sample list makes the pickled dataset large (about 1.2 MB), which is what makes
serial spawn start block.

Generation is deterministic (fixed seed, fixed encoder settings); the tree's
SHA-256 is written to ``CHECKSUM`` and verified before any timing.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import torch
from torchvision.datasets import ImageFolder
from torchvision.io import decode_image, read_file
from torchvision.transforms import v2

from pytest_workerstart.bench._optional import require

#: EuroSAT's class names -> the scikit-image photograph their crops come from.
SOURCES = {
    "AnnualCrop": "grass",
    "Forest": "gravel",
    "HerbaceousVegetation": "immunohistochemistry",
    "Highway": "brick",
    "Industrial": "rocket",
    "Pasture": "coffee",
    "PermanentCrop": "chelsea",
    "Residential": "astronaut",
    "River": "retina",
    "SeaLake": "hubble_deep_field",
}
EUROSAT_PER_CLASS = 2700
SIZE = 64
SEED = 1553
JPEG_QUALITY = 90
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def default_root(per_class: int = EUROSAT_PER_CLASS) -> Path:
    base = os.environ.get("WORKERSTART_DATA") or Path.home() / ".cache" / "pytest-workerstart"
    return Path(base) / f"eurosat-like-{per_class}"


def tree_checksum(root: str | os.PathLike) -> str:
    """SHA-256 over every image's relative path and bytes, in sorted order."""
    root = Path(root)
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*.jpg")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def _source_rgb(name: str):
    import numpy as np

    img = getattr(require("skimage.data", "making the benchmark's dataset", "bench"), name)()
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    return np.ascontiguousarray(img[..., :3].astype(np.uint8))


def make_dataset(root: str | os.PathLike | None = None, per_class: int = EUROSAT_PER_CLASS,
                 seed: int = SEED) -> tuple[Path, str]:
    """Build the set under ``root`` (idempotent); return ``(root, checksum)``.

    A finished tree has a ``CHECKSUM`` file; it is verified, not rebuilt.
    """
    import numpy as np
    from PIL import Image

    root = Path(root) if root else default_root(per_class)
    stamp = root / "CHECKSUM"
    if stamp.exists():
        want = stamp.read_text().split()[0]
        got = tree_checksum(root)
        if got != want:
            raise RuntimeError(f"{root}: tree checksum {got[:12]} does not match its CHECKSUM {want[:12]}; "
                               f"delete the folder to rebuild it")
        return root, got
    rng = np.random.default_rng(seed)
    for cls, source in SOURCES.items():
        img = _source_rgb(source)
        h, w, _ = img.shape
        folder = root / cls
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            y = int(rng.integers(0, h - SIZE + 1))
            x = int(rng.integers(0, w - SIZE + 1))
            crop = img[y:y + SIZE, x:x + SIZE]
            if rng.random() < 0.5:
                crop = crop[:, ::-1]
            if rng.random() < 0.5:
                crop = crop[::-1, :]
            buf = io.BytesIO()
            Image.fromarray(np.ascontiguousarray(crop)).save(buf, format="JPEG", quality=JPEG_QUALITY)
            (folder / f"{cls}_{i + 1}.jpg").write_bytes(buf.getvalue())
    checksum = tree_checksum(root)
    stamp.write_text(f"{checksum}  per_class={per_class} seed={seed}\n")
    return root, checksum


def read_image(path: str) -> torch.Tensor:
    """The seed's reader: ``torchvision.io.decode_image`` on the file's bytes."""
    return decode_image(read_file(path))


def seed_transform() -> v2.Compose:
    """The seed's pipeline: float in [0, 1], resize to 256, crop 224, ImageNet normalization."""
    return v2.Compose([
        v2.ToDtype(torch.float32, scale=True),
        v2.Resize(256, antialias=True),
        v2.CenterCrop(224),
        v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


class EuroSATLike(ImageFolder):
    """``ImageFolder`` over a EuroSAT-layout folder (the real EuroSAT works unchanged).

    ``limit`` keeps the first ``limit`` samples of the sorted list (the suite's
    reduced workload); the pickle then shrinks with it.
    """

    def __init__(self, root: str, limit: int | None = None):
        super().__init__(root, transform=seed_transform(), loader=read_image)
        if limit is not None:
            step = max(1, len(self.samples) // limit)
            self.samples = self.samples[::step][:limit]
            self.imgs = self.samples
            self.targets = [t for _, t in self.samples]
