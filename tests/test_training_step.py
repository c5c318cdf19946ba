"""training/step/training_step.py: the run's D and G steps. On a CPU they train bit for bit as the eager step of the
loop before CUDA graphs did (restated here); replayed as graphs (the CPU emulation of bench/graph_emulator.py) they
train bit for bit as the same steps run eagerly, for every preset, through learning-rate decay, Adam resets and
StyleGAN's fade-ins; on a GPU, train.py with and without graphs writes the same snapshots."""

import os
import subprocess
import sys

import pytest
import torch

from bench.graph_emulator import EmulatedGraphs, ShortRun, capturable_on_cpu, kernel_noise
from torch_utils import persistence, training_stats
from training.recipes import configs
from training.step import NORMS
from training.step import graphs, training_step
from training.step.updater import make_capturable, portable_state_dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_STEPS = 3  # G steps of a Run of an SN-GAN or BigGAN preset.


def _what_a_run_sees(cfg_name: str) -> str:
    """A preset's configuration but its name, its description and an EMA start beyond a Run's last step."""
    cfg = {k: v for k, v in configs.get_config(cfg_name, norm='gn').items() if k not in ('name', 'description')}
    if cfg.get('ema_start') is not None:
        cfg['ema_start'] = min(cfg['ema_start'], RUN_STEPS)
    return repr(sorted(cfg.items()))


def _presets_a_run_tells_apart() -> list[str]:
    """Every preset, less those a Run cannot tell from an earlier one (church256-resnet is celebahq256-resnet with a
    later EMA start)."""
    first = {}
    for name in configs.PRESETS:
        first.setdefault(_what_a_run_sees(name), name)
    return list(first.values())


# Every preset at its defaults, and every other constraint's steps (penalties, SN) on the quick start's networks and
# StyleGAN's R1.
PRESETS = _presets_a_run_tells_apart()
PRESET_NORMS = [(name, 'gn') for name in PRESETS] + [
    ('quickstart', norm) for norm in NORMS if norm != 'gn'] + [('gn-stylegan', 'r1'), ('gn-stylegan2', 'r1')]


class Run(ShortRun):
    """bench/graph_emulator.py's short run of a preset (RUN_STEPS G steps for the SN-GAN family), with its batches and
    its tensors."""

    def __init__(self, cfg_name: str, norm: str) -> None:
        super().__init__(cfg_name, norm, steps=RUN_STEPS)

    def batches(self, plan, seed):
        """The reals and labels of the plan's D steps and the labels of its G step, drawn apart from the steps' own
        random stream."""
        generator = torch.Generator().manual_seed(seed)
        size = self.resolution >> (0 if plan.lod is None else int(plan.lod))
        labels = lambda n: (torch.eye(self.G.c_dim)[torch.randint(self.G.c_dim, [n], generator=generator)] if self.G.c_dim
                            else torch.zeros(n, 0))
        d = [(torch.rand(plan.share_D, 3, size, size, generator=generator) * 2 - 1, labels(plan.share_D), labels(plan.share_D))
             for _ in range(plan.n_dis)]
        return d, labels(plan.share_G)

    def tensors(self):
        state = {f'{name}.{key}': value for name, net in [('G', self.G), ('D', self.D), ('G_ema', self.G_ema)]
                 for key, value in net.state_dict().items()}
        for name, opt in [('G_opt', self.G_opt), ('D_opt', self.D_opt)]:
            for index, param_state in portable_state_dict(opt)['state'].items():
                state.update({f'{name}.{index}.{key}': value for key, value in param_state.items()})
        return state


def train_with_training_step(run: Run, engine=None) -> training_step.TrainingStep:
    steps = training_step.TrainingStep(run.G, run.D, run.G_opt, run.D_opt, run.loss, G_ema=run.G_ema,
                                       group_size=run.experiment.schedule.group_size, graph_engine=engine,
                                       log=pytest.fail)
    torch.manual_seed(1)
    return run_plans(steps, run)


