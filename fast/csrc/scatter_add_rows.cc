// total with scale * rows[k] added to its row indices[k] for every k (repeated indices add up), in the total's own
// buffer when nothing else holds it: the embedding matrix's gradient, where the rows of the output layer's labels
// (loss.output_loss) and the gradients of both stacks' embedding lookups (model.tied_embeddings) are added into
// the output layer's dense (V, d_model) gradient. TensorFlow's ops would make each lookup's gradient a dense
// (V, d_model) tensor and add them (UnsortedSegmentSum, AddN), or copy the total before scattering into it.
// kernels.py builds this file; tests/test_kernels.py holds it to numpy's np.add.at.
#include <cstdint>
#include <cstring>
#include <string>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "common.h"

namespace {

using namespace nmt;  // NOLINT: common.h (the TensorFlow names used here)

// Columns [first, last) of every row indices[k] of sums (d columns) += scale * rows[k]. Each thread owns a range of
// columns, so that rows with the same index never race.
template <typename T, typename Index>
void add_rows(const Index* indices, const T* rows, int64_t count, int64_t d, float scale, int64_t first,
              int64_t last, float* sums) {
  for (int64_t k = 0; k < count; ++k) {
    float* sum = sums + static_cast<int64_t>(indices[k]) * d;
    const T* row = rows + k * d;
    for (int64_t j = first; j < last; ++j) sum[j] += scale * static_cast<float>(row[j]);
  }
}

template <typename T, typename Index>
class ScatterAddRowsOp : public OpKernel {
 public:
  explicit ScatterAddRowsOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("scale", &scale_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& total = context->input(0);
    const Tensor& indices = context->input(1);
    const Tensor& rows = context->input(2);
    OP_REQUIRES(context, total.dims() == 2 && indices.dims() == 1 && rows.dims() == 2 &&
                             rows.dim_size(0) == indices.dim_size(0) && rows.dim_size(1) == total.dim_size(1),
                absl::InvalidArgumentError("total must be (V, d), indices (K,) and rows (K, d)"));
    const int64_t vocab = total.dim_size(0), d = total.dim_size(1), count = indices.dim_size(0);
    const Index* ids = indices.flat<Index>().data();
    for (int64_t k = 0; k < count; ++k) {
      OP_REQUIRES(context, ids[k] >= 0 && ids[k] < vocab,
                  absl::InvalidArgumentError("index " + std::to_string(ids[k]) + " is outside the total's " +
                                             std::to_string(vocab) + " rows"));
    }
    Tensor* sum;
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({0}, 0, total.shape(), &sum));
    float* sums = sum->flat<float>().data();
    if (sums != total.flat<float>().data()) std::memcpy(sums, total.flat<float>().data(), total.TotalBytes());
    const T* values = rows.flat<T>().data();
    shard(context, d, 2 * count, [&](int64_t first, int64_t last) {
      add_rows(ids, values, count, d, scale_, first, last, sums);
    });
  }

 private:
  float scale_;
};

}  // namespace

REGISTER_OP("ScatterAddRows")
    .Input("total: float")
    .Input("indices: Tindices")
    .Input("rows: T")
    .Output("sum: float")
    .Attr("scale: float = 1.0")
    .Attr("T: {float, bfloat16, half}")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });

#define REGISTER(T, Index)                                                                                      \
  REGISTER_KERNEL_BUILDER(                                                                                      \
      Name("ScatterAddRows").Device(DEVICE_CPU).TypeConstraint<T>("T").TypeConstraint<Index>("Tindices"), \
      ScatterAddRowsOp<T, Index>);
REGISTER(float, int32_t)
REGISTER(float, int64_t)
REGISTER(Eigen::bfloat16, int32_t)
REGISTER(Eigen::bfloat16, int64_t)
REGISTER(Eigen::half, int32_t)
REGISTER(Eigen::half, int64_t)
