// Upsample, FIR-filter, downsample: interface between upfirdn2d.cpp (torch
// bindings) and upfirdn2d.cu (kernels). Kept free of torch headers so that the
// kernels compile with the CUDA runtime and c10's scalar types alone.

#pragma once
#include <cuda_runtime.h>

// The kernels compute, for each image plane (batch x channel) and output pixel (ox, oy),
//   out[oy][ox] = sum_{ky, kx} f[ky][kx] * u[oy * down_y + ky - pad_y0][ox * down_x + kx - pad_x0]
// where u is the input after zero insertion (u[iy * up_y][ix * up_x] = x[iy][ix], 0 elsewhere,
// also outside the image). f is a correlation filter with the gain folded in, so
// flipping and scaling are done by the caller.

// Largest filter (taps per axis) that the specialised kernels take by value.
#define UPFIRDN2D_MAX_FIXED_TAPS 4

struct UpFirDn2dParams {
    const void* x;     // input [batch, channels, in_h, in_w], any strides
    const void* f;     // filter taps [filter_h, filter_w], contiguous: float, or double for double x
    void* out;         // output [batch, channels, out_h, out_w], any strides
    long long planes;  // batch * channels
    int channels;
    int in_w, in_h;
    int out_w, out_h;
    int up_x, up_y;
    int down_x, down_y;
    int pad_x0, pad_y0;  // leading padding of the zero-inserted input (negative: crop)
    int filter_w, filter_h;
    long long x_stride[4];    // element strides of x in (batch, channel, y, x)
    long long out_stride[4];  // element strides of out, the same order
    double taps[UPFIRDN2D_MAX_FIXED_TAPS * UPFIRDN2D_MAX_FIXED_TAPS];  // f again, for the specialised kernels (which
                                                                      // receive them in the compute type)
    int max_grid_z;    // planes per launch before the kernels loop over planes; 0: CUDA's limit (65535)
};

// The compile-time specialisations: square filters of 1-4 taps with equal factors along both
// axes, (up, down) = (1, 1), (2, 1) or (1, 2), which covers every resampling the networks do,
// where every offset inside one image plane of x and of out fits 32 bits. Returns the filter size
// of the specialisation serving p, or 0 when the generic kernel does.
int upfirdn2d_fixed_taps(const UpFirDn2dParams& p);

// Launches the specialised kernel when there is one for p, the generic kernel otherwise, for
// element type T (float, double, c10::Half, c10::BFloat16).
template <class T> cudaError_t launch_upfirdn2d_kernel(const UpFirDn2dParams& p, cudaStream_t stream);
