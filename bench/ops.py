"""Time the custom ops' CUDA kernels against their PyTorch references, checking that they agree.

    python bench/ops.py --out=bench-ops.json                          # float32, float16, bfloat16
    python bench/ops.py --dtypes=float32 --sizes=8,32 --out=bench-ops.json

Cases (--set=all, the default, or only 'large' / 'network'):
  large    StyleGAN-sized tensors: bias_act with lrelu on [32, 512, 64, 64]; upsample2d and
           downsample2d with the 4-tap [1, 3, 3, 1] filter on [32, 256, 128, 128].
  network  what the networks do at the small resolutions the GN-GAN configs train (--sizes,
           default 4, 8, 16, 32 px; batch --batch, 512 channels as StyleGAN has there):
           bias_act lrelu; the [1, 2, 1] blur (filter2d) and 2x up/down with it; 2x up/down
           with the box filter [1, 1] (the fade-in paths of G and D).
For each case it times three passes per implementation:
    fwd          y = op(x)
    fwd+bwd      y = op(x), then the gradient of sum(r * y) w.r.t. the inputs
    double bwd   y = op(x), g = grad of sum(r * y^2) with create_graph=True, then the
                 gradient of sum(r' * g): the pattern of gradient normalization
Each time is the median over --repeats runs after --warmup runs, measured with CUDA events
around the whole pass. For the forward pass the table also gives the effective memory bandwidth
of both paths, GB/s = (bytes of the inputs read + bytes of the output written) / time: what a
fused kernel must move at least, so the kernel's figure against the GPU's peak (H100 about 3.3,
H200 about 4.8 TB/s) says how close it runs to the memory-bandwidth limit. Before timing a
case, the CUDA path is compared with the float64
reference in value and first- and second-order gradients (kernel_choice.compare_to_reference,
the comparison of the kernels' self-check, here on the benchmark's own tensors); a case whose
error exceeds the self-check's tolerance is marked FAIL and the script exits with status 1
after writing its results. The self-check itself is switched off (GNGAN_OPS_SELFCHECK=0) so
that it does not run inside the timed passes, and so is the chooser (GNGAN_OPS_AUTOTUNE=0), so
that the CUDA column always times the kernel. Prints a table and writes JSON.
"""

import datetime
import json
import os
import statistics
import sys
from typing import Callable, Iterator, List, Tuple

import click

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from torch_utils.threads import set_wait_policy  # noqa: E402

set_wait_policy()  # Before torch is imported (torch_utils/threads.py).

from torch_utils.compat import require_supported_torch  # noqa: E402  pylint: disable=wrong-import-position

require_supported_torch()  # One line on a torch older than the oldest supported, before any work.

import torch  # noqa: E402

import dnnlib  # noqa: E402  pylint: disable=wrong-import-position
from ops import bias_act, upfirdn2d  # noqa: E402  pylint: disable=wrong-import-position
from torch_utils import kernel_choice  # noqa: E402  pylint: disable=wrong-import-position

Case = Tuple[str, List[int], Callable[[str], Callable], List[torch.Tensor]]


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


def _forward_bytes(op: Callable, inputs: List[torch.Tensor]) -> int:
    """Bytes a fused forward pass moves at least: every input read once, the output written once."""
    with torch.no_grad():
        y = op(*inputs)
    return sum(t.numel() * t.element_size() for t in [*inputs, y])


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


def _cases(device: torch.device, dtype: torch.dtype, case_set: str, sizes: List[int], batch: int) -> Iterator[Case]:
    """(name, input shape, op for a given impl, inputs) of each benchmark."""
    new = lambda *shape: torch.randn(shape, device=device, dtype=dtype, requires_grad=True)  # noqa: E731
    if case_set in ('all', 'large'):
        f4 = upfirdn2d.setup_filter([1, 3, 3, 1], device=device)
        x_act, b_act, x_img = new(32, 512, 64, 64), new(512), new(32, 256, 128, 128)
        yield ('bias_act lrelu', list(x_act.shape),
               lambda impl: (lambda x, b: bias_act.bias_act(x, b, act='lrelu', impl=impl)), [x_act, b_act])
        yield ('upsample2d [1,3,3,1]', list(x_img.shape),
               lambda impl: (lambda x: upfirdn2d.upsample2d(x, f4, impl=impl)), [x_img])
        yield ('downsample2d [1,3,3,1]', list(x_img.shape),
               lambda impl: (lambda x: upfirdn2d.downsample2d(x, f4, impl=impl)), [x_img])
    if case_set in ('all', 'network'):
        blur = upfirdn2d.setup_filter([1, 2, 1], device=device)
        box = upfirdn2d.setup_filter([1, 1], device=device)
        for size in sizes:
            x, b = new(batch, 512, size, size), new(512)
            yield ('bias_act lrelu', list(x.shape),
                   lambda impl: (lambda x, b: bias_act.bias_act(x, b, act='lrelu', impl=impl)), [x, b])
            for name, fn in [('blur [1,2,1]', lambda x, impl: upfirdn2d.filter2d(x, blur, impl=impl)),
                             ('upsample2d [1,2,1]', lambda x, impl: upfirdn2d.upsample2d(x, blur, impl=impl)),
                             ('downsample2d [1,2,1]', lambda x, impl: upfirdn2d.downsample2d(x, blur, impl=impl)),
                             ('upsample2d box', lambda x, impl: upfirdn2d.upsample2d(x, box, impl=impl)),
                             ('downsample2d box', lambda x, impl: upfirdn2d.downsample2d(x, box, impl=impl))]:
                yield name, list(x.shape), lambda impl, fn=fn: (lambda x: fn(x, impl)), [x]


