// Fused bias + activation + gain + clamp: torch bindings (checks, allocation,
// dtype dispatch, current device and stream) around the kernel in bias_act.cu.

#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include "bias_act.h"

// x: input; b: bias along dimension dim (or None); dy: incoming gradient shaped
// like x (None for the forward mode). Returns a new
// tensor shaped like x; see BiasActMode for what it holds. max_blocks: blocks per launch (0: enough
// for any GPU); max_chunk: elements per launch (0: BIAS_ACT_MAX_CHUNK). Smaller values make the
// kernels' grid-stride loop run and split the tensor into several launches, which the self-check exercises.
static torch::Tensor bias_act(torch::Tensor x, const c10::optional<torch::Tensor>& b,
                              const c10::optional<torch::Tensor>& dy, int64_t dim, int64_t act, int64_t mode, double alpha, double gain, double clamp, int64_t max_blocks,
                              int64_t max_chunk)
{
    TORCH_CHECK(x.is_cuda(), "bias_act: x must reside on a CUDA device");
    TORCH_CHECK(x.is_contiguous(), "bias_act: x must be contiguous");
    TORCH_CHECK(dim >= 0 && dim < x.dim(), "bias_act: dim out of range");
    TORCH_CHECK(act >= BIAS_ACT_LINEAR && act <= BIAS_ACT_SWISH, "bias_act: unknown activation id");
    TORCH_CHECK(mode >= BIAS_ACT_FORWARD && mode <= BIAS_ACT_SECOND_GRAD, "bias_act: unknown mode");
    TORCH_CHECK(max_blocks >= 0 && max_chunk >= 0, "bias_act: max_blocks and max_chunk must be >= 0");
    TORCH_CHECK(x.size(dim) <= INT_MAX, "bias_act: the bias dimension is too long");
    if (b.has_value())
    {
        TORCH_CHECK(b->device() == x.device() && b->dtype() == x.dtype(), "bias_act: b must match x in device and dtype");
        TORCH_CHECK(b->dim() == 1 && b->size(0) == x.size(dim) && b->is_contiguous(),
                    "bias_act: b must be a contiguous vector with x.shape[dim] entries");
    }
    if (mode != BIAS_ACT_FORWARD)
    {
        TORCH_CHECK(dy.has_value() && dy->device() == x.device() && dy->dtype() == x.dtype(),
                    "bias_act: dy must match x in device and dtype");
        TORCH_CHECK(dy->sizes() == x.sizes() && dy->is_contiguous(), "bias_act: dy must be contiguous and shaped like x");
    }

    const c10::cuda::OptionalCUDAGuard device_guard(device_of(x));
    torch::Tensor out = torch::empty_like(x, at::MemoryFormat::Contiguous);
    BiasActParams p;
    p.x = x.data_ptr();
    p.b = b.has_value() ? b->data_ptr() : nullptr;
    p.dy = mode != BIAS_ACT_FORWARD ? dy->data_ptr() : nullptr;
    p.out = out.data_ptr();
    p.size = x.numel();
    p.channels = x.size(dim);
    p.inner = 1;
    for (int64_t i = dim + 1; i < x.dim(); i++)
        p.inner *= x.size(i);
    p.act = static_cast<int>(act);
    p.mode = static_cast<int>(mode);
    p.alpha = alpha;
    p.gain = gain;
    p.clamp = clamp;
    p.max_blocks = max_blocks;
    p.max_chunk = max_chunk;

    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, x.scalar_type(), "bias_act", [&] {
        C10_CUDA_CHECK(launch_bias_act_kernel<scalar_t>(p, stream));
    });
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("bias_act", &bias_act, "Fused bias + activation + gain + clamp (CUDA)");
}
