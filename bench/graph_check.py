"""How often the first-replay check throws a CORRECT graph away under kernels that round differently at every run.

\b
    python -m bench.graph_check --out=graph-check.json
    python -m bench.graph_check --cfgs=quickstart --trials=100 --capabilities=default --out=graph-check.json

training/step/graphs.py checks the first replay of each graph against two eager runs of its step from the same state.
Where kernels are noisy (atomics), rounding flips the odd activation across a kink, so a correct replay fails one check
with a small probability p; a replay that fails gets a second, independent check (CHECK_ROUNDS = 2), so that a correct
graph is thrown away with probability about p^2. This program measures both under the CPU emulation of the GPU's
noisy kernels (bench/graph_emulator.kernel_noise, the noisy-kernel tests' noise) and of CUDA graphs.

For each preset (the narrow networks and short schedules of tests/test_training_step.py's Run) the training steps run
with graphs under the noise; at the first replay of each graph key (D and G, StyleGAN2's regularised variants,
gn-stylegan's levels), before the run's own check, the check runs --trials times with one check and --trials times
with CHECK_ROUNDS checks, each from that same state with fresh noise (the graph is kept whatever the verdict), and
the run then goes on. Each CPU kernel set torch can use here (ATEN_CPU_CAPABILITY: default, avx2, avx512; read when
torch starts) runs in a process of its own. Every graph here is correct (the emulation replays exactly the step's
operators), so every rejection is a false one.

Prints per preset and kernel set: single checks run (the first and the second of a trial alike) and failed, p with its
exact (Clopper-Pearson) two-sided 95% interval and the bound it puts on p^2, the largest error of a check (1 passes),
and of the trials allowed CHECK_ROUNDS checks those that threw the graph away, with the upper 95% bound of that rate.
--out writes the same as JSON, with the device, torch version and date.
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import contextlib
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

import click
import scipy.stats
import torch

from bench.common import parse_list, write_json_atomic
from bench.graph_emulator import EmulatedGraphs, ShortRun, capturable_on_cpu, kernel_noise
from torch_utils import training_stats
from training.recipes import configs
from training.step import graphs, training_step

# The quick start, stl10-cnn (whose G step's check failed a correct graph on AVX2 and AVX-512 kernels before the second
# check), a ResNet, both StyleGANs.
CFGS = ('quickstart', 'stl10-cnn', 'cifar10-resnet', 'gn-stylegan', 'gn-stylegan2')
CAPABILITIES = ('default', 'avx2', 'avx512')  # ATEN_CPU_CAPABILITY's x86 kernel sets, in order.
CONFIDENCE = 0.95
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # Where `python -m bench.graph_check` runs.
WORKER_ENV = 'GRAPH_CHECK_WORKER_OUT'  # Set for the process of one kernel set: where it writes its counts.

#----------------------------------------------------------------------------


def capabilities_here() -> list[str]:
    """The kernel sets ATEN_CPU_CAPABILITY can choose on this CPU: those up to the one torch picks by itself."""
    own = torch.backends.cpu.get_cpu_capability().lower()
    if own not in CAPABILITIES:
        return ['default', own]
    return list(CAPABILITIES[:CAPABILITIES.index(own) + 1])


def clopper_pearson(failed: int, trials: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The exact two-sided `confidence` interval of a binomial rate from `failed` of `trials`:
    lower = Beta^-1(a/2; k, n - k + 1), upper = Beta^-1(1 - a/2; k + 1, n - k), with a = 1 - confidence."""
    alpha = 1 - confidence
    lower = 0.0 if failed == 0 else float(scipy.stats.beta.ppf(alpha / 2, failed, trials - failed + 1))
    upper = 1.0 if failed == trials else float(scipy.stats.beta.ppf(1 - alpha / 2, failed + 1, trials - failed))
    return lower, upper


class _Preset(ShortRun):
    """A preset's short run (bench/graph_emulator.py), trained through TrainingStep on random reals."""

    def train(self, engine, log) -> training_step.TrainingStep:
        """The schedule's steps through TrainingStep with `engine` capturing and replaying, on random reals."""
        steps = training_step.TrainingStep(self.G, self.D, self.G_opt, self.D_opt, self.loss, G_ema=self.G_ema,
                                           group_size=self.experiment.schedule.group_size, graph_engine=engine, log=log)
        torch.manual_seed(1)
        generator = torch.Generator().manual_seed(2)
        for index, plan in enumerate(self.plans):
            size = self.resolution >> (0 if plan.lod is None else int(plan.lod))
            labels = lambda n: (torch.eye(self.G.c_dim)[torch.randint(self.G.c_dim, [n], generator=generator)]
                                if self.G.c_dim else torch.zeros(n, 0))
            steps.set_plan(plan)
            for _ in range(plan.n_dis):
                real = torch.rand(plan.share_D, 3, size, size, generator=generator) * 2 - 1
                steps.discriminator(real, labels(plan.share_D), labels(plan.share_D), plan.rounds_D, index)
            steps.generator(labels(plan.share_G), plan.rounds_G, index, plan.ema_beta)
        return steps


