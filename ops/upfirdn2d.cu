// Upsample, FIR-filter, downsample: the CUDA kernels (see upfirdn2d.h).
//
// Of the taps of f, only those that land on an original sample (not on an
// inserted zero) contribute: upsampling by 2 with a 4x4 filter reads 4 inputs
// per output rather than 16, and downsampling computes only the kept outputs.
// Inputs and outputs may have any strides (a channels_last tensor is read and
// written in place).
//
// Two kernels. The specialised one (every resampling the networks do: square
// filters of 1-4 taps, factors 1 or 2) knows the factors, the filter size and
// the phase of the padding at compile time. A block of 32 x 8 threads makes a
// tile of 64 x 16 outputs of one image plane: it stages the input the tile
// reads (with its halo, zeros outside the image) in shared memory, once, in the
// compute type; then each thread copies the window of inputs its 2 x 2 outputs
// read into registers and sums the live taps, which sit in registers too (they
// come by value with the launch, in the compute type), in fully unrolled
// loops, and writes each row's two outputs with one store where they are
// adjacent and aligned. Offsets within a plane are 32-bit; the plane's offset is computed
// once per block. The generic kernel, one thread per output with run-time
// factors and sizes, serves every other configuration. Both sum the live taps
// in the same order, row by row, so they give the same results.
//
// The per-thread code of both is also compiled for the host, where the tests
// run it block by block (staging, then computing, as __syncthreads orders it)
// and check every specialisation against the PyTorch reference without a GPU.

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <string.h>
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

// Specialised kernel. Per axis, with output tile origin o0 (a multiple of 2), the block reads the
// inputs from i0 = (o0 * DOWN - pad0 + PH) / UP on, where PH = pad0 mod UP (the same for every
// tile). Output o0 + a reads, with tap k, position u = o0 * DOWN - pad0 + a * DOWN + k of the
// zero-inserted signal, live where (a * DOWN + k - PH) is a multiple of UP, at input
// i0 + (a * DOWN + k - PH) / UP: liveness and window index are compile-time constants.
static const int TILE_THREADS_X = 32, TILE_THREADS_Y = 8;  // threads per block
static const int TILE_OUTPUTS = 2;  // outputs per thread along each axis (a multiple of UP)

// Inputs that OUTPUTS consecutive outputs (starting at a multiple of UP) read along one axis.
__host__ __device__ constexpr int window(int outputs, int up, int down, int taps)
{
    return ((outputs - 1) * down + taps - 1) / up + 1;
}

template <class S, int TAPS> struct TileArgs
{
    const void* x;
    void* out;
    long long planes;
    int channels;
    long long x_plane_stride[2], out_plane_stride[2];  // (batch, channel) element strides
    int x_stride_y, x_stride_x, out_stride_y, out_stride_x;  // within a plane: every offset fits 32 bits
    int in_w, in_h, out_w, out_h;
    int pad_x0, pad_y0;
    S taps[TAPS][TAPS];  // correlation taps, gain folded in
};

// The block's tile: its first output and its first staged input.
struct TileOrigin
{
    int ox0, oy0;  // first output
    int ix0, iy0;  // first staged input
};

template <int UP, int DOWN, int PHX, int PHY>
__host__ __device__ __forceinline__ TileOrigin tile_origin(int block_x, int block_y, int pad_x0, int pad_y0)
{
    TileOrigin t;
    t.ox0 = block_x * TILE_THREADS_X * TILE_OUTPUTS;
    t.oy0 = block_y * TILE_THREADS_Y * TILE_OUTPUTS;
    t.ix0 = (t.ox0 * DOWN - pad_x0 + PHX) / UP;  // exact: the numerator is a multiple of UP
    t.iy0 = (t.oy0 * DOWN - pad_y0 + PHY) / UP;
    return t;
}

template <int UP, int DOWN, int TAPS> struct TileShape
{
    static constexpr int in_w = window(TILE_THREADS_X * TILE_OUTPUTS, UP, DOWN, TAPS);
    static constexpr int in_h = window(TILE_THREADS_Y * TILE_OUTPUTS, UP, DOWN, TAPS);
    static constexpr int win = window(TILE_OUTPUTS, UP, DOWN, TAPS);  // per thread and axis
};

