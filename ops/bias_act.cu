// Fused bias + activation + gain + clamp: the CUDA kernels (see bias_act.h).
//
// The op is memory bound: each kernel reads x (and dy) once and writes once,
// 16 bytes per thread and iteration (4 floats, 2 doubles, 8 halves) where the
// pointers allow it, so a warp moves 512 contiguous bytes per load. One kernel
// per activation and per direction (forward, gradient), chosen at compile
// time; the activation parameters arrive in the compute type, converted once
// on the host. Indices are 32-bit: a launch covers at most BIAS_ACT_MAX_CHUNK
// elements, larger tensors take several launches. The bias index of a vector
// costs one 32-bit division; within the vector it is stepped.
//
// The same per-thread code (bias_act_thread) runs on the host in the tests,
// driven through the same launch plan (plan_bias_act), which is how every
// kernel instance is checked against the PyTorch reference without a GPU.

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <string.h>
#include "bias_act.h"

// Arithmetic type: half types compute in float, double in double.
template <class T> struct AccType { typedef float type; };
template <> struct AccType<double> { typedef double type; };

// Elements per 16-byte vector.
template <class T> struct Vector { static constexpr int width = 16 / int(sizeof(T)); };

template <class S> __host__ __device__ __forceinline__ S sigmoid(S s) { return S(1) / (S(1) + exp(-s)); }

// f = act(s), df = act'(s), ddf = act''(s) for the activation ACT (what a kernel does not use, the compiler drops).
template <int ACT, class S>
__host__ __device__ __forceinline__ void activation(S s, S alpha, S& f, S& df, S& ddf)
{
    if constexpr (ACT == BIAS_ACT_RELU)
    {
        f = s > S(0) ? s : S(0); df = s > S(0) ? S(1) : S(0); ddf = S(0);
    }
    else if constexpr (ACT == BIAS_ACT_LRELU)
    {
        f = s > S(0) ? s : alpha * s; df = s > S(0) ? S(1) : alpha; ddf = S(0);
    }
    else if constexpr (ACT == BIAS_ACT_TANH)
    {
        const S t = tanh(s);
        f = t; df = S(1) - t * t; ddf = S(-2) * t * df;
    }
    else if constexpr (ACT == BIAS_ACT_SIGMOID)
    {
        const S g = sigmoid(s);
        f = g; df = g * (S(1) - g); ddf = df * (S(1) - S(2) * g);
    }
    else if constexpr (ACT == BIAS_ACT_ELU)
    {
        const S e = exp(s);
        f = s > S(0) ? s : alpha * (e - S(1)); df = s > S(0) ? S(1) : alpha * e; ddf = s > S(0) ? S(0) : alpha * e;
    }
    else if constexpr (ACT == BIAS_ACT_SELU)
    {
        const S selu_scale = S(1.0507009873554804934193349852946);
        const S selu_alpha = S(1.6732632423543772848170429916717);
        const S e = exp(s);
        f = selu_scale * (s > S(0) ? s : selu_alpha * (e - S(1)));
        df = selu_scale * (s > S(0) ? S(1) : selu_alpha * e);
        ddf = s > S(0) ? S(0) : selu_scale * selu_alpha * e;
    }
    else if constexpr (ACT == BIAS_ACT_SOFTPLUS)
    {
        const S softplus_threshold = S(20);  // as torch: softplus(s) = s above it
        const S g = sigmoid(s);
        const bool linear = s > softplus_threshold;
        f = linear ? s : log1p(exp(s)); df = linear ? S(1) : g; ddf = linear ? S(0) : g * (S(1) - g);
    }
    else if constexpr (ACT == BIAS_ACT_SWISH)
    {
        const S g = sigmoid(s);
        f = s * g; df = g * (S(1) + s * (S(1) - g)); ddf = g * (S(1) - g) * (S(2) + s * (S(1) - S(2) * g));
    }
    else  // BIAS_ACT_LINEAR
    {
        f = s; df = S(1); ddf = S(0);
    }
}

// One launch: n elements from the (already offset) pointers. Element k of the launch has the
// bias index c = (c0 + (r0 + k) / inner) % channels; r = (r0 + k) % inner is its place in its
// run of equal bias indices. Every quantity fits 32 bits (see plan_bias_act).
template <class S> struct BiasActArgs
{
    const void* x;
    const void* b;   // bias [channels], or nullptr
    const void* dy;  // gradient kernels only
    void* out;
    unsigned n, inner, channels, r0, c0;
    S alpha, gain, clamp;  // clamp < 0: none
    bool second;  // gradient kernels: act'' (BIAS_ACT_SECOND_GRAD) rather than act'
};

