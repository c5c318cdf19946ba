"""The paper's training-speed table, measured here: G and D iterations per second of the CIFAR-10 ResNet for
vanilla, SN, 1-GP and GN, beside the paper's figures and their ratios.

\b
    python -m bench.paper_speed --out=paper-speed.json                           # a GPU: wall time
    python -m bench.paper_speed --clock=process --threads=1 --out=paper-speed.json  # a shared CPU: this process's CPU time

The paper (its appendix "Training Speed", Table "Training speed of generator and discriminator") times the
ResNet of cifar10-resnet (D batch 64, G batch 128) on one RTX 2080 Ti, with the exact double backward of GN
and in float32. This command times the same steps of this project under the same conditions: the training
loop's D step and G step (bench/train_speed.py's Configuration: GANLoss and Adam) of cifar10-resnet with
--norm none, sn, gp1 and gn, --precision=fp32, GN's plain double backward (no fast first-order G step, no
affine D step), no CUDA graphs, on random data, alternating the four methods in each round, medians over
--rounds rounds. Absolute speeds depend on the device; what compares across devices is the cost of each
method relative to vanilla (vanilla's it/s over the method's), the paper's 2.43x for GN's D step
(15.73 / 6.48) and 1.88x for its G step (6.91 / 3.68). Prints a table; --out writes it as JSON with the device,
torch version and date.
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import datetime
import os
import time

import click

import torch

from bench import paper
from bench.common import write_json_atomic
from bench.train_speed import Configuration, build_preset
from torch_utils import devices

CFG = 'cifar10-resnet'

#----------------------------------------------------------------------------


def speed_rows(results: dict[str, dict]) -> list[dict]:
    """Per method: our and the paper's iterations per second, and each one's cost relative to vanilla (x slower)."""
    rows = []
    ours_vanilla, paper_vanilla = results['Vanilla'], paper.SPEED['Vanilla']
    for method, (paper_G, paper_D) in paper.SPEED.items():
        ours = results[method]
        rows.append(dict(method=method, norm=paper.SPEED_NORMS[method], G_its=ours['G_its'], D_its=ours['D_its'],
                         paper_G_its=paper_G, paper_D_its=paper_D,
                         G_cost=ours_vanilla['G_its'] / ours['G_its'], D_cost=ours_vanilla['D_its'] / ours['D_its'],
                         paper_G_cost=paper_vanilla[0] / paper_G, paper_D_cost=paper_vanilla[1] / paper_D))
    return rows


def markdown(rows: list[dict], device_name: str) -> str:
    lines = [f'| method | `--norm` | G it/s ({device_name}) | D it/s ({device_name}) | G it/s (paper, {paper.SPEED_DEVICE}) | '
             f'D it/s (paper) | G cost / vanilla: ours, paper | D cost / vanilla: ours, paper |',
             '|---|---|---|---|---|---|---|---|']
    for r in rows:
        lines.append(f'| {r["method"]} | {r["norm"]} | {r["G_its"]:.3g} | {r["D_its"]:.3g} | {r["paper_G_its"]:.2f} | '
                     f'{r["paper_D_its"]:.2f} | {r["G_cost"]:.2f}x, {r["paper_G_cost"]:.2f}x | '
                     f'{r["D_cost"]:.2f}x, {r["paper_D_cost"]:.2f}x |')
    return '\n'.join(lines) + '\n'

#----------------------------------------------------------------------------


@click.command(help=__doc__)
@click.option('--rounds',   help='Timed rounds (one D and one G step of every method each)', type=click.IntRange(min=1), default=5, show_default=True)
@click.option('--warmup',   help='Untimed rounds first', type=click.IntRange(min=0), default=1, show_default=True)
@click.option('--batch',    help='D batch M (G gets 2M)  [default: the paper\'s 64]', type=click.IntRange(min=2))
@click.option('--threads',  help='torch intra-op threads  [default: torch\'s]', type=click.IntRange(min=1))
@click.option('--clock',    help='wall: elapsed time; process: CPU time of this process (a shared CPU)', type=click.Choice(['wall', 'process']), default='wall', show_default=True)
@click.option('--device',   help='cpu, cuda or cuda:N  [default: cuda if torch sees a GPU, else cpu]', metavar='DEVICE')
@click.option('--out',      help='JSON file for the results', metavar='PATH')
def main(rounds: int, warmup: int, batch: int | None, threads: int | None, clock: str, device: str | None, out: str | None) -> None:
    try:
        device = devices.parse_device(device)
    except ValueError as e:
        raise click.ClickException(f'--device: {e}')
    if clock == 'process' and device.type == 'cuda':
        raise click.ClickException('--clock=process measures CPU time, which says nothing about GPU work; use --clock=wall')
    if threads is not None:
        torch.set_num_threads(threads)
    clock_fn = time.perf_counter if clock == 'wall' else time.process_time
    norms = list(paper.SPEED_NORMS.values())
    preset = build_preset(CFG, norms, batch, None, None, device)
    runs = {method: Configuration(preset, norm, fast_g=False if norm == 'gn' else None, linear_d=False if norm == 'gn' else None,
                                  fuse=None, precision='fp32', device=device, clock=clock_fn, cuda_graphs='off')
            for method, norm in paper.SPEED_NORMS.items()}
    for round_idx in range(warmup + rounds):
        print(f'Round {round_idx + 1} of {warmup + rounds}{" (warm-up)" if round_idx < warmup else ""}...', flush=True)
        for run in runs.values():
            for net in ('D', 'G'):
                run.step(net, record=round_idx >= warmup)
    results = {}
    for method, run in runs.items():
        run.count_host_work()  # The row's ops and calls per step (bench/train_speed.py), which its result reports.
        row = run.result()
        results[method] = dict(G_its=1 / row['sec_per_G_step'], D_its=1 / row['sec_per_D_step'])
    rows = speed_rows(results)
    device_name = torch.cuda.get_device_name(device) if device.type == 'cuda' else f'CPU, {clock} time'
    text = markdown(rows, device_name)
    print(f'\n{CFG}, batch {preset["batch_D"]} / {preset["batch_G"]}, fp32, exact double backward; medians of {rounds} rounds:\n')
    print(text, end='')
    if out is not None:
        write_json_atomic(out, dict(
            benchmark=f'the paper\'s training-speed table: {CFG}, fp32, exact GN double backward, no CUDA graphs, medians',
            device=torch.cuda.get_device_name(device) if device.type == 'cuda' else f'CPU ({os.cpu_count()} cores)',
            threads=torch.get_num_threads(), clock=clock, load_average=os.getloadavg(), torch=torch.__version__,
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
            batch_D=preset['batch_D'], batch_G=preset['batch_G'], rounds=rounds, warmup=warmup, rows=rows))
        print(f'Results written to {out}')


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
