// Fused bias + activation + gain + clamp: the CUDA kernel (see bias_act.h).
// One element per thread in a grid-stride loop; the op is memory bound, so
// the only goal is a single read of each input and a single write. The
// per-element arithmetic is also compiled for the host, where the tests check
// it against the PyTorch reference without a GPU.

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include "bias_act.h"

// Arithmetic type: half types compute in float, double in double.
template <class T> struct AccType { typedef float type; };
template <> struct AccType<double> { typedef double type; };

template <class S> __host__ __device__ __forceinline__ S sigmoid(S s) { return S(1) / (S(1) + exp(-s)); }

// act(s) and its first and second derivatives.
template <class S>
__host__ __device__ __forceinline__ void activation(int act, S s, S alpha, S& f, S& df, S& ddf)
{
    const S selu_scale = S(1.0507009873554804934193349852946);
    const S selu_alpha = S(1.6732632423543772848170429916717);
    const S softplus_threshold = S(20);  // as torch: softplus(s) = s above it
    switch (act)
    {
        case BIAS_ACT_RELU:
            f = s > S(0) ? s : S(0); df = s > S(0) ? S(1) : S(0); ddf = S(0);
            break;
        case BIAS_ACT_LRELU:
            f = s > S(0) ? s : alpha * s; df = s > S(0) ? S(1) : alpha; ddf = S(0);
            break;
        case BIAS_ACT_TANH: {
            S t = tanh(s);
            f = t; df = S(1) - t * t; ddf = S(-2) * t * df;
            break;
        }
        case BIAS_ACT_SIGMOID: {
            S g = sigmoid(s);
            f = g; df = g * (S(1) - g); ddf = df * (S(1) - S(2) * g);
            break;
        }
        case BIAS_ACT_ELU: {
            S e = exp(s);
            f = s > S(0) ? s : alpha * (e - S(1)); df = s > S(0) ? S(1) : alpha * e; ddf = s > S(0) ? S(0) : alpha * e;
            break;
        }
        case BIAS_ACT_SELU: {
            S e = exp(s);
            f = selu_scale * (s > S(0) ? s : selu_alpha * (e - S(1)));
            df = selu_scale * (s > S(0) ? S(1) : selu_alpha * e);
            ddf = s > S(0) ? S(0) : selu_scale * selu_alpha * e;
            break;
        }
        case BIAS_ACT_SOFTPLUS: {
            S g = sigmoid(s);
            bool linear = s > softplus_threshold;
            f = linear ? s : log1p(exp(s)); df = linear ? S(1) : g; ddf = linear ? S(0) : g * (S(1) - g);
            break;
        }
        case BIAS_ACT_SWISH: {
            S g = sigmoid(s);
            f = s * g; df = g * (S(1) + s * (S(1) - g)); ddf = g * (S(1) - g) * (S(2) + s * (S(1) - S(2) * g));
            break;
        }
        default:  // BIAS_ACT_LINEAR
            f = s; df = S(1); ddf = S(0);
            break;
    }
}

// Output element i (see BiasActMode).
template <class T, class I>
__host__ __device__ __forceinline__ T bias_act_element(const BiasActParams& p, I i)
{
    typedef typename AccType<T>::type S;
    const S alpha = S(p.alpha), gain = S(p.gain), clamp = S(p.clamp);
    S s = S(static_cast<const T*>(p.x)[i]);
    if (p.b)
        s += S(static_cast<const T*>(p.b)[(i / I(p.inner)) % I(p.channels)]);
    S f, df, ddf;
    activation<S>(p.act, s, alpha, f, df, ddf);
    const S y = gain * f;
    const bool inside = clamp < S(0) || (y >= -clamp && y <= clamp);  // where the clamp passes gradients
    if (p.mode == BIAS_ACT_FORWARD)
        return T(inside || y != y ? y : (y > S(0) ? clamp : -clamp));  // NaN passes through, as in torch.clamp
    if (!inside)
        return T(S(0));
    return T(S(static_cast<const T*>(p.dy)[i]) * gain * (p.mode == BIAS_ACT_GRAD ? df : ddf));
}

template <class T, class I>
__global__ void bias_act_kernel(BiasActParams p)
{
    T* out = static_cast<T*>(p.out);
    const I size = I(p.size);
    for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < size; i += I(blockDim.x) * gridDim.x)
        out[i] = bias_act_element<T, I>(p, i);
}

template <class T> cudaError_t launch_bias_act_kernel(const BiasActParams& p, cudaStream_t stream)
{
    if (p.size == 0)
        return cudaSuccess;
    const int block_size = 256;
    const long long max_blocks = p.max_blocks > 0 ? p.max_blocks : 1 << 20;  // the grid-stride loop covers the rest
    long long blocks = (p.size + block_size - 1) / block_size;
    dim3 grid(unsigned(blocks < max_blocks ? blocks : max_blocks));
    // 32-bit index arithmetic is markedly cheaper (the channel index divides)
    // where no index of the grid-stride loop can overflow it.
    const long long stride = (long long)block_size * grid.x;
    if (p.size + stride <= 0xffffffffLL)
        bias_act_kernel<T, unsigned int><<<grid, block_size, 0, stream>>>(p);
    else
        bias_act_kernel<T, long long><<<grid, block_size, 0, stream>>>(p);
    return cudaGetLastError();
}

template cudaError_t launch_bias_act_kernel<float>(const BiasActParams& p, cudaStream_t stream);
template cudaError_t launch_bias_act_kernel<double>(const BiasActParams& p, cudaStream_t stream);
template cudaError_t launch_bias_act_kernel<c10::Half>(const BiasActParams& p, cudaStream_t stream);
template cudaError_t launch_bias_act_kernel<c10::BFloat16>(const BiasActParams& p, cudaStream_t stream);
