"""training/step/graphs.py: steps replayed as CUDA graphs (here under the CPU emulation of tests/graph_emulator.py,
and on a GPU for real): warm-up, capture, the first replay checked against the eager step, one line and the eager
step when capture fails or the replay disagrees, statistics counted once, graphs freed when their key is left."""

import pytest
import torch

from tests.graph_emulator import EmulatedGraphs
from torch_utils import training_stats
from training.step import graphs


class Counter:
    """A 'step' on state w (3 values) and a step counter n: w <- w * 0.5 + x + noise, n <- n + 1, reporting w."""

    def __init__(self, device='cpu'):
        self.w = torch.ones(3, device=device)
        self.n = torch.zeros([], dtype=torch.int64, device=device)
        self.calls = 0

    def state(self):
        return [self.w, self.n]

    def step(self, x):
        self.calls += 1
        self.w.mul_(0.5).add_(x + 0.01 * torch.randn(3, device=x.device))
        self.n.add_(1)
        training_stats.report('Test/graphs/w', self.w.clone())  # A report is read later: never an alias of state.


def run_steps(captured, counter, inputs, key='k'):
    for x in inputs:
        captured(key, counter.step, dict(x=x))


def eager_result(inputs, seed=0):
    """The eager steps from the same seed, and every step's w."""
    torch.manual_seed(seed)
    counter, ws = Counter(), []
    for x in inputs:
        counter.step(x)
        ws.append(counter.w.clone())
    return counter, torch.stack(ws)


def test_replays_after_warmup_equal_the_eager_steps_and_count_their_statistics_once():
    inputs = [torch.full([3], float(i)) for i in range(8)]
    reference, ws = eager_result(inputs)
    training_stats._pending.clear()  # The reference's statistics are not this test's.
    collector = training_stats.Collector(r'Test/graphs/.*')
    engine, lines = EmulatedGraphs(), []
    counter = Counter()
    captured = graphs.CapturedStep('D', counter.state, engine, log=lines.append, warmup=2)
    torch.manual_seed(0)
    run_steps(captured, counter, inputs)
    # 2 warm-up steps, then one capture whose first replay is checked against an eager step, then 5 replays.
    assert len(engine.captures) == 1 and engine.captures[0].replays == 6 and counter.calls == 2 + 1 + 1
    assert captured.last_replayed and lines == []
    assert torch.equal(counter.w, reference.w) and int(counter.n) == 8  # Inputs through the static buffer, draws inside.
    collector.update()  # Each step's w counted once, whether reported eagerly or added by a replay.
    assert collector.num('Test/graphs/w') == 8 * 3
    assert collector.mean('Test/graphs/w') == pytest.approx(float(ws.double().mean()), rel=1e-12)


def test_a_step_that_reads_the_host_stays_eager_with_one_line():
    inputs = [torch.full([3], float(i)) for i in range(5)]
    reference, _ = eager_result(inputs)
    counter, lines = Counter(), []

    def step_with_read(x):
        if float(x.sum()) >= 0:  # A host read: a capture refuses it.
            counter.step(x)
    captured = graphs.CapturedStep('G', counter.state, EmulatedGraphs(), log=lines.append, warmup=1)
    torch.manual_seed(0)
    for x in inputs:
        captured('k', step_with_read, dict(x=x))
    assert len(lines) == 1 and lines[0].startswith('CUDA graphs: the G step could not be captured: ')
    assert 'reads tensor values on the host' in lines[0] and lines[0].endswith('; it runs eagerly')
    assert torch.equal(counter.w, reference.w) and int(counter.n) == 5 and not captured.last_replayed


