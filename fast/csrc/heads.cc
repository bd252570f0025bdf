// Attention's heads moved between the rows of the projections and the batch of the per-head products (Section
// 3.2.2), each a copy of d_model/h contiguous values at a time:
//   SplitHeads: x (N, T, P*h*dh), the P projections side by side -> P tensors (N*h, T, dh)
//   MergeHeads: P tensors (N*h, T, dh) -> (N, T, P*h*dh)
// Each is the other's gradient. TensorFlow's ops do the split with a 5-D transpose and, for its gradient, a stack
// of the P gradients and another transpose (modules.split_heads, merge_heads and fused_heads spell them out).
// kernels.py builds this file; tests/test_kernels.py holds both to those ops.
#include <cstdint>
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/types.h"
#include "common.h"

namespace {

using namespace nmt;  // NOLINT: common.h (the TensorFlow names used here)

// Sentences [first, last): row (n, t) of rows holds, for p < parts and i < heads, the dh values of head i of part p,
// which are row t of batch entry n * heads + i of heads_of[p]. to_rows says which way the values go. kBytes, the
// bytes of dh values when known at compile time (0: dh_bytes), lets the compiler copy with vector moves.
template <int64_t kBytes>
void move_heads(char* rows, const std::vector<char*>& heads_of, int64_t length, int64_t heads, int64_t dh_bytes,
                bool to_rows, int64_t first, int64_t last) {
  const int64_t bytes = kBytes ? kBytes : dh_bytes;
  const int64_t parts = heads_of.size(), row_bytes = parts * heads * bytes;
  for (int64_t n = first; n < last; ++n) {
    for (int64_t t = 0; t < length; ++t) {
      char* row = rows + (n * length + t) * row_bytes;
      for (int64_t p = 0; p < parts; ++p) {
        for (int64_t i = 0; i < heads; ++i) {
          char* head = heads_of[p] + ((n * heads + i) * length + t) * bytes;
          char* part = row + (p * heads + i) * bytes;
          if (to_rows) {
            std::memcpy(part, head, bytes);
          } else {
            std::memcpy(head, part, bytes);
          }
        }
      }
    }
  }
}

// move_heads for sentences [first, last), with the copy's size fixed for the usual heads (32 or 64 values of 2 or
// 4 bytes).
void move_heads_of(char* rows, const std::vector<char*>& heads_of, int64_t length, int64_t heads, int64_t dh_bytes,
                   bool to_rows, int64_t first, int64_t last) {
  switch (dh_bytes) {
    case 64: return move_heads<64>(rows, heads_of, length, heads, dh_bytes, to_rows, first, last);
    case 128: return move_heads<128>(rows, heads_of, length, heads, dh_bytes, to_rows, first, last);
    case 256: return move_heads<256>(rows, heads_of, length, heads, dh_bytes, to_rows, first, last);
    default: return move_heads<0>(rows, heads_of, length, heads, dh_bytes, to_rows, first, last);
  }
}

class SplitHeadsOp : public OpKernel {
 public:
  explicit SplitHeadsOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("num_heads", &heads_));
    OP_REQUIRES_OK(context, context->GetAttr("parts", &parts_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    OP_REQUIRES(context, x.dims() == 3 && x.dim_size(2) % (parts_ * heads_) == 0,
                absl::InvalidArgumentError("x must be (N, T, parts * num_heads * d_head)"));
    const int64_t n = x.dim_size(0), length = x.dim_size(1), dh = x.dim_size(2) / (parts_ * heads_);
    std::vector<char*> heads_of(parts_);
    for (int p = 0; p < parts_; ++p) {
      Tensor* out;
      OP_REQUIRES_OK(context, context->allocate_output(p, TensorShape({n * heads_, length, dh}), &out));
      heads_of[p] = const_cast<char*>(out->tensor_data().data());
    }
    char* rows = const_cast<char*>(x.tensor_data().data());
    const int64_t dh_bytes = dh * tensorflow::DataTypeSize(x.dtype());
    shard(context, n, length * x.dim_size(2), [&](int64_t first, int64_t last) {
      move_heads_of(rows, heads_of, length, heads_, dh_bytes, false, first, last);
    });
  }

 private:
  int heads_, parts_;
};

class MergeHeadsOp : public OpKernel {
 public:
  explicit MergeHeadsOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("num_heads", &heads_));
  }

  void Compute(OpKernelContext* context) override {
    const int parts = context->num_inputs();
    const Tensor& first = context->input(0);
    OP_REQUIRES(context, first.dims() == 3 && first.dim_size(0) % heads_ == 0,
                absl::InvalidArgumentError("heads must be (N * num_heads, T, d_head)"));
    std::vector<char*> heads_of(parts);
    for (int p = 0; p < parts; ++p) {
      OP_REQUIRES(context, context->input(p).shape() == first.shape(),
                  absl::InvalidArgumentError("every part's heads must have one shape"));
      heads_of[p] = const_cast<char*>(context->input(p).tensor_data().data());
    }
    const int64_t n = first.dim_size(0) / heads_, length = first.dim_size(1), dh = first.dim_size(2);
    Tensor* out;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({n, length, parts * heads_ * dh}), &out));
    char* rows = const_cast<char*>(out->tensor_data().data());
    const int64_t dh_bytes = dh * tensorflow::DataTypeSize(first.dtype());
    shard(context, n, length * parts * heads_ * dh, [&](int64_t begin, int64_t end) {
      move_heads_of(rows, heads_of, length, heads_, dh_bytes, true, begin, end);
    });
  }

 private:
  int heads_;
};