// Staging: thread `thread` (of the block's 256) copies its share of the plane's input tile into tile[][].
template <class T, int UP, int DOWN, int TAPS, int PHX, int PHY>
__host__ __device__ __forceinline__ void tile_stage(const TileArgs<typename AccType<T>::type, TAPS>& a,
                                                    int block_x, int block_y, long long plane, int thread,
                                                    typename AccType<T>::type* tile)
{
    typedef typename AccType<T>::type S;
    typedef TileShape<UP, DOWN, TAPS> Shape;
    const TileOrigin t = tile_origin<UP, DOWN, PHX, PHY>(block_x, block_y, a.pad_x0, a.pad_y0);
    const T* x = static_cast<const T*>(a.x) + plane_offset(plane, a.channels, a.x_plane_stride);
    for (int e = thread; e < Shape::in_w * Shape::in_h; e += TILE_THREADS_X * TILE_THREADS_Y)
    {
        const int iy = t.iy0 + e / Shape::in_w, ix = t.ix0 + e % Shape::in_w;
        const bool inside = ix >= 0 && ix < a.in_w && iy >= 0 && iy < a.in_h;
        tile[e] = inside ? S(x[iy * a.x_stride_y + ix * a.x_stride_x]) : S(0);
    }
}

// An integer type of N bytes, for stores of a thread's adjacent outputs in one instruction.
template <int N> struct Bits;
template <> struct Bits<4> { typedef unsigned int type; };
template <> struct Bits<8> { typedef uint2 type; };
template <> struct Bits<16> { typedef uint4 type; };

// The first min(count, TILE_OUTPUTS) of a thread's adjacent outputs in a row, `stride` elements
// apart: one store where they are adjacent in memory, all present and the address aligned (a warp
// then writes one contiguous span), else one store each.
template <class T>
__host__ __device__ __forceinline__ void store_row(T* p, int stride, int count, const T (&row)[TILE_OUTPUTS])
{
    typedef typename Bits<sizeof(T) * TILE_OUTPUTS>::type Pair;
    if (stride == 1 && count >= TILE_OUTPUTS && reinterpret_cast<unsigned long long>(p) % sizeof(Pair) == 0)
    {
        Pair bits;
        memcpy(&bits, row, sizeof(bits));
        *reinterpret_cast<Pair*>(p) = bits;
        return;
    }
#pragma unroll
    for (int ax = 0; ax < TILE_OUTPUTS; ax++)
        if (ax < count)
            p[ax * stride] = row[ax];
}

// Computing: thread (tx, ty) makes its TILE_OUTPUTS x TILE_OUTPUTS outputs from the staged tile.
template <class T, int UP, int DOWN, int TAPS, int PHX, int PHY>
__host__ __device__ __forceinline__ void tile_compute(const TileArgs<typename AccType<T>::type, TAPS>& a,
                                                      int block_x, int block_y, long long plane, int tx, int ty,
                                                      const typename AccType<T>::type* tile)
{
    typedef typename AccType<T>::type S;
    typedef TileShape<UP, DOWN, TAPS> Shape;
    const TileOrigin t = tile_origin<UP, DOWN, PHX, PHY>(block_x, block_y, a.pad_x0, a.pad_y0);
    const int ox = t.ox0 + tx * TILE_OUTPUTS, oy = t.oy0 + ty * TILE_OUTPUTS;
    if (ox >= a.out_w || oy >= a.out_h)
        return;
    S win[Shape::win][Shape::win];
    const S* corner = tile + (ty * TILE_OUTPUTS * DOWN / UP) * Shape::in_w + tx * TILE_OUTPUTS * DOWN / UP;
#pragma unroll
    for (int j = 0; j < Shape::win; j++)
#pragma unroll
        for (int i = 0; i < Shape::win; i++)
            win[j][i] = corner[j * Shape::in_w + i];
    T* out = static_cast<T*>(a.out) + plane_offset(plane, a.channels, a.out_plane_stride);
#pragma unroll
    for (int ay = 0; ay < TILE_OUTPUTS; ay++)
    {
        T row[TILE_OUTPUTS];
#pragma unroll
        for (int ax = 0; ax < TILE_OUTPUTS; ax++)
        {
            S acc = S(0);
#pragma unroll
            for (int ky = 0; ky < TAPS; ky++)
#pragma unroll
                for (int kx = 0; kx < TAPS; kx++)
                {
                    const int uy = ay * DOWN + ky - PHY, ux = ax * DOWN + kx - PHX;  // >= 1 - UP
                    if (uy % UP == 0 && ux % UP == 0)
                        acc += a.taps[ky][kx] * win[uy / UP][ux / UP];
                }
            row[ax] = T(acc);
        }
        if (oy + ay < a.out_h)
            store_row(out + (oy + ay) * a.out_stride_y + ox * a.out_stride_x, a.out_stride_x, a.out_w - ox, row);
    }
}

