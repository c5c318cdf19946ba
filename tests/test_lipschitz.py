"""metrics/lipschitz.py: L_D, the largest ||grad_x s(x)|| over real and generated images, against closed forms and
float64 computations of its own."""

import copy
import json
import os

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import calc_metrics
from metrics import metric_main
from torch_utils import persistence
from training.data.dataset import ImageFolderDataset
from training.experiment import QUICKSTART_DATA
from training.networks import sngan
from training.run.evaluation import MetricEvaluator
from training.step import LossScore

DATA = dict(class_name='training.data.dataset.ImageFolderDataset', path=QUICKSTART_DATA)


@persistence.persistent_class
class LinearDiscriminator(torch.nn.Module):
    """f(x) = <w, x> + b: ||grad_x f|| = ||w|| at every x."""

    def __init__(self, img_resolution: int = 32, img_channels: int = 1, c_dim: int = 0, seed: int = 0) -> None:
        super().__init__()
        self.c_dim, self.img_resolution, self.img_channels = c_dim, img_resolution, img_channels
        generator = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(torch.randn([img_channels, img_resolution, img_resolution], generator=generator))
        self.b = torch.nn.Parameter(torch.tensor(0.3))

    def forward(self, img: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return (img * self.w).sum(dim=[1, 2, 3])[:, None] + self.b


def small_nets(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(seed)
    G = sngan.CNNGenerator(c_dim=0, img_resolution=32, img_channels=1, z_dim=16, ch=8).eval()
    D = sngan.CNNDiscriminator(c_dim=0, img_resolution=32, img_channels=1, ch=4)
    return G, D


def l_d(G, D, norm, num=60, seed=0, metric='lipschitz1k', **kwargs) -> float:
    result = metric_main.calc_metric(metric, G=G, D=D, d_score=LossScore(norm), dataset_kwargs=DATA, num_gen=num, max_real=num, **kwargs)
    return result.results[metric]


def reals(first: int, count: int) -> torch.Tensor:
    dataset = torch.utils.data.Subset(ImageFolderDataset(path=QUICKSTART_DATA), range(first, first + count))
    return torch.from_numpy(np.stack([image for image, _ in dataset])).double() / 127.5 - 1


def float64_gradient_norms(D: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """f and ||grad_x f|| per sample, one sample at a time, in float64 (no batching, no GN code)."""
    D = copy.deepcopy(D).double().eval()
    fs, norms = [], []
    for sample in x:
        sample = sample[None].clone().requires_grad_(True)
        f = D(sample, torch.zeros([1, 0], dtype=torch.float64))[0, 0]
        grad, = torch.autograd.grad(f, sample)
        fs.append(f.detach())
        norms.append(grad.norm())
    return torch.stack(fs), torch.stack(norms)


def test_linear_discriminator_gives_the_norm_of_its_weights():
    G, _ = small_nets()
    D = LinearDiscriminator()
    expected = float(D.w.detach().double().norm())
    assert l_d(G, D, 'none') == pytest.approx(expected, rel=1e-5)
    assert l_d(G, D, 'sn') == pytest.approx(expected, rel=1e-5)  # SN lives inside D; the loss sees f.


class QuadraticDiscriminator(torch.nn.Module):
    """f(x) = a / 2 * ||x||^2, declaring `input_grad_scale` s (a progressive D's factor): ||grad f|| = a * ||x|| * s."""

    def __init__(self, a: float, input_grad_scale: float) -> None:
        super().__init__()
        self.c_dim, self.img_resolution, self.img_channels = 0, 32, 1
        self.a, self.input_grad_scale = a, input_grad_scale
        self.unused = torch.nn.Parameter(torch.zeros([]))

    def forward(self, img: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return self.a / 2 * img.square().sum(dim=[1, 2, 3])[:, None] + 0 * self.unused


class ConstantGenerator(torch.nn.Module):
    """Every image 1.5 everywhere (outside [-1, 1], as a float G output may be): ||x|| = 1.5 * 32."""
    z_dim, c_dim, img_resolution, img_channels = 4, 0, 32, 1

    def forward(self, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return torch.full([z.shape[0], 1, 32, 32], 1.5)


def test_the_maximum_over_reals_and_fakes_where_it_lies_on_a_fake_with_the_input_scale():
    """L_D = max over reals and fakes of a * ||x|| * s: here the fakes' a * 48 * s, larger than any real's (a real digit
    in [-1, 1] has ||x|| <= 32, its largest computed here in float64 from the images)."""
    a, scale = 0.7, 2.0
    largest_real = float(reals(0, 60).flatten(1).norm(dim=1).max()) * a * scale
    value = l_d(ConstantGenerator(), QuadraticDiscriminator(a, scale), 'none', num=60)
    assert largest_real < 0.7 * value
    assert value == pytest.approx(a * 1.5 * 32 * scale, rel=1e-6)


def test_a_discriminator_scaled_by_a_constant_scales_l_d():
    """k * f has k times f's gradient norms everywhere, so k times its L_D; under GN, f_hat does not change."""
    G, D = small_nets()
    scaled = copy.deepcopy(D)
    with torch.no_grad():
        scaled.fc.weight.mul_(7.0)
        scaled.fc.bias.mul_(7.0)
    assert l_d(G, scaled, 'none') == pytest.approx(7.0 * l_d(G, D, 'none'), rel=1e-4)
    assert l_d(G, scaled, 'gn') == pytest.approx(l_d(G, D, 'gn'), rel=1e-4)


def test_gn_l_d_is_at_most_one_and_equals_the_piecewise_linear_formula():
    """For a LeakyReLU D, ||grad f_hat|| = (n / (n + |f|))^2 (gradnorm.py); L_D is its largest value over the reals and
    fakes, computed here sample by sample in float64 from f and n alone."""
    G, D = small_nets(seed=3)
    value = l_d(G, D, 'gn', num=40)
    rng = np.random.default_rng([0, 0])  # The metric's first block of latents (seed 0, block 0).
    z = torch.from_numpy(rng.standard_normal([40, 16], dtype=np.float32))
    with torch.no_grad():
        fakes = G(z, torch.zeros([40, 0])).double()
    f, n = float64_gradient_norms(D, torch.cat([reals(0, 40), fakes]))
    expected = float(((n / (n + f.abs())) ** 2).max())
    assert value <= 1
    assert value == pytest.approx(expected, rel=1e-4)


def test_equals_the_largest_float64_norm_over_its_reals_and_fakes():
    """Raw f of a random CNN: the metric's L_D on 200 + 200 images is the largest float64 per-sample gradient norm, one
    sample at a time, over the first 200 reals and the fakes of the metric's latents (blocks of 64, block b's drawn
    from an RNG seeded with (0, b)), here on a fake: a metric that skipped the generated images would miss it."""
    G, D = small_nets(seed=3)
    value = l_d(G, D, 'none', num=200)
    z = torch.cat([torch.from_numpy(np.random.default_rng([0, block]).standard_normal([min(64, 200 - 64 * block), 16],
                                                                                      dtype=np.float32))
                   for block in range(4)])
    with torch.no_grad():
        fakes = torch.cat([G(part, torch.zeros([len(part), 0])) for part in z.split(16)]).double()
    _, n_real = float64_gradient_norms(D, reals(0, 200))
    _, n_fake = float64_gradient_norms(D, fakes)
    assert value == pytest.approx(float(torch.cat([n_real, n_fake]).max()), rel=1e-5)
    assert n_fake.max() > 1.2 * n_real.max()


def test_calc_metrics_reads_d_and_norm_from_a_snapshot(tmp_path):
    G, _ = small_nets()
    D = LinearDiscriminator(seed=1)
    snapshot = str(tmp_path / 'network-snapshot-000001.pkl')
    persistence.save_snapshot(snapshot, dict(G=G, G_ema=G, D=D, training_set_kwargs=DATA, experiment=dict(norm='none')))
    result = CliRunner().invoke(calc_metrics.main, [f'--network={snapshot}', '--metrics=lipschitz1k', '--num-gen=20',
                                                    '--max-real=20', '--verbose=false'])
    assert result.exit_code == 0, result.output
    with open(tmp_path / 'metric-lipschitz1k.jsonl') as f:
        line = json.loads(f.readline())
    assert line['results']['lipschitz1k'] == pytest.approx(float(D.w.detach().double().norm()), rel=1e-5)
    assert line['norm'] == 'none' and line['num_real'] == 20 and line['num_gen'] == 20


def test_two_gloo_processes_reduce_to_the_largest_norm(tmp_path):
    """100 reals and 100 fakes are two batches each, one per process: the result of two gloo processes is the largest
    norm of either, the one process's L_D over all of them (a CNN D: every sample's norm differs)."""
    G, D = small_nets(seed=2)
    snapshot = str(tmp_path / 'network-snapshot-000001.pkl')
    persistence.save_snapshot(snapshot, dict(G=G, G_ema=G, D=D, training_set_kwargs=DATA, experiment=dict(norm='none')))
    for gpus in ('1', '2'):
        result = CliRunner().invoke(calc_metrics.main, [f'--network={snapshot}', '--metrics=lipschitz1k',
                                                        f'--gpus={gpus}',
                                                        '--num-gen=100', '--max-real=100', '--workers=0',
                                                        '--verbose=false'])
        assert result.exit_code == 0, result.output
    with open(tmp_path / 'metric-lipschitz1k.jsonl') as f:
        lines = [json.loads(line) for line in f]
    assert [line['num_gpus'] for line in lines] == [1, 2]
    one, two = (line['results']['lipschitz1k'] for line in lines)
    assert one > 0 and two == pytest.approx(one, rel=1e-5)


def test_training_evaluator_passes_d_and_the_runs_norm(tmp_path):
    G, _ = small_nets()
    D = LinearDiscriminator(seed=2)
    evaluator = MetricEvaluator(['lipschitz1k'], dict(d_score=LossScore('gn'), num_gen=10, max_real=10), DATA, str(tmp_path), 1, 0,
                                torch.device('cpu'), log=lambda message: None)
    _, results = evaluator.evaluate(G, str(tmp_path / 'snap.pkl'), D=D)
    # Linear f: n = ||w|| everywhere, and ||grad f_hat|| = (n / (n + |f|))^2 <= 1, largest where |f| is smallest: over
    # the first 10 reals and the fakes of the metric's first block of latents (seed 0, block 0), in float64.
    z = torch.from_numpy(np.random.default_rng([0, 0]).standard_normal([10, 16], dtype=np.float32))
    with torch.no_grad():
        fakes = G(z, torch.zeros([10, 0])).double()
    x = torch.cat([reals(0, 10), fakes])
    w, b = D.w.detach().double(), D.b.detach().double()
    f, n = (x * w).sum(dim=[1, 2, 3]) + b, w.norm()
    assert results['lipschitz1k'] == pytest.approx(float(((n / (n + f.abs())) ** 2).max()), rel=1e-5)
    assert os.path.isfile(tmp_path / 'metric-lipschitz1k.jsonl')


def test_without_a_discriminator_is_one_line(tmp_path):
    G, _ = small_nets()
    with pytest.raises(ValueError, match='needs the discriminator'):
        l_d(G, None, 'gn')
    snapshot = str(tmp_path / 'g-only.pkl')
    persistence.save_snapshot(snapshot, dict(G_ema=G, training_set_kwargs=DATA))
    result = CliRunner().invoke(calc_metrics.main, [f'--network={snapshot}', '--metrics=lipschitz1k', '--verbose=false'])
    assert result.exit_code != 0 and 'needs the discriminator' in result.output and 'Traceback' not in result.output
