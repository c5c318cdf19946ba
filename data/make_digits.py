"""Write the UCI handwritten digits (as shipped by scikit-learn) as a folder of 32x32 PNGs.

    pip install scikit-learn        # only for this script; the project does not need it
    python data/make_digits.py --outdir=/tmp/digits32
    python dataset_tool.py --source=/tmp/digits32 --dest=data/digits32.zip

The 1,797 images are 8x8 with the 17 gray levels v = 0 (paper) .. 16 (ink). Each
is upsampled 4x by bicubic interpolation of the values, which are then rounded
back to the 17 levels and mapped to 0..255 (white digit on black):

    pixel = round(clip(round(bicubic(v)), 0, 16) * 255 / 16)

Keeping the source's gray levels costs nothing visible and roughly halves the
size of the PNGs (the interpolated fractions do not compress).
"""

import json
import os

import click
import numpy as np
import PIL.Image
import sklearn.datasets

OUTPUT_SIZE = 32    # Side of the written images.

@click.command()
@click.option('--outdir', help='Folder to write (must not exist)', required=True, metavar='DIR')
def main(outdir: str) -> None:
    """Write the digits as <outdir>/<index>.png, in the source's order, plus dataset.json with their classes."""
    digits = sklearn.datasets.load_digits()
    max_level = int(digits.images.max())  # 16
    os.makedirs(outdir)
    labels = []
    for idx, (levels, label) in enumerate(zip(digits.images, digits.target)):
        image = PIL.Image.fromarray(levels.astype(np.float32), mode='F')
        upsampled = np.asarray(image.resize((OUTPUT_SIZE, OUTPUT_SIZE), PIL.Image.Resampling.BICUBIC))
        pixels = np.round(np.clip(np.round(upsampled), 0, max_level) * (255 / max_level)).astype(np.uint8)
        fname = f'{idx:04d}.png'
        PIL.Image.fromarray(pixels).save(os.path.join(outdir, fname))
        labels.append([fname, int(label)])
    with open(os.path.join(outdir, 'dataset.json'), 'w') as f:
        json.dump({'labels': labels}, f)
    print(f'wrote {len(labels)} images to {outdir}')

if __name__ == '__main__':
    main()