// Output element for s = x + b (see BiasActMode); dy is read by the gradient kernels only.
template <class T, int ACT, bool GRAD, class S>
__host__ __device__ __forceinline__ T bias_act_value(const BiasActArgs<S>& a, S s, T dy)
{
    S f, df, ddf;
    activation<ACT, S>(s, a.alpha, f, df, ddf);
    const S y = a.gain * f;
    const bool inside = a.clamp < S(0) || (y >= -a.clamp && y <= a.clamp);  // where the clamp passes gradients
    if constexpr (!GRAD)
        return T(inside || y != y ? y : (y > S(0) ? a.clamp : -a.clamp));  // NaN passes through, as in torch.clamp
    else
        return inside ? T(S(dy) * a.gain * (a.second ? ddf : df)) : T(S(0));
}

// count <= V elements from p into v (zeros beyond count): one 16-byte load when V > 1 and count == V.
template <class T, int V>
__host__ __device__ __forceinline__ void load(const T* p, unsigned count, T (&v)[V])
{
    if (V > 1 && count == V)
    {
        const uint4 bits = *reinterpret_cast<const uint4*>(p);
        memcpy(v, &bits, sizeof(bits));
    }
    else
    {
#pragma unroll
        for (int k = 0; k < V; k++)
            v[k] = k < int(count) ? p[k] : T(0);
    }
}

template <class T, int V>
__host__ __device__ __forceinline__ void store(T* p, unsigned count, const T (&v)[V])
{
    if (V > 1 && count == V)
    {
        uint4 bits;
        memcpy(&bits, v, sizeof(bits));
        *reinterpret_cast<uint4*>(p) = bits;
    }
    else
    {
#pragma unroll
        for (int k = 0; k < V; k++)
            if (k < int(count))
                p[k] = v[k];
    }
}

// Thread `first` of `step` threads: vectors of V elements (V = 1: scalar; else 16 bytes, the
// pointers 16-byte aligned), in a grid-stride loop.
template <class T, int ACT, bool GRAD, int V>
__host__ __device__ __forceinline__ void bias_act_thread(const BiasActArgs<typename AccType<T>::type>& a,
                                                         unsigned first, unsigned step)
{
    typedef typename AccType<T>::type S;
    const T* b = static_cast<const T*>(a.b);
    for (unsigned i = first * V; i < a.n; i += step * V)  // first element of the vector; < 2^30 + 2^31
    {
        const unsigned count = a.n - i < unsigned(V) ? a.n - i : unsigned(V);
        T x[V], dy[V], out[V];
        load<T, V>(static_cast<const T*>(a.x) + i, count, x);
        if constexpr (GRAD)
            load<T, V>(static_cast<const T*>(a.dy) + i, count, dy);
        unsigned r = 0, c = 0;
        if (b)
        {
            const unsigned q = (a.r0 + i) / a.inner;
            r = a.r0 + i - q * a.inner;
            c = (a.c0 + q) % a.channels;
        }
#pragma unroll
        for (int k = 0; k < V; k++)
        {
            S s = S(x[k]);
            if (b)
            {
                s += S(b[c]);
                if (++r == a.inner)  // next run: the next channel
                {
                    r = 0;
                    if (++c == a.channels)
                        c = 0;
                }
            }
            if constexpr (GRAD)
                out[k] = bias_act_value<T, ACT, true, S>(a, s, dy[k]);
            else
                out[k] = bias_act_value<T, ACT, false, S>(a, s, T(S(0)));
        }
        store<T, V>(static_cast<T*>(a.out) + i, count, out);
    }
}

