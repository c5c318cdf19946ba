// Fused bias + activation + gain + clamp: interface between bias_act.cpp (torch
// bindings) and bias_act.cu (kernels). Kept free of torch headers so that the
// kernels compile with the CUDA runtime and c10's scalar types alone.

#pragma once
#include <cuda_runtime.h>

// Activation ids; must match ActivationSpec.cuda_id in bias_act.py.
enum BiasActFunction {
    BIAS_ACT_LINEAR = 1,
    BIAS_ACT_RELU = 2,
    BIAS_ACT_LRELU = 3,
    BIAS_ACT_TANH = 4,
    BIAS_ACT_SIGMOID = 5,
    BIAS_ACT_ELU = 6,
    BIAS_ACT_SELU = 7,
    BIAS_ACT_SOFTPLUS = 8,
    BIAS_ACT_SWISH = 9,
};

// What the kernel writes, per element, with s = x + b and m the clamp mask
// [|gain * act(s)| <= clamp] (1 when clamp < 0):
//   BIAS_ACT_FORWARD:     clamp(gain * act(s))
//   BIAS_ACT_GRAD:        dy * gain * act'(s) * m
//   BIAS_ACT_SECOND_GRAD: dy * gain * act''(s) * m
enum BiasActMode {
    BIAS_ACT_FORWARD = 0,
    BIAS_ACT_GRAD = 1,
    BIAS_ACT_SECOND_GRAD = 2,
};

// Largest number of elements one launch covers: every index inside a launch fits 32 bits.
#define BIAS_ACT_MAX_CHUNK (1LL << 30)

struct BiasActParams {
    const void* x;      // input, contiguous, viewed as [outer, channels, inner]
    const void* b;      // bias [channels], or nullptr
    const void* dy;     // incoming gradient shaped like x (gradient modes), or nullptr
    void* out;          // output shaped like x
    long long size;     // number of elements of x
    long long channels; // length of the bias dimension
    long long inner;    // number of elements after the bias dimension (its stride)
    int act;            // BiasActFunction
    int mode;           // BiasActMode
    double alpha;       // activation parameter (lrelu slope, elu scale)
    double gain;        // output gain
    double clamp;       // output bound; negative: no clamping
    long long max_blocks; // blocks per launch before the grid-stride loop takes over; 0: enough for any GPU
    long long max_chunk;  // elements per launch, rounded down to a multiple of 8; 0: BIAS_ACT_MAX_CHUNK
};

// Launches the kernels for element type T (float, double, c10::Half, c10::BFloat16): one per
// chunk of at most max_chunk elements.
template <class T> cudaError_t launch_bias_act_kernel(const BiasActParams& p, cudaStream_t stream);