// The attrs both ops' shape functions need, and their one 3-D input.
absl::Status heads_parts_input(InferenceContext* c, int* heads, int* parts, ShapeHandle* input) {
  TF_RETURN_IF_ERROR(c->GetAttr("num_heads", heads));
  TF_RETURN_IF_ERROR(c->GetAttr("parts", parts));
  return c->WithRank(c->input(0), 3, input);
}

}  // namespace

REGISTER_OP("SplitHeads")
    .Input("x: T")
    .Output("heads: parts * T")
    .Attr("num_heads: int >= 1")
    .Attr("parts: int >= 1")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn([](InferenceContext* c) {
      int heads, parts;
      ShapeHandle x;
      TF_RETURN_IF_ERROR(heads_parts_input(c, &heads, &parts, &x));
      tensorflow::shape_inference::DimensionHandle batch, dh;
      TF_RETURN_IF_ERROR(c->Multiply(c->Dim(x, 0), heads, &batch));
      TF_RETURN_IF_ERROR(c->Divide(c->Dim(x, 2), parts * heads, true, &dh));
      for (int p = 0; p < parts; ++p) c->set_output(p, c->MakeShape({batch, c->Dim(x, 1), dh}));
      return absl::OkStatus();
    });

REGISTER_OP("MergeHeads")
    .Input("heads: parts * T")
    .Output("x: T")
    .Attr("num_heads: int >= 1")
    .Attr("parts: int >= 1")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn([](InferenceContext* c) {
      int heads, parts;
      ShapeHandle first;
      TF_RETURN_IF_ERROR(heads_parts_input(c, &heads, &parts, &first));
      tensorflow::shape_inference::DimensionHandle n, width;
      TF_RETURN_IF_ERROR(c->Divide(c->Dim(first, 0), heads, true, &n));
      TF_RETURN_IF_ERROR(c->Multiply(c->Dim(first, 2), parts * heads, &width));
      c->set_output(0, c->MakeShape({n, c->Dim(first, 1), width}));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("SplitHeads").Device(DEVICE_CPU), SplitHeadsOp);
REGISTER_KERNEL_BUILDER(Name("MergeHeads").Device(DEVICE_CPU), MergeHeadsOp);