template <class T, int ACT, bool GRAD, int V>
__global__ void __launch_bounds__(256) bias_act_kernel(BiasActArgs<typename AccType<T>::type> a)
{
    bias_act_thread<T, ACT, GRAD, V>(a, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}

static const int BIAS_ACT_BLOCK = 256;

// The launches for p: calls runner.template run<T, ACT, GRAD, V>(args, blocks) per chunk of at
// most max_chunk elements (a multiple of 8, so 16-byte alignment carries over from chunk to
// chunk). Where a run of equal bias indices is longer than a chunk, chunks end at run ends and
// each sees one bias index (inner = n, so every index stays below 2^31). Returns false for an
// unknown activation.
template <class T, class Runner> bool plan_bias_act(const BiasActParams& p, Runner& runner)
{
    typedef typename AccType<T>::type S;
    const long long max_chunk = p.max_chunk > 0 ? (p.max_chunk < 8 ? 8 : p.max_chunk / 8 * 8) : BIAS_ACT_MAX_CHUNK;
    const long long max_blocks = p.max_blocks > 0 ? p.max_blocks : 1 << 20;  // the grid-stride loop covers the rest
    const bool grad = p.mode != BIAS_ACT_FORWARD;
    for (long long start = 0; start < p.size;)
    {
        long long n = p.size - start < max_chunk ? p.size - start : max_chunk;
        BiasActArgs<S> a;
        a.x = static_cast<const T*>(p.x) + start;
        a.b = p.b;
        a.dy = grad ? static_cast<const T*>(p.dy) + start : nullptr;
        a.out = static_cast<T*>(p.out) + start;
        a.channels = unsigned(p.channels);
        a.inner = unsigned(p.inner);
        a.r0 = unsigned(start % p.inner);
        a.c0 = unsigned((start / p.inner) % p.channels);
        if (p.inner > max_chunk)
        {
            const long long run_left = p.inner - start % p.inner;
            n = n < run_left ? n : run_left;
            a.inner = unsigned(n);
            a.r0 = 0;
        }
        a.n = unsigned(n);
        a.alpha = S(p.alpha);
        a.gain = S(p.gain);
        a.clamp = S(p.clamp);
        a.second = p.mode == BIAS_ACT_SECOND_GRAD;
        const unsigned long long address = reinterpret_cast<unsigned long long>(a.x) |
            reinterpret_cast<unsigned long long>(a.dy) | reinterpret_cast<unsigned long long>(a.out);
        const int width = address % 16 == 0 ? Vector<T>::width : 1;
        const long long blocks_needed = ((n + width - 1) / width + BIAS_ACT_BLOCK - 1) / BIAS_ACT_BLOCK;
        const unsigned blocks = unsigned(blocks_needed < max_blocks ? blocks_needed : max_blocks);
#define BIAS_ACT_CASE(ACT)                                                                                    \
        case ACT:                                                                                             \
            if (width > 1)                                                                                    \
                grad ? runner.template run<T, ACT, true, Vector<T>::width>(a, blocks)                         \
                     : runner.template run<T, ACT, false, Vector<T>::width>(a, blocks);                       \
            else                                                                                              \
                grad ? runner.template run<T, ACT, true, 1>(a, blocks) : runner.template run<T, ACT, false, 1>(a, blocks); \
            break;
        switch (p.act)
        {
            BIAS_ACT_CASE(BIAS_ACT_LINEAR) BIAS_ACT_CASE(BIAS_ACT_RELU) BIAS_ACT_CASE(BIAS_ACT_LRELU)
            BIAS_ACT_CASE(BIAS_ACT_TANH) BIAS_ACT_CASE(BIAS_ACT_SIGMOID) BIAS_ACT_CASE(BIAS_ACT_ELU)
            BIAS_ACT_CASE(BIAS_ACT_SELU) BIAS_ACT_CASE(BIAS_ACT_SOFTPLUS) BIAS_ACT_CASE(BIAS_ACT_SWISH)
            default:
                return false;
        }
#undef BIAS_ACT_CASE
        start += n;
    }
    return true;
}

struct BiasActLauncher
{
    cudaStream_t stream;
    cudaError_t error;
    template <class T, int ACT, bool GRAD, int V> void run(const BiasActArgs<typename AccType<T>::type>& a,
                                                           unsigned blocks)
    {
        if (error == cudaSuccess)
        {
            bias_act_kernel<T, ACT, GRAD, V><<<blocks, BIAS_ACT_BLOCK, 0, stream>>>(a);
            error = cudaGetLastError();
        }
    }
};

template <class T> cudaError_t launch_bias_act_kernel(const BiasActParams& p, cudaStream_t stream)
{
    BiasActLauncher launcher = {stream, cudaSuccess};
    if (!plan_bias_act<T>(p, launcher))
        return cudaErrorInvalidValue;
    return launcher.error;
}

template cudaError_t launch_bias_act_kernel<float>(const BiasActParams& p, cudaStream_t stream);
template cudaError_t launch_bias_act_kernel<double>(const BiasActParams& p, cudaStream_t stream);
template cudaError_t launch_bias_act_kernel<c10::Half>(const BiasActParams& p, cudaStream_t stream);
template cudaError_t launch_bias_act_kernel<c10::BFloat16>(const BiasActParams& p, cudaStream_t stream);
