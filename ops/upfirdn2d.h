// Upsample, FIR-filter, downsample: interface between upfirdn2d.cpp (torch
// bindings) and upfirdn2d.cu (kernel). Kept free of torch headers so that the
// kernel compiles with the CUDA runtime and c10's scalar types alone.

#pragma once
#include <cuda_runtime.h>

// The kernel computes, for each image plane (batch x channel) and output pixel (ox, oy),
//   out[oy][ox] = sum_{ky, kx} f[ky][kx] * u[oy * down_y + ky - pad_y0][ox * down_x + kx - pad_x0]
// where u is the input after zero insertion (u[iy * up_y][ix * up_x] = x[iy][ix], 0 elsewhere,
// also outside the image). f is a correlation filter with the gain folded in, so
// flipping and scaling are done by the caller.
struct UpFirDn2dParams {
    const void* x;     // input [planes, in_h, in_w], contiguous
    const void* f;     // filter taps [filter_h, filter_w]: float, or double for double x
    void* out;         // output [planes, out_h, out_w]
    long long planes;  // batch * channels
    int in_w, in_h;
    int out_w, out_h;
    int up_x, up_y;
    int down_x, down_y;
    int pad_x0, pad_y0;  // leading padding of the zero-inserted input (negative: crop)
    int filter_w, filter_h;
};

// Launches the kernel for element type T (float, double, c10::Half, c10::BFloat16).
template <class T> cudaError_t launch_upfirdn2d_kernel(const UpFirDn2dParams& p, cudaStream_t stream);