def run_plans(steps: training_step.TrainingStep, run: Run) -> training_step.TrainingStep:
    """`run`'s plans through `steps`, as the training loop calls them."""
    for index, plan in enumerate(run.plans):
        d_batches, g_labels = run.batches(plan, seed=index)
        steps.set_plan(plan)
        for real_img, real_c, gen_c in d_batches:
            steps.discriminator(real_img, real_c, gen_c, plan.rounds_D, index)
        steps.generator(g_labels, plan.rounds_G, index, plan.ema_beta)
    return steps


def train_as_before_graphs(run: Run) -> None:
    """The training loop's step before CUDA graphs: z drawn by the loop before each step, the updater's zero_grad,
    loss.accumulate_gradients and Adam step, the moving average after the G step, Adam's state dropped on a reset."""
    torch.manual_seed(1)
    state_id = None
    for index, plan in enumerate(run.plans):
        d_batches, g_labels = run.batches(plan, seed=index)
        for opt, lr in [(run.G_opt, plan.lr_G), (run.D_opt, plan.lr_D)]:
            if state_id is not None and plan.optimizer_state_id != state_id:
                opt.state.clear()
            for group in opt.param_groups:
                group['lr'] = lr
        state_id = plan.optimizer_state_id
        if plan.lod is not None:
            for net in (run.G, run.D, run.G_ema):
                net.set_lod(plan.lod)
        for net, module, opt, batches in [('D', run.D, run.D_opt, d_batches), ('G', run.G, run.G_opt, [(None, None, g_labels)])]:
            for real_img, real_c, gen_c in batches:
                for phase in run.loss.phases(net, index):  # StyleGAN2's lazy regularizers: an Adam step of their own.
                    gen_z = torch.randn(gen_c.shape[0], run.G.z_dim)
                    run.loss.set_phase(net, phase)
                    module.requires_grad_(True)
                    opt.zero_grad(set_to_none=True)
                    run.loss.accumulate_gradients(net, real_img, real_c, gen_z, gen_c, gain=1.0)
                    module.requires_grad_(False)
                    opt.step()
        with torch.no_grad():
            for p_ema, p in zip(run.G_ema.parameters(), run.G.parameters()):
                p_ema.lerp_(p, 1 - plan.ema_beta)
            for b_ema, b in zip(run.G_ema.buffers(), run.G.buffers()):
                b_ema.copy_(b)


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [key for key in a if not torch.equal(a[key], b[key])]
    assert different == [], f'{len(different)} of {len(a)} tensors differ: {different[:5]}'


@pytest.mark.parametrize('cfg_name', PRESETS)
def test_cpu_steps_train_as_the_eager_steps_before_graphs(cfg_name):
    reference, run = Run(cfg_name, 'gn'), Run(cfg_name, 'gn')
    train_as_before_graphs(reference)
    train_with_training_step(run)
    assert_same(run.tensors(), reference.tensors())
    training_stats._pending.clear()


def test_stylegan2_lazy_regularizers_take_optimizer_steps_of_their_own():
    """NVIDIA's count of Adam steps in 9 G steps: G 9 + 3 (path length at steps 0, 4 and 8), D with R1 9 + 1 (R1 at
    step 0 of every 16)."""
    run = Run('gn-stylegan2', 'r1')
    train_with_training_step(run)
    counts = [int(next(iter(opt.state.values()))['step']) for opt in (run.G_opt, run.D_opt)]
    assert counts == [12, 10]
    training_stats._pending.clear()


