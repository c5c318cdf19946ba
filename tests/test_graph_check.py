"""bench/graph_check.py: the first-replay check run many times from one state, counted; the binomial bounds; the
command line's refusals."""

import pytest
import scipy.stats
import torch
from click.testing import CliRunner

from bench import graph_check
from bench.graph_emulator import EmulatedGraphs
from torch_utils import training_stats
from training.step import graphs


@pytest.mark.parametrize('failed,trials', [(0, 10), (3, 40), (40, 40), (1, 1000)])
def test_clopper_pearson_is_scipys_exact_interval(failed, trials):
    expected = scipy.stats.binomtest(failed, trials).proportion_ci(confidence_level=0.95, method='exact')
    assert graph_check.clopper_pearson(failed, trials) == pytest.approx((expected.low, expected.high), rel=1e-9,
                                                                        abs=1e-12)


@pytest.mark.parametrize('baked', [1.0, 1.5])
def test_checks_from_one_state_count_each_verdict_and_leave_the_state(baked):
    """A step w <- w + x captured with x's factor baked in at `baked` (1: a correct graph): with deterministic kernels
    the correct graph passes every check, the wrong one (50% of the step's change off) fails every one, both for one
    check and for CHECK_ROUNDS; the state, the generator and the graph are as before."""
    engine, lines = EmulatedGraphs(), []
    w = torch.zeros(3)

    def step(x):
        w.add_(x * (baked if engine.capturing else 1.0) + 0.01 * torch.randn(3))
    captured = graphs.CapturedStep('D', lambda: [w], engine, log=lines.append, warmup=1)
    torch.manual_seed(0)
    for i in range(2):  # The warm-up, then the capture and the eager step.
        captured('k', step, dict(x=torch.full([3], float(i + 1))))
    entry = captured.graphs['k']
    entry.inputs['x'].copy_(torch.full([3], 3.0))
    before, rng = w.clone(), torch.get_rng_state()
    result = graph_check._checks_from_one_state(graphs.CapturedStep._check, captured, 'k', entry,
                                                lambda: step(torch.full([3], 3.0)), trials=4)
    failed = 0 if baked == 1.0 else 4
    assert result['single']['failed'] == failed and result['rounds']['failed'] == failed
    assert (result['single']['checks'], result['single']['checks_failed']) == (4, failed)
    assert (result['rounds']['checks'], result['rounds']['checks_failed']) == (4, failed)  # Deterministic: one check.
    assert result['check_rounds'] == graphs.CHECK_ROUNDS
    assert (result['single']['largest_error'] > 1) == (baked != 1.0)
    assert torch.equal(w, before) and torch.equal(torch.get_rng_state(), rng)
    assert captured.graphs['k'] is entry and not entry.checked and lines == [] and captured.eager_keys == set()
    assert '_stay_eager' not in vars(captured) and graphs.replay_error.__module__ == graphs.__name__
    training_stats._pending.clear()


def test_summary_rows_add_the_keys_of_every_preset_and_kernel_set():
    """Every check counts for p, the first and the second of a trial alike; the throw-away rate is per trial."""
    def key(failed_single, checks_rounds, failed_rounds, thrown):
        return dict(single=dict(failed=failed_single, checks=10, checks_failed=failed_single, largest_error=0.5),
                    rounds=dict(failed=thrown, checks=checks_rounds, checks_failed=failed_rounds,
                                largest_error=0.5 + failed_rounds), check_rounds=2)
    measured = {'default': dict(presets={'a': dict(keys=[key(1, 11, 1, 0), key(0, 10, 0, 0)], seconds=2.0)}),
                'avx2': dict(presets={'a': dict(keys=[key(0, 12, 3, 1)], seconds=3.0)})}
    rows = graph_check.summary_rows(measured, trials=10)
    counted = [(r['capability'], r['cfg'], r['checks'], r['single_failed'], r['trials'], r['thrown_away'])
               for r in rows]
    assert counted == [
        ('default', 'a', 41, 2, 20, 0), ('default', 'all', 41, 2, 20, 0), ('avx2', 'a', 22, 3, 10, 1),
        ('avx2', 'all', 22, 3, 10, 1), ('all', 'all', 63, 5, 30, 1)]
    last = rows[-1]
    high = scipy.stats.beta.ppf(0.975, 6, 58)  # Clopper-Pearson's upper bound of 5 in 63: Beta^-1(0.975; 6, 58).
    assert last['p'] == pytest.approx(5 / 63) and last['p_interval'][1] == pytest.approx(high)
    assert last['bound_p2'] == pytest.approx(high ** 2) and last['largest_error'] == 3.5 and last['seconds'] == 5.0
    assert last['thrown_away_upper'] == pytest.approx(scipy.stats.beta.ppf(0.975, 2, 29))


@pytest.mark.parametrize('args,message', [(['--cfgs=nope'], 'expected a comma-separated list of'),
                                          (['--capabilities=avx9'], 'expected a comma-separated list of default'),
                                          (['--trials=0'], '0 is not in the range x>=1')])
def test_bad_options_are_refused_in_one_line(args, message):
    result = CliRunner().invoke(graph_check.main, args)
    assert result.exit_code == 2 and message in result.output and 'Traceback' not in result.output
