// The reference kernels written once over the storage type T: ref.h's float entry points call the
// T = float instances, and tests/kernels runs the T = double instances for finite-difference
// gradient checks, so the checked formulas are the very ones the fast kernels are compared with.
// Arithmetic is in double for both. Shapes, aliasing and =/+= rules are those of the public
// headers (matmul.h, layernorm.h, elementwise.h, attention.h, cross_entropy.h).
#pragma once

#include <cstdint>

namespace trident::kernels::ref::generic {

template <class T>
struct LinearForward {
  T* out = nullptr;           // (rows, out_features)  =
  const T* in = nullptr;      // (rows, in_features)
  const T* weight = nullptr;  // (out_features, in_features)
  const T* bias = nullptr;    // (out_features) or null
  std::int64_t rows = 0, in_features = 0, out_features = 0;
};
template <class T>
void linear_forward(const LinearForward<T>& a);

template <class T>
struct LinearBackward {
  T* d_in = nullptr;          // (rows, in_features)  =, may be null
  T* d_weight = nullptr;      // (out_features, in_features)  +=
  T* d_bias = nullptr;        // (out_features)  +=, may be null
  const T* d_out = nullptr;   // (rows, out_features)
  const T* in = nullptr;      // (rows, in_features)
  const T* weight = nullptr;  // (out_features, in_features)
  std::int64_t rows = 0, in_features = 0, out_features = 0;
};
template <class T>
void linear_backward(const LinearBackward<T>& a);

template <class T>
struct LayerNormForward {
  T* out = nullptr;           // (rows, cols)  =
  T* mean = nullptr;          // (rows)  =
  T* rstd = nullptr;          // (rows)  =
  const T* in = nullptr;      // (rows, cols)
  const T* weight = nullptr;  // (cols)
  const T* bias = nullptr;    // (cols)
  std::int64_t rows = 0, cols = 0;
  double eps = 1e-5;
};
template <class T>
void layernorm_forward(const LayerNormForward<T>& a);

template <class T>
struct LayerNormBackward {
  T* d_in = nullptr;          // (rows, cols)  +=
  T* d_weight = nullptr;      // (cols)  +=
  T* d_bias = nullptr;        // (cols)  +=
  const T* d_out = nullptr;   // (rows, cols)
  const T* in = nullptr;      // (rows, cols)
  const T* weight = nullptr;  // (cols)
  const T* mean = nullptr;    // (rows)
  const T* rstd = nullptr;    // (rows)
  std::int64_t rows = 0, cols = 0;
};
template <class T>
void layernorm_backward(const LayerNormBackward<T>& a);

template <class T>
void gelu_forward(T* out, const T* in, std::int64_t n);
template <class T>
void gelu_backward(T* d_in, const T* d_out, const T* in, std::int64_t n);

template <class T>
struct AttentionForward {
  T* out = nullptr;        // (B, T, C)  =
  T* probs = nullptr;      // (B, NH, T, T)  =, 0 above the diagonal
  const T* qkv = nullptr;  // (B, T, NH, 3, HS)
  std::int64_t batch = 0, seq_len = 0, num_heads = 0, head_dim = 0;
  const std::int32_t* doc = nullptr;  // (B, T) document ids, or null
};
template <class T>
void attention_forward(const AttentionForward<T>& a);

template <class T>
struct AttentionBackward {
  T* d_qkv = nullptr;        // (B, T, NH, 3, HS)  =
  T* d_probs = nullptr;      // (B, NH, T, T)  scratch
  const T* d_out = nullptr;  // (B, T, C)
  const T* qkv = nullptr;    // (B, T, NH, 3, HS)
  const T* probs = nullptr;  // (B, NH, T, T)
  std::int64_t batch = 0, seq_len = 0, num_heads = 0, head_dim = 0;
};
template <class T>
void attention_backward(const AttentionBackward<T>& a);

template <class T>
struct CrossEntropy {
  T* losses = nullptr;                    // (rows)  =
  T* d_logits = nullptr;                  // (rows, vocab_padded)  =, may alias logits, or null
  const T* logits = nullptr;              // (rows, vocab_padded)
  const std::int32_t* targets = nullptr;  // (rows), negative = ignored
  double d_scale = 1.0;
  std::int64_t rows = 0, vocab = 0, vocab_padded = 0;
};
template <class T>
void cross_entropy_forward_backward(const CrossEntropy<T>& a);

// RMSNorm, SwiGLU and rotary QKV (rmsnorm.h, swiglu.h, rope.h) over the storage type T.
template <class T>
struct RmsNormForward {
  T* out = nullptr;
  T* rstd = nullptr;
  const T* in = nullptr;
  const T* weight = nullptr;
  std::int64_t rows = 0, cols = 0;
  double eps = 1e-5;
};
template <class T>
void rmsnorm_forward(const RmsNormForward<T>& a);
template <class T>
struct RmsNormBackward {
  T* d_in = nullptr;      // +=
  T* d_weight = nullptr;  // +=
  const T* d_out = nullptr;
  const T* in = nullptr;
  const T* weight = nullptr;
  const T* rstd = nullptr;
  std::int64_t rows = 0, cols = 0;
};
template <class T>
void rmsnorm_backward(const RmsNormBackward<T>& a);
template <class T>
void swiglu_forward(T* out, const T* in, std::int64_t rows, std::int64_t cols);
template <class T>
void swiglu_backward(T* d_in, const T* d_out, const T* in, std::int64_t rows, std::int64_t cols);

}  // namespace trident::kernels::ref::generic