@pytest.mark.parametrize('cfg_name,norm', PRESET_NORMS)
def test_steps_replayed_as_graphs_train_as_the_eager_steps(cfg_name, norm, monkeypatch):
    """Graphs captured under the CPU emulation replay bit for bit what the same (capturable) steps compute eagerly,
    through learning-rate decay, Adam resets and fade-ins: nothing of a step is baked in at capture."""
    capturable_on_cpu(monkeypatch)
    monkeypatch.setattr(graphs, 'WARMUP_STEPS', 1)
    eager, replayed = Run(cfg_name, norm), Run(cfg_name, norm)
    for opt in (eager.G_opt, eager.D_opt):
        make_capturable(opt)  # The optimizer arithmetic that graphs capture, run eagerly.
    train_with_training_step(eager)
    engine = EmulatedGraphs()
    steps = train_with_training_step(replayed, engine)
    assert_same(replayed.tensors(), eager.tensors())
    assert all(graph.replays > 0 for graph in engine.captures)  # Each capture replayed, none stayed eager.
    keys = {net: captured.eager_keys for net, captured in steps.captured.items()}
    assert keys == {'D': set(), 'G': set()}
    if replayed.stylegan:  # A graph per phase (8x8, fade-in, 16x16) and step, the 8x8 ones freed.
        assert len(engine.captures) == 6 and [graph.ops != [] for graph in engine.captures] == [False] * 2 + [True] * 4
    training_stats._pending.clear()


@pytest.mark.parametrize('cfg_name', PRESETS)
def test_graphs_pass_their_check_under_kernels_that_round_differently_at_every_run(cfg_name, monkeypatch):
    """With kernels whose rounding changes at every run (atomics; bench/graph_emulator.kernel_noise), a replay differs
    from the eager step, and in the generators whose convolution biases feed BatchNorm by a full Adam step (their true
    gradient is zero): the first-replay check still passes every graph of every preset."""
    capturable_on_cpu(monkeypatch)
    monkeypatch.setattr(graphs, 'WARMUP_STEPS', 1)
    engine = EmulatedGraphs()
    with kernel_noise(seed=0):
        steps = train_with_training_step(Run(cfg_name, 'gn'), engine)  # A line that a key runs eagerly fails the test.
    assert engine.captures and all(graph.replays > 0 for graph in engine.captures)
    assert {net: captured.eager_keys for net, captured in steps.captured.items()} == {'D': set(), 'G': set()}
    training_stats._pending.clear()


def test_replays_follow_a_learning_rate_that_moves_by_a_millionth_per_step(monkeypatch):
    """A value a graph would bake in and that changes slowly is invisible to a check made once: the learning rates are
    device tensors that the replays read, so a schedule moving them by 1e-6 per step (6 steps of the quick start, 3
    of them replayed) trains bit for bit as the same capturable steps run eagerly, whose learning rates at the last
    step differ from the first by 5e-6."""
    import dataclasses
    capturable_on_cpu(monkeypatch)
    monkeypatch.setattr(graphs, 'WARMUP_STEPS', 1)
    runs = []
    for engine in (None, EmulatedGraphs()):
        run = Run('quickstart', 'gn')
        plan = run.plans[0]
        run.plans = [dataclasses.replace(plan, lr_G=plan.lr_G - 1e-6 * k, lr_D=plan.lr_D - 1e-6 * k) for k in range(6)]
        if engine is None:
            for opt in (run.G_opt, run.D_opt):
                make_capturable(opt)
        steps = train_with_training_step(run, engine)
        runs.append((run, engine, steps))
    (eager, _, _), (replayed, engine, steps) = runs
    assert_same(replayed.tensors(), eager.tensors())
    assert engine.captures and all(graph.replays >= 3 for graph in engine.captures)
    assert steps.updaters['G'].optimizer.param_groups[0]['lr'].item() == pytest.approx(run.plans[0].lr_G - 5e-6, rel=1e-6)
    training_stats._pending.clear()


@pytest.fixture
def verified_release(monkeypatch):
    """The running torch's release listed as verified by a GPU run of bench/gpu_report.py (torch_utils/compat.py)."""
    from torch_utils import compat
    monkeypatch.setitem(compat.CUDA_GRAPHS_VERIFIED, compat.release(torch.__version__), 'a passing GPU report')