def _checks_from_one_state(check, captured: graphs.CapturedStep, key, entry, eager_step, trials: int) -> dict:
    """The check of `entry`'s first replay (check: CapturedStep._check) run `trials` times with one check and `trials`
    times with CHECK_ROUNDS, each from the state it found, the graph kept whatever the verdict; that state is left as
    found. Per number of checks allowed: how many trials rejected the graph, how many single checks ran and failed
    (every check counts, the first and the second of a trial alike: each is an independent check from that state),
    and the largest error of a check (1 passes)."""
    state, engine = captured.state(), captured.engine
    before, rng = [t.clone() for t in state], engine.rng_state()
    statistics = entry.statistics.clone()
    rejected, errors = [], []
    replay_error = graphs.replay_error

    def recorded_error(*args) -> float:
        errors.append(replay_error(*args))
        return errors[-1]
    captured._stay_eager = lambda key, why: rejected.append(why)  # The graph stays for the next trial.
    rounds_kept = graphs.CHECK_ROUNDS
    counts = {}
    try:
        for rounds in (1, rounds_kept):
            graphs.CHECK_ROUNDS = rounds
            graphs.replay_error = recorded_error
            failed, errors[:] = 0, []
            for _ in range(trials):
                graphs.restore(state, before)
                engine.set_rng_state(rng)
                entry.statistics.copy_(statistics)
                entry.checked = False
                count = len(rejected)
                with training_stats.discarded():
                    check(captured, key, entry, eager_step)
                failed += len(rejected) > count
            counts[rounds] = dict(failed=failed, checks=len(errors), checks_failed=sum(e > 1 for e in errors),
                                  largest_error=max(errors))
    finally:
        graphs.CHECK_ROUNDS, graphs.replay_error = rounds_kept, replay_error
        del captured._stay_eager
        graphs.restore(state, before)
        engine.set_rng_state(rng)
        entry.statistics.copy_(statistics)
        entry.checked = False
    return dict(single=counts[1], rounds=counts[rounds_kept], check_rounds=rounds_kept)


def measure_preset(cfg_name: str, trials: int, keys_per_step: int, seed: int = 0) -> list[dict]:
    """Per graph key of the preset's short run under noisy kernels, the first `keys_per_step` of D's and of G's: its
    check's verdicts (_checks_from_one_state)."""
    results, lines = [], []
    with _patched() as patch:
        capturable_on_cpu(patch)
        patch.setattr(graphs, 'WARMUP_STEPS', 1)
        check = graphs.CapturedStep._check

        def measured_check(self, key, entry, eager_step):
            if sum(r['step'] == self.name for r in results) >= keys_per_step:
                return check(self, key, entry, eager_step)
            start = time.perf_counter()
            result = _checks_from_one_state(check, self, key, entry, eager_step, trials)
            results.append(dict(step=self.name, key=repr(key[-2:]), seconds=time.perf_counter() - start, **result))
            check(self, key, entry, eager_step)
        patch.setattr(graphs.CapturedStep, '_check', measured_check)
        with kernel_noise(seed=seed):
            _Preset(cfg_name).train(EmulatedGraphs(), lines.append)
    training_stats._pending.clear()
    return results


@contextlib.contextmanager
def _patched():
    """Attributes replaced inside, restored after (pytest's MonkeyPatch, which the emulation's helpers take)."""
    import pytest
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _worker(cfgs: list[str], trials: int, keys_per_step: int, out: str) -> None:
    """This process's kernel set: every preset's measurements, as JSON to `out`."""
    data = dict(capability=torch.backends.cpu.get_cpu_capability(), presets={})
    for cfg_name in cfgs:
        start = time.perf_counter()
        keys = measure_preset(cfg_name, trials, keys_per_step)
        data['presets'][cfg_name] = dict(keys=keys, seconds=time.perf_counter() - start)
        print(f'  {data["capability"]:>8} {cfg_name}: {time.perf_counter() - start:.0f} s', flush=True)
    write_json_atomic(out, data)


