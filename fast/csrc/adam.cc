// Adam's update of one float32 variable and its two moments (Kingma and Ba, 2015; Section 5.3 of the paper) in one
// pass over memory: each entry's gradient, moments and weight are read once and written once, 28 bytes per
// parameter. TensorFlow's ResourceApplyAdam computes the same three assignments as three passes over its blocks.
// The arithmetic is TensorFlow's, in its order:
//   alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
//   m += (g - m) * (1 - beta1);   v += (g * g - v) * (1 - beta2);   var -= m * alpha / (sqrt(v) + epsilon)
// kernels.py builds this file; tests/test_kernels.py holds it to ResourceApplyAdam.
#define EIGEN_USE_THREADS  // training_op_helpers.h copies a variable with Eigen on the CPU's thread pool

#include <cmath>
#include <cstdint>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/training_op_helpers.h"
#include "common.h"

namespace {

using namespace nmt;  // NOLINT: common.h (the TensorFlow names used here)
using CPUDevice = Eigen::ThreadPoolDevice;

struct AdamConstants {
  float alpha, one_minus_beta1, one_minus_beta2, epsilon;
};

// Entries [first, last) of one update. A function of its arguments alone, so that the loop vectorizes; no fused
// multiply-adds, so that it rounds as TensorFlow's update does, bit for bit.
__attribute__((optimize("fp-contract=off"))) void adam_update(float* __restrict weights, float* __restrict m,
                                                              float* __restrict v, const float* __restrict grads,
                                                              AdamConstants c, int64_t first, int64_t last) {
  for (int64_t i = first; i < last; ++i) {
    const float g = grads[i];
    const float m_i = m[i] + (g - m[i]) * c.one_minus_beta1;
    const float v_i = v[i] + (g * g - v[i]) * c.one_minus_beta2;
    m[i] = m_i;
    v[i] = v_i;
    weights[i] -= (m_i * c.alpha) / (std::sqrt(v_i) + c.epsilon);
  }
}

class AdamOnePassOp : public OpKernel {
 public:
  explicit AdamOnePassOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("use_locking", &use_locking_));
  }

  void Compute(OpKernelContext* context) override {
    using tensorflow::GetInputTensorFromVariable;
    auto locks = tensorflow::MaybeLockVariableInputMutexesInOrder<CPUDevice, float>(context, use_locking_, false,
                                                                                     {0, 1, 2});
    Tensor weights, m, v;
    OP_REQUIRES_OK(context, GetInputTensorFromVariable<CPUDevice, float>(context, 0, use_locking_, false, &weights));
    OP_REQUIRES_OK(context, GetInputTensorFromVariable<CPUDevice, float>(context, 1, use_locking_, false, &m));
    OP_REQUIRES_OK(context, GetInputTensorFromVariable<CPUDevice, float>(context, 2, use_locking_, false, &v));
    const Tensor& grad = context->input(9);
    OP_REQUIRES(context, weights.IsInitialized() && m.IsInitialized() && v.IsInitialized(),
                absl::FailedPreconditionError("Adam's variable or moments are not initialized"));
    OP_REQUIRES(context, weights.shape() == grad.shape() && m.shape() == grad.shape() && v.shape() == grad.shape(),
                absl::InvalidArgumentError("the variable, its moments and its gradient must have one shape"));
    auto scalar = [&](int input) { return context->input(input).scalar<float>()(); };
    const float beta1_power = scalar(3), beta2_power = scalar(4), lr = scalar(5);
    const AdamConstants constants{lr * std::sqrt(1.0f - beta2_power) / (1.0f - beta1_power), 1.0f - scalar(6),
                                  1.0f - scalar(7), scalar(8)};
    float* weight_data = weights.flat<float>().data();
    float* m_data = m.flat<float>().data();
    float* v_data = v.flat<float>().data();
    const float* grad_data = grad.flat<float>().data();
    shard(context, grad.NumElements(), 30, [&](int64_t first, int64_t last) {
      adam_update(weight_data, m_data, v_data, grad_data, constants, first, last);
    });
  }

 private:
  bool use_locking_;
};

}  // namespace

REGISTER_OP("AdamOnePass")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("beta1_power: float")
    .Input("beta2_power: float")
    .Input("lr: float")
    .Input("beta1: float")
    .Input("beta2: float")
    .Input("epsilon: float")
    .Input("grad: float")
    .Attr("use_locking: bool = false")
    .SetShapeFn([](InferenceContext* c) { return absl::OkStatus(); });

REGISTER_KERNEL_BUILDER(Name("AdamOnePass").Device(DEVICE_CPU), AdamOnePassOp);