def test_a_replay_that_differs_from_the_eager_step_is_undone_and_the_key_stays_eager():
    """A step that bakes a host number into the graph (the count of its calls) replays what the capture saw: the check
    against the eager step catches it, keeps the eager result, and says so."""
    inputs = [torch.full([3], 1.0) for _ in range(6)]
    calls, lines = [0], []
    w = torch.zeros(3)

    def step(x):
        calls[0] += 1
        w.add_(x * calls[0])  # Eagerly: + x, + 2x, + 3x, ...
    captured = graphs.CapturedStep('D', lambda: [w], EmulatedGraphs(), log=lines.append, warmup=2)
    for x in inputs:
        captured('k', step, dict(x=x))
    # Eager steps add x * count: 1 and 2 (warm-up), 4 (the check's eager step: the capture's Python counted 3, its
    # kernels never ran), then 5, 6, 7 eagerly; the replay, which would have added 3x again, was undone.
    assert torch.equal(w, torch.full([3], float(1 + 2 + 4 + 5 + 6 + 7)))
    assert len(lines) == 1 and 'the D step replayed differently from the eager step' in lines[0]
    assert not captured.last_replayed and 'k' in captured.eager_keys and 'k' not in captured.graphs


def test_a_new_key_frees_the_graphs_of_the_others():
    counter = Counter()
    engine = EmulatedGraphs()
    captured = graphs.CapturedStep('D', counter.state, engine, warmup=0)
    for key in ['a', 'a', 'b', 'b']:
        captured(key, counter.step, dict(x=torch.ones(3)))
    assert len(engine.captures) == 2 and engine.captures[0].ops == [] and set(captured.graphs) == {'b'}
    training_stats._pending.clear()


def test_replay_error_is_relative_to_what_the_step_moved():
    before = [torch.zeros(4), torch.ones(2)]
    eager = [torch.tensor([1.0, -2.0, 0.5, 0.0]), torch.ones(2)]
    assert graphs.replay_error(before, eager, [e.clone() for e in eager]) == 0.0
    close = [eager[0] + torch.tensor([0.0, 1e-3, 0.0, 0.0]), torch.ones(2)]
    assert graphs.replay_error(before, eager, close) == pytest.approx(1e-3 / 2.0, rel=1e-4)  # float32 rounding of -2 + 1e-3
    moved_untouched = [eager[0], torch.tensor([1.0, 1.5])]  # A tensor the eager step left alone moved.
    assert graphs.replay_error(before, eager, moved_untouched) == float('inf')
    nan_both = [torch.tensor([float('nan'), 1.0])]
    assert graphs.replay_error([torch.zeros(2)], nan_both, [n.clone() for n in nan_both]) == 0.0


def test_without_an_engine_every_call_is_the_eager_step():
    counter = Counter()
    captured = graphs.CapturedStep('D', counter.state, None)
    run_steps(captured, counter, [torch.ones(3)] * 4)
    assert counter.calls == 4 and captured.graphs == {} and not captured.last_replayed
    training_stats._pending.clear()

#----------------------------------------------------------------------------
# On a GPU: CUDA's graphs.


@pytest.mark.gpu
def test_cuda_graph_replays_equal_the_eager_steps_and_refuse_a_host_read():
    device = torch.device('cuda')
    inputs = [torch.full([3], float(i), device=device) for i in range(6)]
    torch.manual_seed(0)
    eager = Counter(device)
    for x in inputs:
        eager.step(x)
    torch.manual_seed(0)
    counter, lines = Counter(device), []
    captured = graphs.CapturedStep('D', counter.state, graphs.CudaGraphs(device), log=lines.append, warmup=2)
    run_steps(captured, counter, inputs)
    assert captured.last_replayed and lines == [] and counter.calls == 4
    assert torch.equal(counter.w, eager.w) and int(counter.n) == 6

    def step_with_read(x):
        if float(x.sum()) >= 0:
            counter.step(x)
    captured = graphs.CapturedStep('G', counter.state, graphs.CudaGraphs(device), log=lines.append, warmup=1)
    for x in inputs[:3]:
        captured('k', step_with_read, dict(x=x))
    assert len(lines) == 1 and 'the G step could not be captured' in lines[0] and int(counter.n) == 9
    training_stats._pending.clear()