def _row(capability: str, cfg_name: str, keys: list[dict], trials: int, seconds: float) -> dict:
    """One line of the table: the graph keys' trials together. p: single checks failed over single checks run (those
    of both phases); thrown away: trials whose CHECK_ROUNDS checks all failed; bound_p2, the upper bound of p squared,
    the rate at which two independent checks both fail."""
    checks = sum(k['single']['checks'] + k['rounds']['checks'] for k in keys)
    single = sum(k['single']['checks_failed'] + k['rounds']['checks_failed'] for k in keys)
    thrown = sum(k['rounds']['failed'] for k in keys)
    low, high = clopper_pearson(single, checks)
    return dict(capability=capability, cfg=cfg_name, keys=len(keys), checks=checks, single_failed=single,
                p=single / checks, p_interval=[low, high], bound_p2=high ** 2,
                largest_error=max(max(k['single']['largest_error'], k['rounds']['largest_error']) for k in keys),
                trials=len(keys) * trials, thrown_away=thrown,
                thrown_away_upper=clopper_pearson(thrown, len(keys) * trials)[1], seconds=seconds)


def summary_rows(measured: dict[str, dict], trials: int) -> list[dict]:
    """Per kernel set and preset, then per kernel set over every preset, then over everything (capability or cfg
    'all')."""
    rows, everything = [], []
    for capability, data in measured.items():
        all_keys = []
        for cfg_name, preset in data['presets'].items():
            rows.append(_row(capability, cfg_name, preset['keys'], trials, preset['seconds']))
            all_keys += preset['keys']
        rows.append(_row(capability, 'all', all_keys, trials, sum(p['seconds'] for p in data['presets'].values())))
        everything += all_keys
    rows.append(_row('all', 'all', everything, trials, sum(r['seconds'] for r in rows if r['cfg'] == 'all')))
    return rows


def print_table(rows: list[dict], check_rounds: int) -> None:
    print(f'{"kernels":>8} {"preset":>15} {"keys":>4} {"checks":>6} {"failed":>6} {"p":>7} {"95% interval":>17} '
          f'{"p^2 <=":>8} {"max err":>7} {"trials":>6} {f"{check_rounds} failed":>8} {"95% upper":>9} {"s":>5}')
    for r in rows:
        low, high = r['p_interval']
        print(f'{r["capability"]:>8} {r["cfg"]:>15} {r["keys"]:>4} {r["checks"]:>6} {r["single_failed"]:>6} '
              f'{r["p"]:>7.4f} {f"[{low:.4f}, {high:.4f}]":>17} {r["bound_p2"]:>8.2g} {r["largest_error"]:>7.3g} '
              f'{r["trials"]:>6} {r["thrown_away"]:>8} {r["thrown_away_upper"]:>9.4f} {r["seconds"]:>5.0f}')


def _parse_capabilities(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str]:
    """click callback: the kernel sets asked for, each one this CPU has (none asked: all of them)."""
    here = capabilities_here()
    return here if value is None else parse_list(tuple(here))(ctx, param, value)


@click.command(help=__doc__)
@click.option('--cfgs', default=','.join(CFGS), show_default=True, callback=parse_list(tuple(configs.PRESETS)),
              help='Presets, comma-separated.')
@click.option('--trials', type=click.IntRange(min=1), default=10, show_default=True,
              help='Checks per graph key, for one check and again for CHECK_ROUNDS.')
@click.option('--keys-per-step', type=click.IntRange(min=1), default=1, show_default=True,
              help='Graph keys measured of each kind of step (D, G), the first ones of the run.')
@click.option('--capabilities', default=None, callback=_parse_capabilities,
              help='ATEN_CPU_CAPABILITY kernel sets, comma-separated (default: every one this CPU has).')
@click.option('--out', type=click.Path(dir_okay=False), default=None, help='Write the table as JSON here.')
def main(cfgs: list[str], trials: int, keys_per_step: int, capabilities: list[str], out: str | None) -> None:
    worker_out = os.environ.get(WORKER_ENV)
    if worker_out:
        _worker(cfgs, trials, keys_per_step, worker_out)
        return
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        for capability in capabilities:
            path = os.path.join(tmp, f'{capability}.json')
            env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, **{WORKER_ENV: path})
            command = [sys.executable, '-m', 'bench.graph_check', f'--cfgs={",".join(cfgs)}', f'--trials={trials}',
                       f'--keys-per-step={keys_per_step}']
            result = subprocess.run(command, env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
            if result.returncode != 0 or not os.path.isfile(path):
                last = (result.stderr.strip().splitlines() or ['no output'])[-1]
                raise click.ClickException(f'the measurement with ATEN_CPU_CAPABILITY={capability} failed: {last}')
            with open(path) as f:
                measured[capability] = json.load(f)
    rows = summary_rows(measured, trials)
    print_table(rows, graphs.CHECK_ROUNDS)
    if out is not None:
        write_json_atomic(out, dict(date=datetime.date.today().isoformat(), torch=torch.__version__,
                                    cpu=torch.backends.cpu.get_cpu_capability(), threads=torch.get_num_threads(),
                                    trials=trials, keys_per_step=keys_per_step, check_rounds=graphs.CHECK_ROUNDS,
                                    confidence=CONFIDENCE,
                                    rows=rows, measured=measured))


if __name__ == '__main__':
    main()
