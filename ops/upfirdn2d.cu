// Upsample, FIR-filter, downsample: the CUDA kernel (see upfirdn2d.h).
//
// One thread per output pixel, looping over image planes. Of the taps of f,
// only those that land on an original sample (not on an inserted zero) are
// visited: along x these are kx = kx_begin, kx_begin + up_x, ... with
// kx_begin the first tap where ox * down_x + kx - pad_x0 is a non-negative
// multiple of up_x. Upsampling by 2 with a 4x4 filter thus reads 4 inputs per
// output rather than 16, and downsampling computes only the kept outputs.
// Neighbouring threads read neighbouring inputs, which the caches serve. The
// per-output arithmetic is also compiled for the host, where the tests check
// it against the PyTorch reference without a GPU.

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include "upfirdn2d.h"

template <class T> struct AccType { typedef float type; };
template <> struct AccType<double> { typedef double type; };

// Python's a % b for b > 0 (C's % keeps the sign of a).
__host__ __device__ __forceinline__ int floor_mod(int a, int b) { int r = a % b; return r < 0 ? r + b : r; }

// Taps k in [begin, end) with stride `up` that land on input samples 0 .. in_size - 1,
// for an output whose tap 0 sits at position u0 of the zero-inserted signal.
__host__ __device__ __forceinline__ void tap_range(int u0, int up, int in_size, int filter_size, int& begin, int& end)
{
    begin = floor_mod(-u0, up);  // first tap on a multiple of up
    if (begin < -u0)
        begin = -u0;  // congruent to the above, and the first tap at input index >= 0
    end = in_size * up - u0;  // first tap at input index >= in_size
    if (end > filter_size)
        end = filter_size;
}

// Output pixel (ox, oy) of every plane from `plane` on, in steps of plane_step.
template <class T>
__host__ __device__ __forceinline__ void upfirdn2d_pixel(const UpFirDn2dParams& p, int ox, int oy, long long plane,
                                                         long long plane_step)
{
    typedef typename AccType<T>::type S;
    const int ux0 = ox * p.down_x - p.pad_x0;
    const int uy0 = oy * p.down_y - p.pad_y0;
    int kx_begin, kx_end, ky_begin, ky_end;
    tap_range(ux0, p.up_x, p.in_w, p.filter_w, kx_begin, kx_end);
    tap_range(uy0, p.up_y, p.in_h, p.filter_h, ky_begin, ky_end);

    const S* f = static_cast<const S*>(p.f);
    const long long in_plane = (long long)p.in_h * p.in_w;
    const long long out_plane = (long long)p.out_h * p.out_w;
    for (; plane < p.planes; plane += plane_step)
    {
        const T* x = static_cast<const T*>(p.x) + plane * in_plane;
        S acc = S(0);
        for (int ky = ky_begin; ky < ky_end; ky += p.up_y)
        {
            const T* row = x + (long long)((uy0 + ky) / p.up_y) * p.in_w;  // exact division
            const S* f_row = f + ky * p.filter_w;
            for (int kx = kx_begin; kx < kx_end; kx += p.up_x)
                acc += f_row[kx] * S(row[(ux0 + kx) / p.up_x]);
        }
        static_cast<T*>(p.out)[plane * out_plane + (long long)oy * p.out_w + ox] = T(acc);
    }
}

template <class T>
__global__ void upfirdn2d_kernel(UpFirDn2dParams p)
{
    const int ox = blockIdx.x * blockDim.x + threadIdx.x;
    const int oy = blockIdx.y * blockDim.y + threadIdx.y;
    if (ox < p.out_w && oy < p.out_h)
        upfirdn2d_pixel<T>(p, ox, oy, blockIdx.z, gridDim.z);
}

template <class T> cudaError_t launch_upfirdn2d_kernel(const UpFirDn2dParams& p, cudaStream_t stream)
{
    if (p.planes == 0 || p.out_w <= 0 || p.out_h <= 0)
        return cudaSuccess;
    const dim3 block(32, 8);
    const long long max_grid_z = 65535;  // CUDA's limit; the kernel loops over the remaining planes
    const dim3 grid((p.out_w + block.x - 1) / block.x, (p.out_h + block.y - 1) / block.y,
                    unsigned(p.planes < max_grid_z ? p.planes : max_grid_z));
    upfirdn2d_kernel<T><<<grid, block, 0, stream>>>(p);
    return cudaGetLastError();
}

template cudaError_t launch_upfirdn2d_kernel<float>(const UpFirDn2dParams& p, cudaStream_t stream);
template cudaError_t launch_upfirdn2d_kernel<double>(const UpFirDn2dParams& p, cudaStream_t stream);
template cudaError_t launch_upfirdn2d_kernel<c10::Half>(const UpFirDn2dParams& p, cudaStream_t stream);
template cudaError_t launch_upfirdn2d_kernel<c10::BFloat16>(const UpFirDn2dParams& p, cudaStream_t stream);