template <class T, int UP, int DOWN, int TAPS, int PHX, int PHY>
__global__ void __launch_bounds__(TILE_THREADS_X * TILE_THREADS_Y)
upfirdn2d_tile_kernel(TileArgs<typename AccType<T>::type, TAPS> a)
{
    typedef typename AccType<T>::type S;
    typedef TileShape<UP, DOWN, TAPS> Shape;
    __shared__ S tile[Shape::in_w * Shape::in_h];
    const int thread = threadIdx.y * TILE_THREADS_X + threadIdx.x;
    for (long long plane = blockIdx.z; plane < a.planes; plane += gridDim.z)
    {
        __syncthreads();  // the previous plane's tile has been read
        tile_stage<T, UP, DOWN, TAPS, PHX, PHY>(a, blockIdx.x, blockIdx.y, plane, thread, tile);
        __syncthreads();
        tile_compute<T, UP, DOWN, TAPS, PHX, PHY>(a, blockIdx.x, blockIdx.y, plane, threadIdx.x, threadIdx.y, tile);
    }
}

// Whether every offset within one plane of a tensor [., ., h, w] with these strides fits 32 bits.
static bool plane_fits_32_bits(int h, int w, const long long* stride)
{
    const long long sy = stride[2] < 0 ? -stride[2] : stride[2], sx = stride[3] < 0 ? -stride[3] : stride[3];
    return (h - 1) * sy + (w - 1) * sx < (1LL << 31);
}

int upfirdn2d_fixed_taps(const UpFirDn2dParams& p)
{
    const bool square = p.filter_w == p.filter_h && p.filter_w <= UPFIRDN2D_MAX_FIXED_TAPS;
    const bool isotropic = p.up_x == p.up_y && p.down_x == p.down_y;
    const bool factors = (p.up_x == 1 && p.down_x == 1) || (p.up_x == 2 && p.down_x == 1) ||
                         (p.up_x == 1 && p.down_x == 2);
    const bool fits = plane_fits_32_bits(p.in_h, p.in_w, p.x_stride) &&
                      plane_fits_32_bits(p.out_h, p.out_w, p.out_stride);
    return square && isotropic && factors && fits ? p.filter_w : 0;
}

// The grid of both kernels: x and y over the output (in tiles for the specialised kernel), z over planes.
static dim3 upfirdn2d_grid(const UpFirDn2dParams& p, int outputs_per_thread)
{
    const int tile_w = TILE_THREADS_X * outputs_per_thread, tile_h = TILE_THREADS_Y * outputs_per_thread;
    const long long max_grid_z = p.max_grid_z > 0 ? p.max_grid_z : 65535;  // beyond it, the kernels loop over planes
    return dim3((p.out_w + tile_w - 1) / tile_w, (p.out_h + tile_h - 1) / tile_h,
                unsigned(p.planes < max_grid_z ? p.planes : max_grid_z));
}

