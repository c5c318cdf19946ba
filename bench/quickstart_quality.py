"""How digit-like are the quick start's samples? A digit classifier judges a snapshot's generator.

    python -m bench.quickstart_quality --network=training-runs/00000-digits32-quickstart-gn/network-snapshot-000080.pkl
    python -m bench.quickstart_quality --network=before.pkl --network=after.pkl --out=quickstart-quality.json

A small CNN classifier is trained from scratch, with a fixed seed, on the labels of the embedded
digits (data/digits32.zip and its dataset.json; nothing is downloaded or cached): a stratified 80%
of the images train it, the other 20% measure its accuracy. Then, for each snapshot, its EMA
generator draws --num images (latents from --seed; a class-conditional generator is asked for the
ten classes in turn) and the script reports

  * confident: the share of images whose top class has softmax probability > --threshold (0.9),
    i.e. images the classifier reads as one particular digit;
  * classes: how many of the ten classes occur among those confident images (mode coverage);
  * as asked (class-conditional generators, and the real digits with their labels): the share of
    images that are confident and read as the class they were generated for;
  * FD: the Frechet distance between Gaussians fitted to the classifier's penultimate features
    (128-d) of the generated images and of the classifier's training split,
        d^2 = ||mu_g - mu_r||^2 + tr(S_g) + tr(S_r) - 2 tr((S_g S_r)^(1/2))
    (metrics.frechet_inception_distance.fid_from_stats), the FID recipe with this classifier in place
    of Inception.

The held-out real digits go through the same measurements as a reference row: what a perfect
generator would score (their FD uses 20% of the data, fewer samples than --num, so it is biased
upward a little). Prints a table and writes JSON with the device, torch version and date.

Everything runs at full float32 precision (TF32 off for matmuls and convolutions, as the metrics' detectors
do, torch_utils/devices.full_precision): the classifier, its features and the generated images are then the
same on every GPU, up to the order of floating-point sums.
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import datetime
import json
import os
import time

import click
import numpy as np

import torch
import torch.nn.functional as F
from torch import nn

from metrics.frechet_inception_distance import fid_from_stats
from torch_utils import devices, persistence
from training.data.dataset import ImageFolderDataset
from training.experiment import QUICKSTART_DATA


#----------------------------------------------------------------------------


class DigitClassifier(nn.Module):
    """[N, 1, 32, 32] in [-1, 1] -> 10 logits; `features` is the 128-d penultimate layer (after ReLU)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(1, 32, 3, padding=1), nn.Conv2d(32, 64, 3, padding=1),
                                    nn.Conv2d(64, 64, 3, padding=1)])  # 32 -> 16 -> 8 -> 4 after 2x2 max pools.
        self.fc = nn.Linear(64 * 4 * 4, 128)
        self.out = nn.Linear(128, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = F.max_pool2d(F.relu(conv(x)), 2)
        return F.relu(self.fc(x.flatten(1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.features(x))


def load_digits(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """All images as float [N, 1, 32, 32] in [-1, 1] (the training loop's scaling) and class indices [N]."""
    dataset = ImageFolderDataset(path=path, use_labels=True)
    images = np.stack([dataset[i][0] for i in range(len(dataset))])
    labels = np.stack([dataset.get_label(i) for i in range(len(dataset))]).argmax(axis=1)
    return torch.from_numpy(images).float() / 127.5 - 1, torch.from_numpy(labels)


def stratified_split(labels: torch.Tensor, test_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Indices of a train / test split holding `test_fraction` of every class out."""
    train, test = [], []
    for k in np.unique(labels.numpy()):
        idx = rng.permutation(np.flatnonzero(labels.numpy() == k))
        n_test = int(round(len(idx) * test_fraction))
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def random_shift(x: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Translate each image by up to `max_shift` pixels in x and y, filling with the background (-1)."""
    n, _, h, w = x.shape
    padded = F.pad(x, [max_shift] * 4, value=-1.0)
    dx, dy = (torch.randint(0, 2 * max_shift + 1, (2, n), generator=generator))
    return torch.stack([padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(n)])


def train_classifier(images: torch.Tensor, labels: torch.Tensor, epochs: int, seed: int) -> DigitClassifier:
    """Adam, batch 64, small random shifts (generated digits are not centred exactly like the data), on the
    images' device; the initial weights, batch order and shifts are drawn on the CPU, the same on every device."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    net = DigitClassifier().to(images.device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(epochs):
        order = torch.randperm(len(images), generator=generator)
        for batch in order.split(64):
            loss = F.cross_entropy(net(random_shift(images[batch], 2, generator)), labels[batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return net.eval().requires_grad_(False)


@torch.no_grad()
def classify(net: DigitClassifier, images: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Softmax probabilities [N, 10] and penultimate features [N, 128], float64."""
    probs, feats = [], []
    for x in images.split(256):
        f = net.features(x)
        feats.append(f)
        probs.append(F.softmax(net.out(f), dim=1))
    return torch.cat(probs).double().cpu().numpy(), torch.cat(feats).double().cpu().numpy()


def judge(net: DigitClassifier, images: torch.Tensor, classes: np.ndarray | None, ref_mu: np.ndarray,
          ref_sigma: np.ndarray, threshold: float) -> dict:
    """The measures of the module docstring; `classes`: the class each image was asked for (None: unconditional)."""
    probs, feats = classify(net, images)
    confident = probs.max(axis=1) > threshold
    counts = np.bincount(probs.argmax(axis=1)[confident], minlength=probs.shape[1])
    fd = fid_from_stats(feats.mean(axis=0), np.cov(feats, rowvar=False), ref_mu, ref_sigma)
    as_asked = None if classes is None else float((confident & (probs.argmax(axis=1) == classes)).mean())
    return dict(num=len(images), confident=float(confident.mean()), classes=int((counts > 0).sum()),
                as_asked=as_asked, confident_per_class=counts.tolist(), fd=float(fd))


@torch.no_grad()
def generate(network: str, num: int, seed: int, device: torch.device = torch.device('cpu')) -> tuple[torch.Tensor, np.ndarray | None]:
    """`num` images from the snapshot's EMA generator (its plain G if it has none), latents from `seed`, and
    the class each was generated for, drawn on `device` (0, 1, ..., 9, 0, ... for a conditional G; None for an unconditional one).
    A progressive G snapshotted while growing draws at its active resolution, and one grown only to 8x8 or
    16x16 (train.py --resolution) draws at that; those images are brought to 32x32 by nearest-neighbour
    upsampling, as a growing run itself shows them to D (training/recipes/progressive.py)."""
    try:
        snapshot = persistence.load_snapshot(network)
    except (OSError, persistence.UnsafeSnapshotError) as e:
        raise click.ClickException(f'--network: {e}')
    G = snapshot.get('G_ema', snapshot.get('G'))
    if G is not None:
        G = G.to(device)
    if G is None or G.c_dim not in (0, 10) or G.img_channels != 1 or G.img_resolution not in (8, 16, 32):
        raise click.ClickException(f'--network: {network} holds no 8x8, 16x16 or 32x32 grayscale digit generator '
                                   f'(unconditional or with the ten digit classes)')
    z = torch.from_numpy(np.random.default_rng(seed).standard_normal([num, G.z_dim])).float().to(device)
    classes = np.arange(num) % 10 if G.c_dim else None
    c = (torch.zeros(num, 0) if classes is None else F.one_hot(torch.from_numpy(classes), 10).float()).to(device)
    images = torch.cat([G(zb, cb) for zb, cb in zip(z.split(256), c.split(256))])
    if images.shape[-1] < 32:
        images = F.interpolate(images, size=[32, 32], mode='nearest')
    return images, classes

def trained_judge(epochs: int, seed: int, device: torch.device = torch.device('cpu')) -> dict:
    """The classifier trained on `device` on a stratified 80% of the digits, with what judging needs: `net`, the
    reference statistics `ref_mu`, `ref_sigma` of its training split's features, and the held-out `test_images`,
    `test_labels` and `accuracy`."""
    images, labels = load_digits(QUICKSTART_DATA)
    images, labels = images.to(device), labels.to(device)
    train_idx, test_idx = stratified_split(labels.cpu(), 0.2, np.random.default_rng(seed))
    net = train_classifier(images[train_idx], labels[train_idx], epochs=epochs, seed=seed)
    _, train_feats = classify(net, images[train_idx])
    test_probs, _ = classify(net, images[test_idx])
    return dict(net=net, ref_mu=train_feats.mean(axis=0), ref_sigma=np.cov(train_feats, rowvar=False),
                test_images=images[test_idx], test_labels=labels[test_idx].cpu().numpy(), num_train=len(train_idx),
                accuracy=float((test_probs.argmax(axis=1) == labels[test_idx].cpu().numpy()).mean()))

#----------------------------------------------------------------------------


@click.command()
@click.option('--network', 'networks', help='Snapshot to judge (repeat for several)', metavar='PKL', multiple=True, required=True)
@click.option('--num',                 help='Generated images per snapshot', type=click.IntRange(min=2), default=2000, show_default=True)
@click.option('--threshold',           help='Softmax probability above which an image counts as a confident digit', type=click.FloatRange(0, 1, max_open=True), default=0.9, show_default=True)
@click.option('--epochs',              help='Classifier training epochs', type=click.IntRange(min=1), default=15, show_default=True)
@click.option('--seed',                help='Seed of the classifier, the data split and the latents', type=click.IntRange(min=0), default=0, show_default=True)
@click.option('--device',              help='cpu, cuda or cuda:N  [default: cuda if torch sees a GPU, else cpu]', metavar='DEVICE')
@click.option('--out',                 help='Write the results as JSON here', metavar='JSON')
def main(networks: tuple[str, ...], num: int, threshold: float, epochs: int, seed: int, device: str | None,
         out: str | None) -> None:
    """Judge quick-start snapshots with a digit classifier trained on the embedded digits' labels."""
    try:
        device = devices.parse_device(device)
    except ValueError as e:
        raise click.ClickException(f'--device: {e}')
    for network in networks:
        if not os.path.isfile(network):
            raise click.ClickException(f'--network: no such file: {network}')
    start = time.time()
    with devices.full_precision():  # The same classifier, features and images on every GPU (module docstring).
        j = trained_judge(epochs, seed, device)
        net, ref_mu, ref_sigma, accuracy = j['net'], j['ref_mu'], j['ref_sigma'], j['accuracy']
        num_test = len(j['test_labels'])
        print(f'Classifier: {j["num_train"]} training digits, {epochs} epochs, held-out accuracy {accuracy:.3f} '
              f'on {num_test} digits ({time.time() - start:.0f} s)')

        real = judge(net, j['test_images'], j['test_labels'], ref_mu, ref_sigma, threshold)
        rows = [dict(name=f'real digits (held-out {num_test})', **real)]
        for network in networks:
            rows.append(dict(name=network, **judge(net, *generate(network, num, seed, device), ref_mu, ref_sigma, threshold)))

    print()
    print(f'| images | n | confident (p > {threshold:g}) | classes | as asked | FD |')
    print('|---|---|---|---|---|---|')
    for row in rows:
        as_asked = '' if row['as_asked'] is None else f'{row["as_asked"]:.1%}'
        print(f'| {row["name"]} | {row["num"]} | {row["confident"]:.1%} | {row["classes"]} / 10 | {as_asked} | {row["fd"]:.2f} |')
    if out is not None:
        result = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
                      device=torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu', cpu_count=os.cpu_count(), torch=torch.__version__, num_threads=torch.get_num_threads(),
                      threshold=threshold, num=num, epochs=epochs, seed=seed, classifier_train=j['num_train'],
                      classifier_test=num_test, classifier_accuracy=accuracy, rows=rows)
        with open(out, 'wt') as f:
            json.dump(result, f, indent=2)
        print(f'Wrote {out}')


if __name__ == '__main__':
    main()
