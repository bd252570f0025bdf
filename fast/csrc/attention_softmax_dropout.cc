// softmax(scale * s + masks) and dropout of it: the attention weights of Section 3.2.1 with attention dropout
// (Section 5.4), forward and backward, one pass over each row of logits instead of TensorFlow's chain of casts,
// scaling, mask additions, softmax and dropout ops (and their gradients).
//
// s: (N, T_q, T_k) the products Q K^T, in float32 or a 16-bit float; the masks: (N or 1, 1, T_k) float32 biases
// (modules.key_biases) and, for the decoder's self-attention, keys after their query, which get weight 0 (as their
// MASKED_LOGIT does in modules.mask_future). The keep decisions are drawn again by the backward kernel from the
// step's seed (common.h). kernels.py builds this file; tests/test_kernels.py holds it to TensorFlow's ops.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "Eigen/Core"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "common.h"

namespace {

using namespace nmt;  // NOLINT: common.h (the TensorFlow names used here)

// A row buffer of n floats starting on a 64-byte boundary inside storage. Eigen's vector reductions start their
// packets at the first aligned address, so the summation order (and the last bits of a sum) would otherwise follow
// wherever the heap put the buffer: with a fixed alignment every run adds in the same order.
inline float* aligned_row(std::vector<float>& storage, int64_t n) {
  storage.resize(n + 16);
  const uintptr_t address = reinterpret_cast<uintptr_t>(storage.data());
  return storage.data() + ((64 - address % 64) % 64) / sizeof(float);
}

// Rows [first, last) of the (N * T_q, T_k) weights p = softmax(scale * s + bias) (0 after the query when causal)
// and of keep * p. A function of its arguments alone, so that the compiler vectorizes the loops. Rows are often
// shorter than 32 keys: the block's keep decisions are drawn in one pass, and each row's max and sum go through
// Eigen's vector reductions (a plain loop's reduction falls back to one key at a time on rows that short).
template <typename T>
void forward_rows(const T* __restrict ss, const float* __restrict bs, int64_t bias_stride, int64_t t_q, int64_t t_k,
                  float scale, bool causal, uint64_t key, int threshold, float keep_scale, int64_t first, int64_t last,
                  float* __restrict ps, T* __restrict ds) {
  std::vector<float> keeps((last - first) * t_k), z_storage;
  float* z = aligned_row(z_storage, t_k);
  std::vector<uint64_t> words((last - first) * t_k / 4 + 2);
  keep_scales(key, first * t_k, (last - first) * t_k, threshold, keep_scale, words.data(), keeps.data());
  int64_t query = first % t_q;  // row = (batch entry) * t_q + query
  const float* bias = bs + (first / t_q) * bias_stride;
  for (int64_t row = first; row < last; ++row, ++query) {
    if (query == t_q) {
      query = 0;
      bias += bias_stride;
    }
    const int64_t at = row * t_k;
    const float* keep = keeps.data() + (row - first) * t_k;
    const int64_t width = causal ? std::min(t_k, query + 1) : t_k;  // keys with weight > 0 possible
    for (int64_t j = 0; j < width; ++j) z[j] = static_cast<float>(ss[at + j]) * scale + bias[j];
    const float top = Eigen::Map<const Eigen::ArrayXf>(z, width).maxCoeff();
    for (int64_t j = 0; j < width; ++j) z[j] = exp_nonpositive(z[j] - top);
    const float inv = 1.0f / Eigen::Map<const Eigen::ArrayXf>(z, width).sum();
    for (int64_t j = 0; j < width; ++j) {
      const float p = z[j] * inv;
      ps[at + j] = p;
      ds[at + j] = narrow<T>(p * keep[j]);
    }
    for (int64_t j = width; j < t_k; ++j) {
      ps[at + j] = 0.0f;
      ds[at + j] = narrow<T>(0.0f);
    }
  }
}

template <typename T>
class AttentionSoftmaxDropoutOp : public OpKernel {
 public:
  explicit AttentionSoftmaxDropoutOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("scale", &scale_));
    OP_REQUIRES_OK(context, context->GetAttr("rate", &rate_));
    OP_REQUIRES_OK(context, context->GetAttr("causal", &causal_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& s = context->input(0);
    const Tensor& biases = context->input(1);
    OP_REQUIRES(context, s.dims() == 3, absl::InvalidArgumentError("s must be (N, T_q, T_k)"));
    const int64_t n = s.dim_size(0), t_q = s.dim_size(1), t_k = s.dim_size(2);
    OP_REQUIRES(context, biases.dims() == 3 && (biases.dim_size(0) == n || biases.dim_size(0) == 1) &&
                             biases.dim_size(1) == 1 && biases.dim_size(2) == t_k,
                absl::InvalidArgumentError("biases must be (N or 1, 1, T_k)"));
    Tensor *attention, *dropped;
    OP_REQUIRES_OK(context, context->allocate_output(0, s.shape(), &attention));
    OP_REQUIRES_OK(context, context->allocate_output(1, s.shape(), &dropped));
    const T* ss = s.flat<T>().data();
    const float* bs = biases.flat<float>().data();
    const int64_t bias_stride = biases.dim_size(0) == 1 ? 0 : t_k;
    float* ps = attention->flat<float>().data();
    T* ds = dropped->flat<T>().data();
    const uint64_t key = seed_key(context->input(2));
    const int threshold = keep_threshold(rate_);
    const float keep_scale = 1.0f / (1.0f - rate_), scale = scale_;
    const bool causal = causal_;
    for_row_blocks(context, n * t_q, t_k, [&](int64_t, int64_t first, int64_t last) {
      forward_rows(ss, bs, bias_stride, t_q, t_k, scale, causal, key, threshold, keep_scale, first, last, ps, ds);
    });
  }

 private:
  float scale_, rate_;
  bool causal_;
};

// Rows [first, last) of d_s = scale * p * (dp - sum_j p_j dp_j), dp = keep * d_dropped: the gradient of the
// weights before dropout, through the softmax (keep decisions and the row sums as in forward_rows).
template <typename T>
void backward_rows(const T* __restrict dds, const float* __restrict ps, int64_t t_k, float scale, uint64_t key,
                   int threshold, float keep_scale, int64_t first, int64_t last, T* __restrict out) {
  std::vector<float> keeps((last - first) * t_k), dp(t_k), product_storage;
  float* products = aligned_row(product_storage, t_k);
  std::vector<uint64_t> words((last - first) * t_k / 4 + 2);
  keep_scales(key, first * t_k, (last - first) * t_k, threshold, keep_scale, words.data(), keeps.data());
  for (int64_t row = first; row < last; ++row) {
    const int64_t at = row * t_k;
    const float* keep = keeps.data() + (row - first) * t_k;
    for (int64_t j = 0; j < t_k; ++j) {
      dp[j] = keep[j] * static_cast<float>(dds[at + j]);
      products[j] = ps[at + j] * dp[j];
    }
    const float dot = Eigen::Map<const Eigen::ArrayXf>(products, t_k).sum();
    for (int64_t j = 0; j < t_k; ++j) out[at + j] = narrow<T>(scale * ps[at + j] * (dp[j] - dot));
  }
}

template <typename T>
class AttentionSoftmaxDropoutGradOp : public OpKernel {
 public:
  explicit AttentionSoftmaxDropoutGradOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("scale", &scale_));
    OP_REQUIRES_OK(context, context->GetAttr("rate", &rate_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& d_dropped = context->input(0);
    const Tensor& attention = context->input(1);
    const int64_t t_k = attention.dim_size(2);
    const int64_t rows = t_k == 0 ? 0 : attention.NumElements() / t_k;
    Tensor* d_s;
    OP_REQUIRES_OK(context, context->allocate_output(0, attention.shape(), &d_s));
    const T* dds = d_dropped.flat<T>().data();
    const float* ps = attention.flat<float>().data();
    T* out = d_s->flat<T>().data();
    const uint64_t key = seed_key(context->input(2));
    const int threshold = keep_threshold(rate_);
    const float keep_scale = 1.0f / (1.0f - rate_), scale = scale_;
    for_row_blocks(context, rows, t_k, [&](int64_t, int64_t first, int64_t last) {
      backward_rows(dds, ps, t_k, scale, key, threshold, keep_scale, first, last, out);
    });
  }

 private:
  float scale_, rate_;
};

}  // namespace

