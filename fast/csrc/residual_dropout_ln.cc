// LN(x + dropout(f + b)): a post-layer-norm sublayer's residual connection (Section 3.1) with residual dropout
// (Section 5.4), forward and backward, one pass over each row instead of TensorFlow's dozen elementwise ops. f is
// the sublayer's last matrix product and b its bias, added here in float32, so that the backward kernel sums the
// bias's gradient too (the rows' sum of df) while it writes df.
//
// The keep decisions are not stored: both kernels draw them again from the step's seed (common.h).
// kernels.py builds this file; tests/test_kernels.py holds it to the same formulas computed by TensorFlow's ops
// with the decisions drawn by numpy.
#include <cmath>
#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "common.h"

namespace {

using namespace nmt;  // NOLINT: common.h (the TensorFlow names used here)

// Rows [first, last) of y = LN(x + keep * (f + fb)): also x_hat and 1/std per row for the backward pass. A
// function of its arguments alone (no captures), so that the compiler keeps every scalar in a register and
// vectorizes the loops.
template <typename T>
void forward_rows(const float* __restrict xs, const T* __restrict fs, const float* __restrict fb,
                  const float* __restrict g, const float* __restrict b, int64_t d, uint64_t key, int threshold,
                  float scale, float epsilon, int64_t first, int64_t last, float* __restrict ys,
                  float* __restrict hats, float* __restrict rstds) {
  std::vector<float> keep(d), r(d);
  std::vector<uint64_t> words(d / 4 + 2);
  for (int64_t row = first; row < last; ++row) {
    const int64_t at = row * d;
    keep_scales(key, at, d, threshold, scale, words.data(), keep.data());
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < d; ++j) {
      r[j] = xs[at + j] + keep[j] * (static_cast<float>(fs[at + j]) + fb[j]);
      sum += r[j];
    }
    const float mean = sum / d;
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (int64_t j = 0; j < d; ++j) squares += (r[j] - mean) * (r[j] - mean);
    const float inv = 1.0f / std::sqrt(squares / d + epsilon);
    rstds[row] = inv;
    for (int64_t j = 0; j < d; ++j) {
      const float hat = (r[j] - mean) * inv;
      hats[at + j] = hat;
      ys[at + j] = hat * g[j] + b[j];
    }
  }
}

template <typename T>
class ResidualDropoutLnOp : public OpKernel {
 public:
  explicit ResidualDropoutLnOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("rate", &rate_));
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& f = context->input(1);
    const Tensor& f_bias = context->input(2);
    const Tensor& gamma = context->input(3);
    const Tensor& beta = context->input(4);
    OP_REQUIRES(context, x.shape() == f.shape() && x.dims() >= 1,
                absl::InvalidArgumentError("x and f must have one shape (..., d)"));
    const int64_t d = x.dim_size(x.dims() - 1);
    OP_REQUIRES(context, f_bias.NumElements() == d && gamma.NumElements() == d && beta.NumElements() == d,
                absl::InvalidArgumentError("f_bias, gamma and beta must have d entries"));
    TensorShape row_shape = x.shape();
    row_shape.RemoveLastDims(1);
    Tensor *y, *x_hat, *rstd;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(context, context->allocate_output(1, x.shape(), &x_hat));
    OP_REQUIRES_OK(context, context->allocate_output(2, row_shape, &rstd));
    const int64_t rows = d == 0 ? 0 : x.NumElements() / d;
    const float* xs = x.flat<float>().data();
    const T* fs = f.flat<T>().data();
    const float* fb = f_bias.flat<float>().data();
    const float* g = gamma.flat<float>().data();
    const float* b = beta.flat<float>().data();
    float* ys = y->flat<float>().data();
    float* hats = x_hat->flat<float>().data();
    float* rstds = rstd->flat<float>().data();
    const uint64_t key = seed_key(context->input(5));
    const int threshold = keep_threshold(rate_);
    const float scale = 1.0f / (1.0f - rate_);
    const float epsilon = epsilon_;
    for_row_blocks(context, rows, d, [&](int64_t, int64_t first, int64_t last) {
      forward_rows(xs, fs, fb, g, b, d, key, threshold, scale, epsilon, first, last, ys, hats, rstds);
    });
  }

 private:
  float rate_, epsilon_;
};

// Rows [first, last) of the gradients dx and df = keep * dx, from dy, x_hat and 1/std: dx = rstd (G - mean(G) -
// x_hat mean(G x_hat)) with G = dy gamma. block_sums: (3, d), set to these rows' sums of dy x_hat, of dy and of df
// (before df is rounded to T).
template <typename T>
void backward_rows(const float* __restrict dys, const float* __restrict hats, const float* __restrict rstds,
                   const float* __restrict g, int64_t d, uint64_t key, int threshold, float scale, int64_t first,
                   int64_t last, float* __restrict dxs, T* __restrict dfs, float* __restrict block_sums) {
  std::vector<float> keep(d), gg(d);
  std::vector<uint64_t> words(d / 4 + 2);
  float* __restrict gamma_sums = block_sums;
  float* __restrict beta_sums = block_sums + d;
  float* __restrict f_bias_sums = block_sums + 2 * d;
  std::fill(block_sums, block_sums + 3 * d, 0.0f);
  for (int64_t row = first; row < last; ++row) {
    const int64_t at = row * d;
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (int64_t j = 0; j < d; ++j) {
      gg[j] = dys[at + j] * g[j];
      sum_g += gg[j];
      sum_gx += gg[j] * hats[at + j];
      gamma_sums[j] += dys[at + j] * hats[at + j];
      beta_sums[j] += dys[at + j];
    }
    const float mean_g = sum_g / d, mean_gx = sum_gx / d, inv = rstds[row];
    keep_scales(key, at, d, threshold, scale, words.data(), keep.data());
    for (int64_t j = 0; j < d; ++j) {
      const float grad = inv * (gg[j] - mean_g - hats[at + j] * mean_gx);
      dxs[at + j] = grad;
      dfs[at + j] = narrow<T>(keep[j] * grad);
      f_bias_sums[j] += keep[j] * grad;
    }
  }
}

