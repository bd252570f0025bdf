// The output layer's softmax and label-smoothed cross entropy (Sections 3.4 and 5.4) on a chunk of logit rows in
// one pass over each row, read in the matrix product's own dtype: loss.output_loss's
// smoothed_cross_entropy without the casts of the (rows, V) logits to float32 and of the softmax back.
//
// Per row: p = softmax(logits), loss = epsilon (logits[y] - mean) - log(max(p_y, 1e-37)), with y the label and
// mean the row's mean logit (given). No gradient: output_loss applies p itself. kernels.py builds this file;
// tests/test_kernels.py holds it to TensorFlow's ops.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "common.h"

namespace {

using namespace nmt;  // NOLINT: common.h (the TensorFlow names used here)

// Rows [first, last) of the (M, V) logits: their softmax p (in T) and losses. A function of its arguments alone,
// so that the compiler vectorizes the loops.
template <typename T>
void cross_entropy_rows(const T* __restrict logits, const int32_t* __restrict labels,
                        const float* __restrict means, int64_t v, float epsilon, int64_t first, int64_t last,
                        float* __restrict losses, T* __restrict probs) {
  std::vector<float> e(v);
  for (int64_t row = first; row < last; ++row) {
    const T* z = logits + row * v;
    float top = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : top)
    for (int64_t j = 0; j < v; ++j) top = static_cast<float>(z[j]) > top ? static_cast<float>(z[j]) : top;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < v; ++j) {
      e[j] = exp_nonpositive(static_cast<float>(z[j]) - top);
      sum += e[j];
    }
    const float inv = 1.0f / sum;
    T* p = probs + row * v;
    for (int64_t j = 0; j < v; ++j) p[j] = narrow<T>(e[j] * inv);
    const int32_t y = labels[row];
    const float label_logit = static_cast<float>(z[y]);
    losses[row] = epsilon * (label_logit - means[row]) - std::log(std::max(e[y] * inv, 1e-37f));
  }
}

template <typename T>
class SmoothedCrossEntropyOp : public OpKernel {
 public:
  explicit SmoothedCrossEntropyOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& logits = context->input(0);
    const Tensor& labels = context->input(1);
    const Tensor& means = context->input(2);
    OP_REQUIRES(context, logits.dims() == 2, absl::InvalidArgumentError("logits must be (M, V)"));
    const int64_t m = logits.dim_size(0), v = logits.dim_size(1);
    OP_REQUIRES(context, labels.NumElements() == m && means.NumElements() == m,
                absl::InvalidArgumentError("labels and logit_means must have M entries"));
    auto ys = labels.flat<int32_t>();
    for (int64_t i = 0; i < m; ++i) {
      OP_REQUIRES(context, ys(i) >= 0 && ys(i) < v, absl::InvalidArgumentError("a label is outside [0, V)"));
    }
    Tensor *losses, *probs;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({m}), &losses));
    OP_REQUIRES_OK(context, context->allocate_output(1, logits.shape(), &probs));
    const T* zs = logits.flat<T>().data();
    const int32_t* label_ids = ys.data();
    const float* row_means = means.flat<float>().data();
    float* loss_out = losses->flat<float>().data();
    T* prob_out = probs->flat<T>().data();
    const float epsilon = epsilon_;
    shard(context, m, v * 20, [&](int64_t first, int64_t last) {
      cross_entropy_rows(zs, label_ids, row_means, v, epsilon, first, last, loss_out, prob_out);
    });
  }

 private:
  float epsilon_;
};

}  // namespace

REGISTER_OP("SmoothedCrossEntropy")
    .Input("logits: T")
    .Input("labels: int32")
    .Input("logit_means: float")
    .Output("losses: float")
    .Output("probs: T")
    .Attr("T: {float, bfloat16, half}")
    .Attr("epsilon: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      c->set_output(1, c->input(0));
      return absl::OkStatus();
    });

#define REGISTER(T)                                                                                   \
  REGISTER_KERNEL_BUILDER(Name("SmoothedCrossEntropy").Device(DEVICE_CPU).TypeConstraint<T>("T"),     \
                          SmoothedCrossEntropyOp<T>);
REGISTER(float)
REGISTER(Eigen::bfloat16)
REGISTER(Eigen::half)