def test_graphs_are_used_where_they_pay_and_pass(verified_release):
    cuda, cpu = torch.device('cuda'), torch.device('cpu')
    use = training_step.use_cuda_graphs
    auto_off = 'CUDA graphs off (--cuda-graphs=auto): '
    assert use('auto', cuda, 1, 'tf32') == (True, None) and use('auto', cuda, 1, 'bf16') == (True, None)
    assert use('auto', cuda, 1, 'fp16') == (False, auto_off + '--precision=fp16 reads its loss scaler\'s overflow flag '
                                            'on the host at every step; the steps run eagerly')
    assert use('auto', cuda, 2, 'tf32') == (False, auto_off + '2 processes (graphs have not run on several GPUs; '
                                            '--cuda-graphs=on captures them); the steps run eagerly')
    assert use('on', cuda, 2, 'bf16') == (True, None) and use('off', cuda, 1, 'tf32') == (False, None)
    with pytest.raises(ValueError, match='cannot capture --precision=fp16'):
        use('on', cuda, 1, 'fp16')
    assert use('auto', cpu, 1, 'tf32') == (False, None) and use('on', cpu, 1, 'tf32') == (False, None)
    with pytest.raises(ValueError, match='cuda_graphs'):
        use('yes', cuda, 1, 'tf32')


# What --cuda-graphs=auto and =on do on each torch release, for what the repair of a capture that failed inside CUDA
# needs there (docs/ops.md's table): (torch 2.5-2.11's generator, the generator's repair calls present, the allocator's
# call that ends a capture present) -> what this torch lacks, or None.
REPAIR_CASES = [
    ((True, True, True), None),                                       # 2.5 - 2.11, as released
    ((False, True, True), None),                                      # 2.12 and newer, as released
    ((True, False, True), 'torch.Generator.clone_state, torch.Generator.graphsafe_set_state'),
    ((False, False, True), None),                                     # 2.12 and newer keep no flag to clear
    ((True, True, False), 'torch._C._cuda_endAllocateToPool'),
    ((False, True, False), 'torch._C._cuda_endAllocateToPool'),
]


@pytest.mark.parametrize('release,missing', REPAIR_CASES, ids=['2.11', '2.12', '2.11-no-generator-repair',
                                                               '2.12-no-generator-repair', '2.11-no-pool-end',
                                                               '2.12-no-pool-end'])
def test_auto_captures_only_where_a_failed_capture_can_be_repaired_and_on_refuses_where_not(monkeypatch, release,
                                                                                             missing, verified_release):
    """--cuda-graphs=auto turns graphs on only where the torch running has what puts CUDA back after a capture that
    failed inside it (one line naming what lacks, else), and =on refuses to start there (CudaGraphsBroken, one line)."""
    from torch_utils import compat
    keeps_flag, generator_repair, pool_end = release
    monkeypatch.setattr(compat, 'GENERATOR_KEEPS_FAILED_CAPTURE', keeps_flag)
    if not generator_repair:  # A generator class as torch's but without the two calls (torch's own type is immutable).
        monkeypatch.setattr(torch, 'Generator', type('Generator', (), {}))
    if not pool_end:
        for name in compat.END_ALLOCATE_TO_POOL:
            monkeypatch.delattr(torch._C, name, raising=False)
    cuda = torch.device('cuda')
    if missing is None:
        assert training_step.use_cuda_graphs('auto', cuda, 1, 'tf32') == (True, None)
        assert training_step.use_cuda_graphs('on', cuda, 1, 'tf32') == (True, None)
        return
    assert training_step.use_cuda_graphs('auto', cuda, 1, 'tf32') == (
        False, f'CUDA graphs off (--cuda-graphs=auto): torch {torch.__version__} lacks {missing}, which puts CUDA back '
               f'after a failed capture; the steps run eagerly')
    with pytest.raises(graphs.CudaGraphsBroken) as refused:
        training_step.use_cuda_graphs('on', cuda, 1, 'tf32')
    assert str(refused.value) == (f'--cuda-graphs=on: torch {torch.__version__} lacks {missing}, which puts CUDA back '
                                  f'after a capture that fails inside it; use --cuda-graphs=auto or off')
    assert training_step.use_cuda_graphs('off', cuda, 1, 'tf32') == (False, None)

