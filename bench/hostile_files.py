"""Every entry point on hostile files: peak memory, time and message of each refusal.

    python -m bench.hostile_files                      # bombs expanding to 1 GiB
    python -m bench.hostile_files --bomb-mib=3072 --out=hostile.json
    python -m bench.hostile_files --repo=../before --only=tar,LMDB,download   # another checkout's entry points
    python -m bench.hostile_files --only='NVIDIA pickle' --variant-mib=100 --out=nvidia.json

The files (bench/hostile_cases.py) are zip, npz and tar bombs, archive entries claiming more bytes than
the file holds, truncated archives, a detector that is not TorchScript, CIFAR-10 batches and LMDB
databases made to take memory, a download (from a server on 127.0.0.1) larger than its cap, and NVIDIA
pickles made to run code, take memory or time, or break the reader (nvidia_variants). Each
command runs in its own process on the CPU; its peak resident memory is that process's alone (ru_maxrss
of wait4, Linux). The bound that the refusals must keep is torch_utils/bounded_read.py's (docs/metrics.md).
With --in-process, each entry point's cases run one after another in one process (after its imports), whose peak
memory above its footprint and wall time are those of reading the file. Prints a Markdown table; --out writes JSON.
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import datetime
import os
import tempfile

import click

from bench.common import write_json_atomic
from bench.hostile_cases import REPO, LoopbackServer, hostile_cases, run_cli, run_entry_point, send


@click.command()
@click.option('--bomb-mib', help='What each bomb expands to, MiB', type=click.IntRange(min=1), default=1024, show_default=True)
@click.option('--variant-mib', help='The NVIDIA pickle variants\' long source and storage, MiB', type=click.IntRange(min=1), default=100, show_default=True)
@click.option('--repo',     help='Run the entry points of this checkout  [default: this one]', metavar='DIR', default=REPO)
@click.option('--only',     help='Only the cases whose entry point or file contains one of these', metavar='TEXT,...')
@click.option('--in-process', help='Each entry point\'s cases in one process of this checkout, after its imports: the time and memory of the reading itself', is_flag=True)
@click.option('--out',      help='Write the results as JSON to this file', metavar='JSON')
def main(bomb_mib: int, variant_mib: int, repo: str, only: str | None, in_process: bool, out: str | None) -> None:
    """Every entry point on hostile files (bombs, lying and truncated archives, oversized downloads): peak memory,
    time and message of each refusal, as a Markdown table."""
    if in_process and os.path.abspath(repo) != REPO:
        raise click.ClickException('--in-process runs this checkout\'s entry points')
    rows = []
    print(f'| entry point | file | file size | peak memory{" above the footprint" if in_process else ""} | time | exit | last line of stderr |')
    print('|---|---|---|---|---|---|---|')
    with tempfile.TemporaryDirectory() as folder, \
            LoopbackServer({'/detector.pt': send(bomb_mib << 20, length=None)}, max_requests=16) as server:
        cases = [case for case in hostile_cases(folder, bomb_mib << 20, url=server.url(''), variant_bytes=variant_mib << 20)
                 if only is None or any(text in f'{case.entry} {case.file}' for text in only.split(','))]
        outcomes, footprints = {}, {}
        for script in dict.fromkeys(case.argv[0] for case in cases) if in_process else ():
            mine = [case for case in cases if case.argv[0] == script]
            footprints[script], results = run_entry_point(script, mine, cwd=folder)
            outcomes.update(zip(map(id, mine), results))
        for case in cases:
            outcome = outcomes.get(id(case)) or run_cli(case.argv, cwd=folder, env=case.env, repo=os.path.abspath(repo))
            above = footprints.get(case.argv[0]) or 0  # In process: the peak above the script's own footprint.
            message = outcome.last_line.replace(folder + os.sep, '').replace('|', '/')
            traceback = 'Traceback' in outcome.stderr
            rows.append(dict(entry=case.entry, file=case.file, file_size=case.file_size, peak_rss=outcome.peak_rss,
                             footprint=footprints.get(case.argv[0]), seconds=outcome.seconds, returncode=outcome.returncode,
                             last_line=message, traceback=traceback))
            print(f'| `{case.entry}` | {case.file} | {case.file_size / 2**20:.2f} MiB | {(outcome.peak_rss - above) / 2**20:.0f} MiB | '
                  f'{outcome.seconds:.1f} s | {outcome.returncode} | {"(traceback) " if traceback else ""}{message[:160]} |', flush=True)
    if out is not None:
        write_json_atomic(out, dict(date=datetime.date.today().isoformat(), bomb_bytes=bomb_mib << 20, variant_bytes=variant_mib << 20,
                                    repo=os.path.abspath(repo),
                                    rows=rows))


if __name__ == '__main__':
    main()
