"""The Lipschitz constant of every layer of a snapshot's discriminator (metrics/layer_norms.py), and the GN-GAN
paper's panel (c) of the depth study for two snapshots or more.

\b
    python -m bench.layer_norms --network=runs/00003-digits32-cifar10-cnn-sn/network-snapshot-000400.pkl
    python -m bench.layer_norms --network=sn-9l.pkl --label=SN-9L --network=gn-9l.pkl --label=GN-9L --out=layers.png

Prints, per snapshot, each conv/linear layer of D in forward order with the input shape it is applied to, its
operator norm as applied (power iteration to --tol), the largest singular value of its reshaped weight (what
spectral normalization divides by, as the layer uses it), and under SN that of the raw weight; and the product of
the operator norms, an upper bound of D's Lipschitz constant for 1-Lipschitz activations. With --out, draws the
operator norms against the layer index, one line per snapshot (log scale), as the paper's panel (c).
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import math
import os

import click

import legacy
from bench.common import no_figure, pyplot
from metrics import layer_norms
from torch_utils import persistence

#----------------------------------------------------------------------------


def draw_panel(ax, series: dict[str, list[layer_norms.LayerNorm]]) -> None:
    """Operator norm per layer index, one line per labelled list of LayerNorms, log y, the bound 1 dashed."""
    for label, norms in series.items():
        ax.plot(range(1, len(norms) + 1), [n.operator_norm for n in norms], marker='o', label=label)
    ax.axhline(1.0, color='gray', linestyle='--', linewidth=1)
    ax.set_yscale('log')
    ax.set_xlabel('layer (input to output)')
    ax.set_ylabel('Lipschitz constant of the layer')
    ax.legend()


def load_discriminator(path: str):
    try:
        snapshot = legacy.load_network(path)
    except (persistence.UnsafeSnapshotError, legacy.OfficialCheckpointError, OSError) as e:
        raise click.ClickException(f'cannot load --network={path}: {str(e).splitlines()[0]}')
    D = snapshot.get('D')
    if D is None:
        raise click.ClickException(f'{path} holds no discriminator (D)')
    return D


@click.command(help=__doc__)
@click.option('--network', 'networks', multiple=True, required=True, help='Snapshot .pkl (repeat for several).')
@click.option('--label', 'labels', multiple=True, help='Name of each snapshot in the figure (default: its file name).')
@click.option('--out', type=click.Path(dir_okay=False), help='Draw panel (c) to this .png (two snapshots or more).')
@click.option('--tol', default=1e-6, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help='Power iteration stops when sigma changes by at most tol * sigma in a step.')
def main(networks: tuple[str, ...], labels: tuple[str, ...], out: str | None, tol: float) -> None:
    if labels and len(labels) != len(networks):
        raise click.BadParameter(f'give one per --network ({len(networks)}), or none', param_hint='--label')
    if out is not None and len(networks) < 2:
        raise click.BadParameter('panel (c) compares two snapshots or more: give --network twice', param_hint='--out')
    labels = labels or tuple(os.path.basename(path) for path in networks)
    series = {}
    for label, path in zip(labels, networks):
        norms = layer_norms.layer_norms(load_discriminator(path), tol=tol)
        series[label] = norms
        product = math.prod(n.operator_norm for n in norms)
        print(f'{label}: {len(norms)} layers, product of the operator norms {product:.4g}')
        print(layer_norms.format_table(norms))
    plt = None if out is None else pyplot()
    if out is not None and plt is None:
        print(no_figure(out))
    elif out is not None:
        fig, ax = plt.subplots(figsize=(6, 4))
        draw_panel(ax, series)
        fig.tight_layout()
        fig.savefig(out, dpi=100)
        plt.close(fig)
        print(f'wrote {out}')


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
