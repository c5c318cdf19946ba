// Upsample, FIR-filter, downsample: the CUDA kernels (see upfirdn2d.h).
//
// One thread per output pixel, looping over image planes; inputs and outputs
// may have any strides (a channels_last tensor is read and written in place).
// Of the taps of f, only those that land on an original sample (not on an
// inserted zero) contribute: upsampling by 2 with a 4x4 filter reads 4 inputs
// per output rather than 16, and downsampling computes only the kept outputs.
//
// Two kernels. The specialised one knows the factors and the filter size at
// compile time (every resampling the networks do): per output pixel it works
// out once which taps are live and where they read, with shifts instead of
// divisions; the taps come by value with the launch parameters and sit in
// registers; the tap loops unroll completely. The generic kernel serves every
// other configuration with run-time factors and sizes. Both sum the live taps
// in the same order, row by row. The per-pixel arithmetic is also compiled for
// the host, where the tests check every specialisation against the PyTorch
// reference without a GPU.

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

// Element offset of image plane `plane` (= batch index * channels + channel) in a tensor with these strides.
__host__ __device__ __forceinline__ long long plane_offset(long long plane, int channels, const long long* stride)
{
    return (plane / channels) * stride[0] + (plane % channels) * stride[1];
}

// Generic kernel: output pixel (ox, oy) of every plane from `plane` on, in steps of plane_step.
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
    const long long out_pixel = oy * p.out_stride[2] + ox * p.out_stride[3];
    for (; plane < p.planes; plane += plane_step)
    {
        const T* x = static_cast<const T*>(p.x) + plane_offset(plane, p.channels, p.x_stride);
        S acc = S(0);
        for (int ky = ky_begin; ky < ky_end; ky += p.up_y)
        {
            const T* row = x + (long long)((uy0 + ky) / p.up_y) * p.x_stride[2];  // exact division
            const S* f_row = f + ky * p.filter_w;
            for (int kx = kx_begin; kx < kx_end; kx += p.up_x)
                acc += f_row[kx] * S(row[(long long)((ux0 + kx) / p.up_x) * p.x_stride[3]]);
        }
        static_cast<T*>(p.out)[plane_offset(plane, p.channels, p.out_stride) + out_pixel] = T(acc);
    }
}

// Specialised kernel: the same for factors UP, DOWN on both axes and a TAPS x TAPS filter (p.taps).
template <class T, int UP, int DOWN, int TAPS>
__host__ __device__ __forceinline__ void upfirdn2d_pixel_fixed(const UpFirDn2dParams& p, int ox, int oy,
                                                               long long plane, long long plane_step)
{
    typedef typename AccType<T>::type S;
    // Tap k is live where position u = o * DOWN - pad + k of the zero-inserted signal is a
    // multiple of UP inside the image; it reads input sample u / UP (a shift for UP = 2).
    bool live_x[TAPS], live_y[TAPS];
    long long offset_x[TAPS], offset_y[TAPS];
    S f[TAPS][TAPS];
#pragma unroll
    for (int k = 0; k < TAPS; k++)
    {
        const int ux = ox * DOWN - p.pad_x0 + k, uy = oy * DOWN - p.pad_y0 + k;
        live_x[k] = ux >= 0 && ux < p.in_w * UP && ux % UP == 0;
        live_y[k] = uy >= 0 && uy < p.in_h * UP && uy % UP == 0;
        offset_x[k] = live_x[k] ? (long long)(ux / UP) * p.x_stride[3] : 0;
        offset_y[k] = live_y[k] ? (long long)(uy / UP) * p.x_stride[2] : 0;
#pragma unroll
        for (int j = 0; j < TAPS; j++)
            f[k][j] = S(p.taps[k * TAPS + j]);
    }

    const long long out_pixel = oy * p.out_stride[2] + ox * p.out_stride[3];
    for (; plane < p.planes; plane += plane_step)
    {
        const T* x = static_cast<const T*>(p.x) + plane_offset(plane, p.channels, p.x_stride);
        S acc = S(0);
#pragma unroll
        for (int ky = 0; ky < TAPS; ky++)
#pragma unroll
            for (int kx = 0; kx < TAPS; kx++)
                if (live_y[ky] && live_x[kx])
                    acc += f[ky][kx] * S(x[offset_y[ky] + offset_x[kx]]);
        static_cast<T*>(p.out)[plane_offset(plane, p.channels, p.out_stride) + out_pixel] = T(acc);
    }
}

