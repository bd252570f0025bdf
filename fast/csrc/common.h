// What the toolkit's kernels share: the keep decisions of their dropout, drawn again from a step's seed instead of
// stored; an exp that vectorizes; the conversion to 16-bit floats; the split of rows over the intra-op threads.
//
// Entry i of a tensor (row-major) is kept when the 16-bit lane (i % 4) of mix(key + (i / 4 + 1) * GOLDEN) is
// >= threshold (mix: SplitMix64's finalizer; key: the two int32 seed words; threshold: round(rate * 2^16) - 2^15).
// kernels.keep_decisions computes the same with numpy for the tests.
#ifndef NMT_CSRC_COMMON_H_
#define NMT_CSRC_COMMON_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace nmt {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

constexpr uint64_t GOLDEN = 0x9E3779B97F4A7C15ULL;
constexpr int64_t BLOCK_ROWS = 64;  // rows per task of the threads, and per partial sum where a kernel reduces over rows

inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The scale of each of the entries [start, start + d) of the flattened tensor (a row, or a block of rows):
// `scale` where kept, else 0. words: scratch for their random words, d / 4 + 2 of them.
inline void keep_scales(uint64_t key, int64_t start, int64_t d, int threshold, float scale, uint64_t* words,
                        float* out) {
  const int64_t first = start >> 2, last = (start + d - 1) >> 2;
  for (int64_t w = first; w <= last; ++w) words[w - first] = mix(key + (static_cast<uint64_t>(w) + 1) * GOLDEN);
  // lane k of a word is its k-th int16 in memory on a little-endian CPU (read through a type that may alias it)
  typedef int16_t __attribute__((may_alias)) lane_t;
  const lane_t* draws = reinterpret_cast<const lane_t*>(words) + (start - 4 * first);
  for (int64_t j = 0; j < d; ++j) out[j] = draws[j] >= threshold ? scale : 0.0f;
}

inline uint64_t seed_key(const Tensor& seed) {
  auto words = seed.flat<int32_t>();
  return (static_cast<uint64_t>(static_cast<uint32_t>(words(0))) << 32) | static_cast<uint32_t>(words(1));
}

inline int keep_threshold(float rate) { return static_cast<int>(std::lround(rate * 65536.0)) - 32768; }

// exp(x) for x <= 0 in a form the compiler vectorizes: 2^n exp(r) with n = round(x / ln 2), |r| <= ln 2 / 2, and
// Cephes' degree-5 polynomial for exp(r) (about 1 ulp); 0 below -87.3, where float32's exp leaves normal numbers.
inline float exp_nonpositive(float x) {
  const float clamped = x < -87.3f ? -87.3f : x;
  const float n = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // rounded by adding 1.5 * 2^23
  const float r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return x < -87.3f ? 0.0f : e * two_n;
}

// float -> the kernel's 16- or 32-bit float type. For bfloat16, rounding to nearest even without the NaN branch of
// Eigen's conversion, so that the loops storing it vectorize (the values converted here are finite).
template <typename T>
inline T narrow(float x) {
  return static_cast<T>(x);
}
template <>
inline Eigen::bfloat16 narrow<Eigen::bfloat16>(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return Eigen::numext::bit_cast<Eigen::bfloat16>(static_cast<uint16_t>(bits >> 16));
}

// work(first, last) over ranges that cover [0, units), run by the session's intra-op threads, as many as it allows
// (Shard runs everything on the calling thread when that is one). cost: about how many cycles one unit takes.
template <typename F>
void shard(OpKernelContext* context, int64_t units, int64_t cost, F work) {
  const auto& threads = *context->device()->tensorflow_cpu_worker_threads();
  tensorflow::Shard(threads.num_threads, threads.workers, units, cost, work);
}

// Rows of a (..., d) tensor are processed BLOCK_ROWS at a time by the session's intra-op threads (shard).
template <typename F>
void for_row_blocks(OpKernelContext* context, int64_t rows, int64_t d, F body) {
  const int64_t blocks = (rows + BLOCK_ROWS - 1) / BLOCK_ROWS;
  shard(context, blocks, BLOCK_ROWS * d * 20, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) body(b, b * BLOCK_ROWS, std::min(rows, (b + 1) * BLOCK_ROWS));
  });
}

}  // namespace nmt

#endif  // NMT_CSRC_COMMON_H_