template <class T, int UP, int DOWN, int TAPS, class Runner>
void plan_tile(const UpFirDn2dParams& p, Runner& runner)
{
    typedef typename AccType<T>::type S;
    TileArgs<S, TAPS> a;
    a.x = p.x;
    a.out = p.out;
    a.planes = p.planes;
    a.channels = p.channels;
    for (int i = 0; i < 2; i++)
    {
        a.x_plane_stride[i] = p.x_stride[i];
        a.out_plane_stride[i] = p.out_stride[i];
    }
    a.x_stride_y = int(p.x_stride[2]);
    a.x_stride_x = int(p.x_stride[3]);
    a.out_stride_y = int(p.out_stride[2]);
    a.out_stride_x = int(p.out_stride[3]);
    a.in_w = p.in_w;
    a.in_h = p.in_h;
    a.out_w = p.out_w;
    a.out_h = p.out_h;
    a.pad_x0 = p.pad_x0;
    a.pad_y0 = p.pad_y0;
    for (int ky = 0; ky < TAPS; ky++)
        for (int kx = 0; kx < TAPS; kx++)
            a.taps[ky][kx] = S(p.taps[ky * TAPS + kx]);
    const dim3 grid = upfirdn2d_grid(p, TILE_OUTPUTS);
    const int phx = floor_mod(p.pad_x0, UP), phy = floor_mod(p.pad_y0, UP);
    if constexpr (UP == 1)
        runner.template tile<T, UP, DOWN, TAPS, 0, 0>(a, grid);
    else if (phx == 0 && phy == 0)
        runner.template tile<T, UP, DOWN, TAPS, 0, 0>(a, grid);
    else if (phx == 1 && phy == 0)
        runner.template tile<T, UP, DOWN, TAPS, 1, 0>(a, grid);
    else if (phx == 0 && phy == 1)
        runner.template tile<T, UP, DOWN, TAPS, 0, 1>(a, grid);
    else
        runner.template tile<T, UP, DOWN, TAPS, 1, 1>(a, grid);
}

// The launch for p: runner.template tile<T, UP, DOWN, TAPS, PHX, PHY>(args, grid) for the
// specialisation serving p, else runner.template generic<T>(p, grid).
template <class T, class Runner> void plan_upfirdn2d(const UpFirDn2dParams& p, Runner& runner)
{
    const int taps = upfirdn2d_fixed_taps(p);
#define UPFIRDN2D_CASE(UP, DOWN, TAPS) \
    if (p.up_x == UP && p.down_x == DOWN && taps == TAPS) { plan_tile<T, UP, DOWN, TAPS>(p, runner); return; }
#define UPFIRDN2D_CASES(UP, DOWN) \
    UPFIRDN2D_CASE(UP, DOWN, 1) UPFIRDN2D_CASE(UP, DOWN, 2) UPFIRDN2D_CASE(UP, DOWN, 3) UPFIRDN2D_CASE(UP, DOWN, 4)
    UPFIRDN2D_CASES(1, 1) UPFIRDN2D_CASES(2, 1) UPFIRDN2D_CASES(1, 2)
#undef UPFIRDN2D_CASES
#undef UPFIRDN2D_CASE
    runner.template generic<T>(p, upfirdn2d_grid(p, 1));
}

template <class T>
__global__ void upfirdn2d_kernel(UpFirDn2dParams p)
{
    const int ox = blockIdx.x * blockDim.x + threadIdx.x;
    const int oy = blockIdx.y * blockDim.y + threadIdx.y;
    if (ox < p.out_w && oy < p.out_h)
        upfirdn2d_pixel<T>(p, ox, oy, blockIdx.z, gridDim.z);
}

struct Launcher
{
    cudaStream_t stream;
    template <class T, int UP, int DOWN, int TAPS, int PHX, int PHY>
    void tile(const TileArgs<typename AccType<T>::type, TAPS>& a, dim3 grid)
    {
        upfirdn2d_tile_kernel<T, UP, DOWN, TAPS, PHX, PHY><<<grid, dim3(TILE_THREADS_X, TILE_THREADS_Y), 0, stream>>>(a);
    }
    template <class T> void generic(const UpFirDn2dParams& p, dim3 grid)
    {
        upfirdn2d_kernel<T><<<grid, dim3(TILE_THREADS_X, TILE_THREADS_Y), 0, stream>>>(p);
    }
};

template <class T> cudaError_t launch_upfirdn2d_kernel(const UpFirDn2dParams& p, cudaStream_t stream)
{
    if (p.planes == 0 || p.out_w <= 0 || p.out_h <= 0)
        return cudaSuccess;
    Launcher launcher = {stream};
    plan_upfirdn2d<T>(p, launcher);
    return cudaGetLastError();
}

template cudaError_t launch_upfirdn2d_kernel<float>(const UpFirDn2dParams& p, cudaStream_t stream);
template cudaError_t launch_upfirdn2d_kernel<double>(const UpFirDn2dParams& p, cudaStream_t stream);
template cudaError_t launch_upfirdn2d_kernel<c10::Half>(const UpFirDn2dParams& p, cudaStream_t stream);
template cudaError_t launch_upfirdn2d_kernel<c10::BFloat16>(const UpFirDn2dParams& p, cudaStream_t stream);