int upfirdn2d_fixed_taps(const UpFirDn2dParams& p)
{
    const bool square = p.filter_w == p.filter_h && p.filter_w <= UPFIRDN2D_MAX_FIXED_TAPS;
    const bool isotropic = p.up_x == p.up_y && p.down_x == p.down_y;
    const bool factors = (p.up_x == 1 && p.down_x == 1) || (p.up_x == 2 && p.down_x == 1) ||
                         (p.up_x == 1 && p.down_x == 2);
    return square && isotropic && factors ? p.filter_w : 0;
}

// Calls visitor.template run<UP, DOWN, TAPS>() for the specialisation serving p; false if none does.
template <class Visitor> bool visit_fixed(const UpFirDn2dParams& p, Visitor& visitor)
{
    const int taps = upfirdn2d_fixed_taps(p);
#define UPFIRDN2D_CASE(UP, DOWN, TAPS) \
    if (p.up_x == UP && p.down_x == DOWN && taps == TAPS) { visitor.template run<UP, DOWN, TAPS>(); return true; }
#define UPFIRDN2D_CASES(UP, DOWN) \
    UPFIRDN2D_CASE(UP, DOWN, 1) UPFIRDN2D_CASE(UP, DOWN, 2) UPFIRDN2D_CASE(UP, DOWN, 3) UPFIRDN2D_CASE(UP, DOWN, 4)
    UPFIRDN2D_CASES(1, 1) UPFIRDN2D_CASES(2, 1) UPFIRDN2D_CASES(1, 2)
#undef UPFIRDN2D_CASES
#undef UPFIRDN2D_CASE
    return false;
}

template <class T>
__global__ void upfirdn2d_kernel(UpFirDn2dParams p)
{
    const int ox = blockIdx.x * blockDim.x + threadIdx.x;
    const int oy = blockIdx.y * blockDim.y + threadIdx.y;
    if (ox < p.out_w && oy < p.out_h)
        upfirdn2d_pixel<T>(p, ox, oy, blockIdx.z, gridDim.z);
}

template <class T, int UP, int DOWN, int TAPS>
__global__ void upfirdn2d_fixed_kernel(UpFirDn2dParams p)
{
    const int ox = blockIdx.x * blockDim.x + threadIdx.x;
    const int oy = blockIdx.y * blockDim.y + threadIdx.y;
    if (ox < p.out_w && oy < p.out_h)
        upfirdn2d_pixel_fixed<T, UP, DOWN, TAPS>(p, ox, oy, blockIdx.z, gridDim.z);
}

template <class T> struct FixedLauncher
{
    const UpFirDn2dParams& p;
    dim3 grid, block;
    cudaStream_t stream;
    template <int UP, int DOWN, int TAPS> void run() { upfirdn2d_fixed_kernel<T, UP, DOWN, TAPS><<<grid, block, 0, stream>>>(p); }
};

template <class T> cudaError_t launch_upfirdn2d_kernel(const UpFirDn2dParams& p, cudaStream_t stream)
{
    if (p.planes == 0 || p.out_w <= 0 || p.out_h <= 0)
        return cudaSuccess;
    const dim3 block(32, 8);
    const long long max_grid_z = p.max_grid_z > 0 ? p.max_grid_z : 65535;  // beyond it, the kernels loop over planes
    const dim3 grid((p.out_w + block.x - 1) / block.x, (p.out_h + block.y - 1) / block.y,
                    unsigned(p.planes < max_grid_z ? p.planes : max_grid_z));
    FixedLauncher<T> launcher = {p, grid, block, stream};
    if (!visit_fixed(p, launcher))
        upfirdn2d_kernel<T><<<grid, block, 0, stream>>>(p);
    return cudaGetLastError();
}

template cudaError_t launch_upfirdn2d_kernel<float>(const UpFirDn2dParams& p, cudaStream_t stream);
template cudaError_t launch_upfirdn2d_kernel<double>(const UpFirDn2dParams& p, cudaStream_t stream);
template cudaError_t launch_upfirdn2d_kernel<c10::Half>(const UpFirDn2dParams& p, cudaStream_t stream);
template cudaError_t launch_upfirdn2d_kernel<c10::BFloat16>(const UpFirDn2dParams& p, cudaStream_t stream);
