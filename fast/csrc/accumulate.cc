// total + addend with a float32 total and a 16-bit addend, in one pass and in the total's own buffer when nothing
// else holds it: the running sum of the output layer's per-chunk embedding gradients in loss.output_loss, where
// TensorFlow's ops would cast each (V, d_model) product to float32 into a new tensor and then add it.
// kernels.py builds this file; tests/test_kernels.py holds it to the cast and the add.
#include <cstdint>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "common.h"

namespace {

using namespace nmt;  // NOLINT: common.h (the TensorFlow names used here)

// Entries [first, last) of sums = totals + addends. A function of its arguments alone, so that the loop vectorizes.
template <typename T>
void add_widened(const float* totals, const T* __restrict addends, int64_t first, int64_t last, float* sums) {
  for (int64_t i = first; i < last; ++i) sums[i] = totals[i] + static_cast<float>(addends[i]);
}

template <typename T>
class AccumulateOp : public OpKernel {
 public:
  explicit AccumulateOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& total = context->input(0);
    const Tensor& addend = context->input(1);
    OP_REQUIRES(context, total.shape() == addend.shape(),
                absl::InvalidArgumentError("total and addend must have one shape"));
    Tensor* sum;
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({0}, 0, total.shape(), &sum));
    const float* totals = total.flat<float>().data();
    const T* addends = addend.flat<T>().data();
    float* sums = sum->flat<float>().data();
    shard(context, total.NumElements(), 4, [&](int64_t first, int64_t last) {
      add_widened(totals, addends, first, last, sums);
    });
  }
};

}  // namespace

REGISTER_OP("Accumulate")
    .Input("total: float")
    .Input("addend: T")
    .Output("sum: float")
    .Attr("T: {bfloat16, half}")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });

#define REGISTER(T) \
  REGISTER_KERNEL_BUILDER(Name("Accumulate").Device(DEVICE_CPU).TypeConstraint<T>("T"), AccumulateOp<T>);
REGISTER(Eigen::bfloat16)
REGISTER(Eigen::half)
