"""How far fused crops decoded at a reduced DCT scale are from a full decode (docs/augment.md).

For each kind of image (photo-like, and bicubic noise with 8-px detail: the worst case), image
sizes from 500 to 3000 px (aspect ratios up to 4:1), random crops to 16-224 px and Resize +
CenterCrop: the mean |difference| per image, in levels, of every crop that took the reduced
scale, against torchvision's crop of the drawn box on a full decode. Prints median, p90, p99, max.
``--real``: the same on real photographs (scikit-image's and scikit-learn's sample photos, as
their cameras' JPEGs and through five encoders), for each ``--margins`` (the rule
``mmloader.readers.augment.fused.DCT_MARGIN``: how many times the output a reduced decode keeps).

    python benchmarks/reduced_scale.py [--images 8]
    python benchmarks/reduced_scale.py --real [--margins 3 4 6]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests" / "readers")]  # the tests' images

SIZES = ((1025, 769), (1500, 1000), (2048, 1365), (500, 2000), (2000, 500), (1001, 751), (1601, 1201), (3000, 2000))


def distances(kind: str, images: int) -> np.ndarray:
    from test_augment import noise_jpeg, photo_jpeg, reduced_scale_distances

    from mmloader.readers.augment import Augment, Crop

    augs = [Augment(crop=Crop.random(o)) for o in (16, 32, 64, 112, 224)]
    augs += [Augment(resize=r, crop=Crop.center(c)) for r, c in ((100, 96), (200, 160), (256, 224))]
    make = photo_jpeg if kind == "photo" else noise_jpeg
    found = reduced_scale_distances(make, SIZES, augs, [s + 100 for s in range(images)], lambda w, h: w + h)
    return np.array([mean for mean, _eighths in found])


def real(margin: int) -> np.ndarray:
    import test_augment

    import mmloader.readers.augment.fused as fused

    fused.DCT_MARGIN = test_augment.DCT_MARGIN = margin  # (the rule, and the test's view of it)
    return np.array(test_augment.real_photo_distances())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=8, help="images per size and kind (default 8)")
    parser.add_argument("--real", action="store_true", help="real photographs (needs scikit-image, scikit-learn)")
    parser.add_argument("--margins", type=int, nargs="+", default=[3, 4, 6], help="DCT_MARGIN values (--real)")
    args = parser.parse_args()
    if args.real:
        for margin in args.margins:
            m = real(margin)
            print(
                f"real photographs, margin {margin}: {len(m)} crops, median {np.median(m):.2f}, "
                f"p90 {np.percentile(m, 90):.2f}, p99 {np.percentile(m, 99):.2f}, max {m.max():.2f} levels"
            )
        return
    for kind in ("photo", "noise"):
        m = distances(kind, args.images)
        print(
            f"{kind}: {len(m)} crops, median {np.median(m):.2f}, p90 {np.percentile(m, 90):.2f}, "
            f"p99 {np.percentile(m, 99):.2f}, max {m.max():.2f} levels"
        )


if __name__ == "__main__":
    main()
