// dropout(e * scale + PE): the scaled token embeddings plus positional encodings (Sections 3.4 and 3.5) with the
// dropout of their sum (Section 5.4), forward and backward, one pass instead of TensorFlow's scale, add, random
// draw, compare and select (and their gradients).
//
// e: (N, T, d) the embedding rows of the ids; encodings: (T, d), the same for every sentence. The keep decisions
// are drawn again by the backward kernel from the step's seed (common.h). kernels.py builds this file;
// tests/test_kernels.py holds it to TensorFlow's ops with the decisions drawn by numpy.
#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "common.h"

namespace {

using namespace nmt;  // NOLINT: common.h (the TensorFlow names used here)

// Rows [first, last) of the (N * T, d) outputs y = keep * (e * scale + encodings[row % T]) / (1 - rate).
// A function of its arguments alone, so that the compiler vectorizes the loops.
void forward_rows(const float* __restrict es, const float* __restrict encodings, int64_t length, int64_t d,
                  float scale, uint64_t key, int threshold, float keep_scale, int64_t first, int64_t last,
                  float* __restrict ys) {
  std::vector<float> keeps((last - first) * d);
  std::vector<uint64_t> words((last - first) * d / 4 + 2);
  keep_scales(key, first * d, (last - first) * d, threshold, keep_scale, words.data(), keeps.data());
  for (int64_t row = first; row < last; ++row) {
    const int64_t at = row * d;
    const float* keep = keeps.data() + (row - first) * d;
    const float* encoding = encodings + (row % length) * d;
    for (int64_t j = 0; j < d; ++j) ys[at + j] = keep[j] * (es[at + j] * scale + encoding[j]);
  }
}

// Entries [first, last) of the embeddings' gradient: keep * dy * scale / (1 - rate).
void backward_entries(const float* __restrict dys, float scale, uint64_t key, int threshold, float keep_scale,
                      int64_t first, int64_t last, float* __restrict des) {
  std::vector<float> keeps(last - first);
  std::vector<uint64_t> words((last - first) / 4 + 2);
  keep_scales(key, first, last - first, threshold, keep_scale * scale, words.data(), keeps.data());
  for (int64_t i = first; i < last; ++i) des[i] = keeps[i - first] * dys[i];
}

class EmbeddingDropoutOp : public OpKernel {
 public:
  explicit EmbeddingDropoutOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("scale", &scale_));
    OP_REQUIRES_OK(context, context->GetAttr("rate", &rate_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& e = context->input(0);
    const Tensor& encodings = context->input(1);
    OP_REQUIRES(context, e.dims() == 3 && encodings.dims() == 2 && encodings.dim_size(0) == e.dim_size(1) &&
                             encodings.dim_size(1) == e.dim_size(2),
                absl::InvalidArgumentError("e must be (N, T, d) and encodings (T, d)"));
    Tensor* y;
    OP_REQUIRES_OK(context, context->allocate_output(0, e.shape(), &y));
    const int64_t length = e.dim_size(1), d = e.dim_size(2);
    const int64_t rows = d == 0 ? 0 : e.NumElements() / d;
    const float* es = e.flat<float>().data();
    const float* encoding_rows = encodings.flat<float>().data();
    float* ys = y->flat<float>().data();
    const uint64_t key = seed_key(context->input(2));
    const int threshold = keep_threshold(rate_);
    const float keep_scale = 1.0f / (1.0f - rate_), scale = scale_;
    for_row_blocks(context, rows, d, [&](int64_t, int64_t first, int64_t last) {
      forward_rows(es, encoding_rows, length, d, scale, key, threshold, keep_scale, first, last, ys);
    });
  }

 private:
  float scale_, rate_;
};

class EmbeddingDropoutGradOp : public OpKernel {
 public:
  explicit EmbeddingDropoutGradOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("scale", &scale_));
    OP_REQUIRES_OK(context, context->GetAttr("rate", &rate_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& dy = context->input(0);
    Tensor* de;
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({0}, 0, dy.shape(), &de));
    const int64_t d = dy.dims() == 0 ? 1 : dy.dim_size(dy.dims() - 1);
    const int64_t rows = d == 0 ? 0 : dy.NumElements() / d;
    const float* dys = dy.flat<float>().data();
    float* des = de->flat<float>().data();
    const uint64_t key = seed_key(context->input(1));
    const int threshold = keep_threshold(rate_);
    const float keep_scale = 1.0f / (1.0f - rate_), scale = scale_;
    for_row_blocks(context, rows, d, [&](int64_t, int64_t first, int64_t last) {
      backward_entries(dys, scale, key, threshold, keep_scale, first * d, last * d, des);
    });
  }

 private:
  float scale_, rate_;
};

}  // namespace

REGISTER_OP("EmbeddingDropout")
    .Input("e: float")
    .Input("encodings: float")
    .Input("seed: int32")
    .Output("y: float")
    .Attr("scale: float")
    .Attr("rate: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });

REGISTER_OP("EmbeddingDropoutGrad")
    .Input("dy: float")
    .Input("seed: int32")
    .Output("de: float")
    .Attr("scale: float")
    .Attr("rate: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("EmbeddingDropout").Device(DEVICE_CPU), EmbeddingDropoutOp);
REGISTER_KERNEL_BUILDER(Name("EmbeddingDropoutGrad").Device(DEVICE_CPU), EmbeddingDropoutGradOp);