@pytest.mark.parametrize('listed', [True, False], ids=['verified-release', 'unverified-release'])
def test_auto_captures_only_on_a_release_a_gpu_run_verified_and_on_captures_anywhere(monkeypatch, listed):
    """Under the CPU emulation of CUDA graphs (the decision taking the CPU for CUDA, the emulation for CUDA's graphs):
    --cuda-graphs=auto captures and replays the steps on a torch release that CUDA_GRAPHS_VERIFIED lists, and elsewhere
    runs them eagerly with one line that says how to try graphs and how to add the release; =on captures on both."""
    from torch_utils import compat
    running = tuple(int(part) for part in torch.__version__.split('.')[:2])
    monkeypatch.setattr(compat, 'CUDA_GRAPHS_VERIFIED', {(2, 4): 'another release', **({running: 'a GPU run'} if listed else {})})
    decide = training_step.use_cuda_graphs
    monkeypatch.setattr(training_step, 'use_cuda_graphs', lambda mode, device, *args: decide(mode, torch.device('cuda'), *args))
    engines = []
    monkeypatch.setattr(training_step, 'CudaGraphs', lambda device: engines.append(EmulatedGraphs()) or engines[-1])
    capturable_on_cpu(monkeypatch)
    for mode in ('auto', 'on'):
        engines.clear()
        run, lines = Run('cifar10-resnet', 'gn'), []  # 5 D steps a G step: D's graph replays.
        steps = run_plans(training_step.TrainingStep(run.G, run.D, run.G_opt, run.D_opt, run.loss, G_ema=run.G_ema,
                                                     group_size=run.experiment.schedule.group_size, cuda_graphs=mode,
                                                     log=lines.append), run)
        captured = listed or mode == 'on'
        assert len(engines) == captured and not (captured and steps.captured['D'].graphs == {})
        assert captured == bool(engines and any(graph.replays >= 1 for graph in engines[0].captures))
        assert lines == ([] if captured else [
            f'CUDA graphs off (--cuda-graphs=auto): no GPU run has verified them on torch {running[0]}.{running[1]} '
            '(--cuda-graphs=on tries them; a passing python -m bench.gpu_report --quick ends with the line that adds the '
            "release to torch_utils/compat.py's CUDA_GRAPHS_VERIFIED); the steps run eagerly"])
    training_stats._pending.clear()

#----------------------------------------------------------------------------
# On a GPU.


def _train(outdir, *args):
    command = [sys.executable, 'train.py', f'--outdir={outdir}', '--deterministic', '--device=cuda', *args]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


def _snapshot_tensors(path):
    snapshot = persistence.load_snapshot(path)
    tensors = {f'{name}.{key}': value for name in ('G', 'D', 'G_ema') for key, value in snapshot[name].state_dict().items()}
    for name in ('G_opt_state', 'D_opt_state'):
        for index, state in snapshot[name]['state'].items():
            tensors.update({f'{name}.{index}.{key}': value for key, value in state.items()})
    return tensors


@pytest.mark.gpu
@pytest.mark.parametrize('args', [
    ['--steps=24', '--batch=16', '--tick=0.064', '--snap=3'],
    ['--cfg=gn-stylegan', '--cmax=16', '--batch=16', '--lod-kimg=0.2', '--kimg=0.6', '--tick=0.1', '--snap=2', '--xflip=0'],
    ['--cfg=gn-stylegan2', '--cmax=16', '--map-dim=32', '--batch=16', '--kimg=0.4', '--tick=0.1', '--snap=2', '--norm=r1']])