template <typename T>
class ResidualDropoutLnGradOp : public OpKernel {
 public:
  explicit ResidualDropoutLnGradOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("rate", &rate_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& dy = context->input(0);
    const Tensor& x_hat = context->input(1);
    const Tensor& rstd = context->input(2);
    const Tensor& gamma = context->input(3);
    const int64_t d = dy.dim_size(dy.dims() - 1);
    const int64_t rows = d == 0 ? 0 : dy.NumElements() / d;
    Tensor *dx, *df, *df_bias, *dgamma, *dbeta;
    OP_REQUIRES_OK(context, context->allocate_output(0, dy.shape(), &dx));
    OP_REQUIRES_OK(context, context->allocate_output(1, dy.shape(), &df));
    OP_REQUIRES_OK(context, context->allocate_output(2, gamma.shape(), &df_bias));
    OP_REQUIRES_OK(context, context->allocate_output(3, gamma.shape(), &dgamma));
    OP_REQUIRES_OK(context, context->allocate_output(4, gamma.shape(), &dbeta));
    const int64_t blocks = (rows + BLOCK_ROWS - 1) / BLOCK_ROWS;
    Tensor partials;  // (blocks, 3, d): each block's sums of dy * x_hat, of dy and of df
    OP_REQUIRES_OK(context, context->allocate_temp(tensorflow::DT_FLOAT, TensorShape({blocks, 3, d}), &partials));
    const float* dys = dy.flat<float>().data();
    const float* hats = x_hat.flat<float>().data();
    const float* rstds = rstd.flat<float>().data();
    const float* g = gamma.flat<float>().data();
    float* dxs = dx->flat<float>().data();
    T* dfs = df->flat<T>().data();
    float* sums = partials.flat<float>().data();
    const uint64_t key = seed_key(context->input(4));
    const int threshold = keep_threshold(rate_);
    const float scale = 1.0f / (1.0f - rate_);
    for_row_blocks(context, rows, d, [&](int64_t block, int64_t first, int64_t last) {
      backward_rows(dys, hats, rstds, g, d, key, threshold, scale, first, last, dxs, dfs, sums + block * 3 * d);
    });
    float* dgammas = dgamma->flat<float>().data();
    float* dbetas = dbeta->flat<float>().data();
    float* df_biases = df_bias->flat<float>().data();
    for (int64_t j = 0; j < d; ++j) dgammas[j] = dbetas[j] = df_biases[j] = 0.0f;
    for (int64_t block = 0; block < blocks; ++block) {  // in block order, whatever the threads did
      const float* block_sums = sums + block * 3 * d;
      for (int64_t j = 0; j < d; ++j) {
        dgammas[j] += block_sums[j];
        dbetas[j] += block_sums[d + j];
        df_biases[j] += block_sums[2 * d + j];
      }
    }
  }

 private:
  float rate_;
};

absl::Status same_as_input(InferenceContext* c, int outputs) {
  for (int i = 0; i < outputs; ++i) c->set_output(i, c->input(0));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("ResidualDropoutLn")
    .Input("x: float")
    .Input("f: T")
    .Input("f_bias: float")
    .Input("gamma: float")
    .Input("beta: float")
    .Input("seed: int32")
    .Output("y: float")
    .Output("x_hat: float")
    .Output("rstd: float")
    .Attr("T: {float, bfloat16, half}")
    .Attr("rate: float")
    .Attr("epsilon: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->Subshape(c->input(0), 0, -1, &rows));
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(0));
      c->set_output(2, rows);
      return absl::OkStatus();
    });

REGISTER_OP("ResidualDropoutLnGrad")
    .Input("dy: float")
    .Input("x_hat: float")
    .Input("rstd: float")
    .Input("gamma: float")
    .Input("seed: int32")
    .Output("dx: float")
    .Output("df: T")
    .Output("df_bias: float")
    .Output("dgamma: float")
    .Output("dbeta: float")
    .Attr("T: {float, bfloat16, half}")
    .Attr("rate: float")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(same_as_input(c, 2));
      for (int i = 2; i < 5; ++i) c->set_output(i, c->input(3));
      return absl::OkStatus();
    });

#define REGISTER(T)                                                                                  \
  REGISTER_KERNEL_BUILDER(Name("ResidualDropoutLn").Device(DEVICE_CPU).TypeConstraint<T>("T"),       \
                          ResidualDropoutLnOp<T>);                                                    \
  REGISTER_KERNEL_BUILDER(Name("ResidualDropoutLnGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),   \
                          ResidualDropoutLnGradOp<T>);
REGISTER(float)
REGISTER(Eigen::bfloat16)
REGISTER(Eigen::half)
