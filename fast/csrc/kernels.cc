// Every kernel in one translation unit: TensorFlow's headers, most of the build's time, are parsed once for all of
// them. The kernels keep their own names in their own anonymous namespaces; REGISTER_OP and REGISTER_KERNEL_BUILDER
// number their registrations themselves.
#define EIGEN_USE_THREADS  // adam.cc: training_op_helpers.h copies a variable with Eigen on the CPU's thread pool

#include "accumulate.cc"
#include "adam.cc"
#include "attention_softmax_dropout.cc"
#include "embedding_dropout.cc"
#include "heads.cc"
#include "residual_dropout_ln.cc"
#include "scatter_add_rows.cc"
#include "smoothed_cross_entropy.cc"