def test_graph_and_eager_runs_write_identical_snapshots(tmp_path, args):
    """With --deterministic, train.py replaying its steps as CUDA graphs writes the snapshots the eager run writes."""
    graph_log = _train(tmp_path / 'graphs', '--cuda-graphs=on', *args)
    _train(tmp_path / 'eager', '--cuda-graphs=off', *args)
    assert 'runs eagerly' not in graph_log
    runs = {mode: sorted((tmp_path / mode).glob('*/network-snapshot-*.pkl')) for mode in ('graphs', 'eager')}
    assert len(runs['graphs']) == len(runs['eager']) >= 2
    for a, b in zip(runs['graphs'], runs['eager']):
        assert a.name == b.name
        assert_same(_snapshot_tensors(str(a)), _snapshot_tensors(str(b)))


@pytest.mark.gpu
@pytest.mark.parametrize('args', [['--steps=12', '--batch=16'], ['--cfg=cifar10-resnet', '--steps=8', '--batch=16'],
                                  ['--cfg=cifar10-biggan', '--steps=8', '--batch=16']])
def test_graphs_pass_their_check_with_the_default_nondeterministic_kernels(tmp_path, args):
    """Without --deterministic (cuDNN picks its fastest algorithms, atomics included), the generators whose convolution
    biases feed BatchNorm replay as graphs: the first-replay check tells the kernels' noise from a wrong graph."""
    command = [sys.executable, 'train.py', f'--outdir={tmp_path}', '--device=cuda', '--cuda-graphs=on', '--tick=0.064',
               '--snap=1000', *args]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert 'CUDA graphs' not in result.stdout, result.stdout


def test_the_table_of_what_a_captured_step_reads_is_generated_from_the_steps():
    """docs/ops.md's table of what a captured step reads is docs/make_graph_reads_md.py's, which captures the steps:
    every value the schedules move (the learning rates under SN-GAN's decay, the fade-in's lod, gn-stylegan2's EMA
    ramp-up, the step number) is a device tensor the replays read, no constant changes, and nothing read is unnamed."""
    sys.path.insert(0, os.path.join(ROOT, 'docs'))
    try:
        import make_graph_reads_md
    finally:
        sys.path.remove(os.path.join(ROOT, 'docs'))
    generated = make_graph_reads_md.render()
    rows = {}
    for line in generated.splitlines()[4:]:
        if not line.startswith('| '):
            break
        value, kind, *cells = [cell.strip() for cell in line.strip('|').split('|')]
        rows[value] = (kind, dict(zip(make_graph_reads_md.PRESETS, cells)))
    assert rows["D's optimizer `lr`"] == ('device tensor', dict(
        {'cifar10-resnet': 'D, changes', 'gn-stylegan': 'D, fixed', 'gn-stylegan2': 'D, fixed'}))
    assert rows["G's optimizer `lr`"][1]['cifar10-resnet'] == 'G, changes'
    assert rows["G's buffers `lod`"] == ('device tensor', {'cifar10-resnet': '', 'gn-stylegan': 'D+G, changes',
                                                           'gn-stylegan2': ''})
    assert rows['TrainingStep `ema_beta`'][1]['gn-stylegan2'] == 'G, changes'
    assert all(rows[f"{net}'s updater `step_number`"][1][cfg] == f'{net}, changes' for net in 'DG'
               for cfg in make_graph_reads_md.PRESETS)
    assert rows['`self._structure()`'] == ('graph key', dict.fromkeys(make_graph_reads_md.PRESETS, 'D+G'))
    assert rows['`tuple(real_img.shape)`'][0] == 'graph key'
    constants = {value: cells for value, (kind, cells) in rows.items() if kind == 'constant'}
    assert "D's optimizer `betas`" in constants and 'loss `r1_gamma`' in constants
    assert not [value for value, cells in constants.items() if any('changes' in cell for cell in cells.values())]
    assert not [value for value in rows if 'made outside the step' in value]
    with open(make_graph_reads_md.DOC_PATH, encoding='utf-8') as f:
        committed = f.read()
    assert make_graph_reads_md.updated(committed, generated) == committed, \
        'docs/ops.md\'s table of what a captured step reads is out of date: run python docs/make_graph_reads_md.py'
