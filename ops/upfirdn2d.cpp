// Upsample, FIR-filter, downsample: torch bindings (checks, allocation, dtype
// dispatch, current device and stream) around the kernels in upfirdn2d.cu.

#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include "upfirdn2d.h"

// x: [N, C, H, W], any strides; f: correlation taps [fh, fw] with the gain folded in (float32,
// float64 for double x); taps: the same values on the host when f has at most 4x4 taps (the
// specialised kernels take them by value), else empty. Padding is in samples of the zero-inserted
// input; negative amounts crop. max_grid_z: planes per launch (0: CUDA's limit; smaller values
// make the kernels loop over planes, which the self-check exercises). Returns [N, C, out_h, out_w]
// in the memory format of x.
static torch::Tensor upfirdn2d(torch::Tensor x, torch::Tensor f, std::vector<double> taps, int64_t up_x, int64_t up_y,
                               int64_t down_x, int64_t down_y, int64_t pad_x0, int64_t pad_x1, int64_t pad_y0,
                               int64_t pad_y1, int64_t max_grid_z)
{
    TORCH_CHECK(x.is_cuda(), "upfirdn2d: x must reside on a CUDA device");
    TORCH_CHECK(x.dim() == 4, "upfirdn2d: x must be an [N, C, H, W] tensor");
    TORCH_CHECK(f.device() == x.device() && f.dim() == 2 && f.is_contiguous() && f.numel() > 0,
                "upfirdn2d: f must be a non-empty contiguous 2-D tensor on the device of x");
    const auto tap_type = x.scalar_type() == at::ScalarType::Double ? at::ScalarType::Double : at::ScalarType::Float;
    TORCH_CHECK(f.scalar_type() == tap_type, "upfirdn2d: f must be float32 (float64 for double inputs)");
    TORCH_CHECK(up_x >= 1 && up_y >= 1 && down_x >= 1 && down_y >= 1, "upfirdn2d: up/down factors must be >= 1");
    TORCH_CHECK(x.size(2) * up_y <= INT_MAX && x.size(3) * up_x <= INT_MAX && x.size(1) <= INT_MAX,
                "upfirdn2d: image too large");
    TORCH_CHECK(max_grid_z >= 0 && max_grid_z <= 65535, "upfirdn2d: max_grid_z must lie in [0, 65535]");

    const int64_t filter_h = f.size(0), filter_w = f.size(1);
    const int64_t span_w = x.size(3) * up_x + pad_x0 + pad_x1 - filter_w;
    const int64_t span_h = x.size(2) * up_y + pad_y0 + pad_y1 - filter_h;
    TORCH_CHECK(span_w >= 0 && span_h >= 0, "upfirdn2d: the padded input is smaller than the filter");
    const int64_t out_w = span_w / down_x + 1, out_h = span_h / down_y + 1;

    const c10::cuda::OptionalCUDAGuard device_guard(device_of(x));
    torch::Tensor out = torch::empty({x.size(0), x.size(1), out_h, out_w},
                                     x.options().memory_format(x.suggest_memory_format()));
    UpFirDn2dParams p = {};
    p.x = x.data_ptr();
    p.f = f.data_ptr();
    p.out = out.data_ptr();
    p.planes = x.size(0) * x.size(1);
    p.channels = static_cast<int>(x.size(1));
    p.in_w = static_cast<int>(x.size(3));
    p.in_h = static_cast<int>(x.size(2));
    p.out_w = static_cast<int>(out_w);
    p.out_h = static_cast<int>(out_h);
    p.up_x = static_cast<int>(up_x);
    p.up_y = static_cast<int>(up_y);
    p.down_x = static_cast<int>(down_x);
    p.down_y = static_cast<int>(down_y);
    p.pad_x0 = static_cast<int>(pad_x0);
    p.pad_y0 = static_cast<int>(pad_y0);
    p.filter_w = static_cast<int>(filter_w);
    p.filter_h = static_cast<int>(filter_h);
    p.max_grid_z = static_cast<int>(max_grid_z);
    for (int i = 0; i < 4; i++)
    {
        p.x_stride[i] = x.stride(i);
        p.out_stride[i] = out.stride(i);
    }
    if (upfirdn2d_fixed_taps(p) > 0)
    {
        TORCH_CHECK(static_cast<int64_t>(taps.size()) == filter_w * filter_h,
                    "upfirdn2d: the specialised kernel needs the filter's taps on the host");
        for (size_t i = 0; i < taps.size(); i++)
            p.taps[i] = taps[i];
    }

    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, x.scalar_type(), "upfirdn2d", [&] {
        C10_CUDA_CHECK(launch_upfirdn2d_kernel<scalar_t>(p, stream));
    });
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("upfirdn2d", &upfirdn2d, "Upsample, FIR-filter and downsample 2-D images (CUDA)");
}
