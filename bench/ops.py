"""Time the custom ops' CUDA kernels against their PyTorch references.

    python bench/ops.py --out=bench-ops.json

For StyleGAN-sized tensors (bias_act with lrelu on [32, 512, 64, 64];
upsample2d/downsample2d with a 4-tap filter on [32, 256, 128, 128]) it times
three passes per implementation:
    fwd          y = op(x)
    fwd+bwd      y = op(x), then the gradient of sum(r * y) w.r.t. the inputs
    double bwd   y = op(x), g = grad of sum(r * y^2) with create_graph=True, then
                 the gradient of sum(r' * g): the pattern of gradient normalization
Each time is the median over --repeats runs after --warmup runs, measured with
CUDA events around the whole pass. Prints a table and writes JSON.
"""

import datetime
import json
import os
import statistics
import sys
from typing import Callable, List

import click
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ops import bias_act, upfirdn2d  # noqa: E402  pylint: disable=wrong-import-position


def _time_ms(fn: Callable[[], None], warmup: int, repeats: int) -> float:
    """Median wall time of fn on the GPU, in milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _passes(op: Callable, inputs: List[torch.Tensor]) -> dict:
    """The three passes of the module docstring as closures over fixed random cotangents."""
    y = op(*inputs)
    r1, r2 = torch.randn_like(y), torch.randn_like(inputs[0])

    def forward():
        with torch.no_grad():
            op(*inputs)

    def forward_backward():
        torch.autograd.grad((op(*inputs) * r1).sum(), inputs)

    def double_backward():
        out = op(*inputs)
        first = torch.autograd.grad((r1 * out * out).sum(), inputs[0], create_graph=True)[0]
        torch.autograd.grad((first * r2).sum(), inputs, allow_unused=True)

    return {'fwd': forward, 'fwd+bwd': forward_backward, 'double bwd': double_backward}


def _cases(dtype: torch.dtype):
    """(name, shape, op for a given impl, inputs) of each benchmark."""
    device = torch.device('cuda')
    f = upfirdn2d.setup_filter([1, 3, 3, 1], device=device)
    x_act = torch.randn([32, 512, 64, 64], device=device, dtype=dtype, requires_grad=True)
    b_act = torch.randn([512], device=device, dtype=dtype, requires_grad=True)
    x_img = torch.randn([32, 256, 128, 128], device=device, dtype=dtype, requires_grad=True)
    yield ('bias_act lrelu', list(x_act.shape),
           lambda impl: (lambda x, b: bias_act.bias_act(x, b, act='lrelu', impl=impl)), [x_act, b_act])
    yield ('upsample2d 4-tap', list(x_img.shape),
           lambda impl: (lambda x: upfirdn2d.upsample2d(x, f, impl=impl)), [x_img])
    yield ('downsample2d 4-tap', list(x_img.shape),
           lambda impl: (lambda x: upfirdn2d.downsample2d(x, f, impl=impl)), [x_img])


@click.command()
@click.option('--out', type=click.Path(dir_okay=False), default=None, help='Write the results as JSON here.')
@click.option('--dtype', type=click.Choice(['float32', 'float16']), default='float32', show_default=True)
@click.option('--warmup', type=click.IntRange(min=0), default=5, show_default=True)
@click.option('--repeats', type=click.IntRange(min=1), default=20, show_default=True)
def main(out, dtype, warmup, repeats):
    """Benchmark the CUDA kernels of ops/ against their references (needs a CUDA GPU)."""
    if not torch.cuda.is_available():
        click.echo('bench/ops.py: needs a CUDA GPU, and torch.cuda.is_available() is False.', err=True)
        sys.exit(1)
    plugins = {'bias_act': bias_act._plugin, 'upfirdn2d': upfirdn2d._plugin}  # pylint: disable=protected-access
    for name, plugin in plugins.items():
        if plugin.get() is None:
            click.echo(f'bench/ops.py: the {name} CUDA kernel could not be built (see the warning above).', err=True)
            sys.exit(1)

    results = []
    header = f'{"op":<20} {"shape":<20} {"pass":<11} {"ref ms":>9} {"cuda ms":>9} {"speedup":>8}'
    click.echo(f'{torch.cuda.get_device_name()}, {dtype}, median of {repeats} after {warmup} warmup runs')
    click.echo(header)
    click.echo('-' * len(header))
    for name, shape, make_op, inputs in _cases(getattr(torch, dtype)):
        ref_passes, cuda_passes = _passes(make_op('ref'), inputs), _passes(make_op('cuda'), inputs)
        for pass_name in ref_passes:
            ref_ms = _time_ms(ref_passes[pass_name], warmup, repeats)
            cuda_ms = _time_ms(cuda_passes[pass_name], warmup, repeats)
            results.append(dict(op=name, shape=shape, dtype=dtype, pass_name=pass_name, ref_ms=ref_ms,
                                cuda_ms=cuda_ms, speedup=ref_ms / cuda_ms))
            click.echo(f'{name:<20} {"x".join(map(str, shape)):<20} {pass_name:<11} {ref_ms:9.3f} {cuda_ms:9.3f} '
                       f'{ref_ms / cuda_ms:7.2f}x')
        del ref_passes, cuda_passes
        torch.cuda.empty_cache()

    if out is not None:
        report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
                      warmup=warmup, repeats=repeats, results=results)
        with open(out + '.tmp', 'w') as f:
            json.dump(report, f, indent=2)
        os.replace(out + '.tmp', out)
        click.echo(f'Wrote {out}')


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