REGISTER_OP("AttentionSoftmaxDropout")
    .Input("s: T")
    .Input("biases: float")
    .Input("seed: int32")
    .Output("attention: float")
    .Output("dropped: T")
    .Attr("T: {float, bfloat16, half}")
    .Attr("scale: float")
    .Attr("rate: float")
    .Attr("causal: bool")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(0));
      return absl::OkStatus();
    });

REGISTER_OP("AttentionSoftmaxDropoutGrad")
    .Input("d_dropped: T")
    .Input("attention: float")
    .Input("seed: int32")
    .Output("d_s: T")
    .Attr("T: {float, bfloat16, half}")
    .Attr("scale: float")
    .Attr("rate: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      return absl::OkStatus();
    });

#define REGISTER(T)                                                                                         \
  REGISTER_KERNEL_BUILDER(Name("AttentionSoftmaxDropout").Device(DEVICE_CPU).TypeConstraint<T>("T"),        \
                          AttentionSoftmaxDropoutOp<T>);                                                     \
  REGISTER_KERNEL_BUILDER(Name("AttentionSoftmaxDropoutGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),    \
                          AttentionSoftmaxDropoutGradOp<T>);
REGISTER(float)
REGISTER(Eigen::bfloat16)
REGISTER(Eigen::half)