@click.command()
@click.option('--out', type=click.Path(dir_okay=False), default=None, help='Write the results as JSON here.')
@click.option('--dtypes', default='float32,float16,bfloat16', show_default=True,
              help='Comma-separated: float32, float16, bfloat16.')
@click.option('--set', 'case_set', type=click.Choice(['all', 'large', 'network']), default='all', show_default=True)
@click.option('--sizes', default='4,8,16,32', show_default=True, help='Image sizes (px) of the network cases.')
@click.option('--batch', type=click.IntRange(min=1), default=64, show_default=True, help='Batch of the network cases.')
@click.option('--warmup', type=click.IntRange(min=0), default=5, show_default=True)
@click.option('--repeats', type=click.IntRange(min=1), default=20, show_default=True)
def main(out, dtypes, case_set, sizes, batch, warmup, repeats):
    """Benchmark the CUDA kernels of ops/ against their references (needs a CUDA GPU)."""
    dtype_names = [name.strip() for name in dtypes.split(',') if name.strip()]
    for name in dtype_names:
        if name not in ('float32', 'float16', 'bfloat16'):
            raise click.ClickException(f'--dtypes: unknown dtype "{name}"; use float32, float16, bfloat16')
    try:
        size_list = [int(s) for s in sizes.split(',') if s.strip()]
    except ValueError:
        raise click.ClickException(f'--sizes: expected comma-separated integers, got "{sizes}"') from None
    os.environ[kernel_choice.SELF_CHECK_ENV] = '0'  # every case is checked below, outside the timed passes
    os.environ[kernel_choice.AUTOTUNE_ENV] = '0'  # the kernel itself, even where the reference is faster
    if not torch.cuda.is_available():
        click.echo('bench/ops.py: needs a CUDA GPU, and torch.cuda.is_available() is False.', err=True)
        sys.exit(1)
    plugins = {'bias_act': bias_act._plugin, 'upfirdn2d': upfirdn2d._plugin}  # pylint: disable=protected-access
    for name, plugin in plugins.items():
        if plugin.get() is None:
            click.echo(f'bench/ops.py: the {name} CUDA kernel could not be built (see the warning above).', err=True)
            sys.exit(1)

    results, checks = [], []
    header = (f'{"op":<22} {"shape":<18} {"dtype":<9} {"pass":<11} {"ref ms":>9} {"cuda ms":>9} {"speedup":>8} '
              f'{"ref GB/s":>9} {"cuda GB/s":>9} {"check":>14}')
    click.echo(f'{torch.cuda.get_device_name()}, median of {repeats} after {warmup} warmup runs')
    click.echo(header)
    click.echo('-' * len(header))
    for dtype_name in dtype_names:
        dtype = getattr(torch, dtype_name)
        for name, shape, make_op, inputs in _cases(torch.device('cuda'), dtype, case_set, size_list, batch):
            error, where = kernel_choice.compare_to_reference(make_op('cuda'), make_op('ref'), inputs,
                                                              ['x', 'b'][:len(inputs)])
            tolerance = kernel_choice.SELF_CHECK_TOLERANCE[dtype]
            ok = error <= tolerance
            checks.append(dict(op=name, shape=shape, dtype=dtype_name, max_relative_error=error, where=where,
                               tolerance=tolerance, ok=ok))
            verdict = f'{"ok" if ok else "FAIL"} {error:.1e}'
            ref_passes, cuda_passes = _passes(make_op('ref'), inputs), _passes(make_op('cuda'), inputs)
            forward_bytes = _forward_bytes(make_op('cuda'), inputs)
            for pass_name in ref_passes:
                ref_ms = _time_ms(ref_passes[pass_name], warmup, repeats)
                cuda_ms = _time_ms(cuda_passes[pass_name], warmup, repeats)
                bandwidth = {}  # GB/s, forward pass only
                if pass_name == 'fwd':
                    bandwidth = dict(bytes=forward_bytes, ref_GBps=forward_bytes / ref_ms / 1e6,
                                     cuda_GBps=forward_bytes / cuda_ms / 1e6)
                results.append(dict(op=name, shape=shape, dtype=dtype_name, pass_name=pass_name, ref_ms=ref_ms,
                                    cuda_ms=cuda_ms, speedup=ref_ms / cuda_ms, **bandwidth))
                gbps = f'{bandwidth["ref_GBps"]:9.0f} {bandwidth["cuda_GBps"]:9.0f}' if bandwidth else ' ' * 19
                click.echo(f'{name:<22} {"x".join(map(str, shape)):<18} {dtype_name:<9} {pass_name:<11} '
                           f'{ref_ms:9.3f} {cuda_ms:9.3f} {ref_ms / cuda_ms:7.2f}x {gbps} {verdict:>14}')
                verdict = ''
            del ref_passes, cuda_passes, inputs
            torch.cuda.empty_cache()

    failed = [c for c in checks if not c['ok']]
    if out is not None:
        report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
                      warmup=warmup, repeats=repeats, results=results, checks=checks)
        with dnnlib.util.atomic_path(out) as tmp, open(tmp, 'w') as f:
            json.dump(report, f, indent=2)
        click.echo(f'Wrote {out}')
    if failed:
        for c in failed:
            click.echo(f'bench/ops.py: CUDA disagrees with the reference: {c["op"]} {c["shape"]} {c["dtype"]}, '
                       f'{c["where"]} off by {c["max_relative_error"]:.2g} (tolerance {c["tolerance"]:g})', err=True)
        sys.exit(1)


if __name__ == '__main__':
    main()  # pylint: disable=no-value-for-parameter
