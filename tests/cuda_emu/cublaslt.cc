// cuemu's cuBLASLt stand-in: see cublasLt.h. The product itself is oneDNN's sgemm on FP32 copies of
// the operands (BF16 widens exactly), i.e. FP32 accumulation as CUBLAS_COMPUTE_32F; its summation
// order is not cuBLASLt's, so tests compare it by tolerance, never bitwise.
#include "cublasLt.h"

#include <oneapi/dnnl/dnnl.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "internal.h"

struct cublasLtContext {
  int device = 0;
};
struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;
  cublasLtPointerMode_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
};
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type = CUDA_R_32F;
  std::uint64_t rows = 0, cols = 0;
  std::int64_t ld = 0;
  cublasLtOrder_t order = CUBLASLT_ORDER_COL;
  int batch = 1;
  std::int64_t batch_stride = 0;
};
struct cublasLtMatmulPreferenceOpaque_t {
  std::uint64_t max_workspace = 0;
  std::uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's defaults
};

namespace {

using namespace cuemu::detail;

constexpr std::uint64_t kAlgoMagic = 0x63756c74616c676full;  // "cultalgo"

thread_local std::unordered_map<int, std::string> t_status_detail;

cublasStatus_t fail(cublasStatus_t st, const std::string& message) {
  const std::string text = "cuemu cuBLASLt: " + message;
  t_status_detail[st] = text;
  if (!config().quiet) std::fprintf(stderr, "%s\n", text.c_str());
  return st;
}

const char* type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F:
      return "CUDA_R_32F";
    case CUDA_R_16BF:
      return "CUDA_R_16BF";
    case CUDA_R_16F:
      return "CUDA_R_16F";
    case CUDA_R_64F:
      return "CUDA_R_64F";
    default:
      return "an unsupported type";
  }
}

std::size_t type_bytes(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F:
      return 2;
    case CUDA_R_64F:
      return 8;
    default:
      return 0;
  }
}

float load(const void* p, cudaDataType_t t, std::int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(p)[i])
                             << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void store(void* p, cudaDataType_t t, std::int64_t i, float v) {
  if (t == CUDA_R_32F) {
    static_cast<float*>(p)[i] = v;
    return;
  }
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  std::uint16_t b;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    b = static_cast<std::uint16_t>((u >> 16) | 0x40);  // quiet NaN
  } else {
    b = static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // nearest even
  }
  static_cast<std::uint16_t*>(p)[i] = b;
}

// Element (r, c) of a layout (its order), batch b.
std::int64_t offset(const cublasLtMatrixLayoutOpaque_t& l, std::int64_t r, std::int64_t c, int b) {
  const std::int64_t in_batch = l.order == CUBLASLT_ORDER_COL ? c * l.ld + r : r * l.ld + c;
  return b * l.batch_stride + in_batch;
}

std::string layout_text(const cublasLtMatrixLayoutOpaque_t& l) {
  return std::to_string(l.rows) + "x" + std::to_string(l.cols) + " " + type_name(l.type) + " ld " +
         std::to_string(l.ld) + (l.order == CUBLASLT_ORDER_ROW ? " (row order)" : "");
}

struct Problem {
  std::int64_t m = 0, n = 0, k = 0;
};

// The layouts' agreement with the product; shared by the heuristic and the matmul.
cublasStatus_t check_layouts(const cublasLtMatmulDescOpaque_t& d,
                             const cublasLtMatrixLayoutOpaque_t& a,
                             const cublasLtMatrixLayoutOpaque_t& b,
                             const cublasLtMatrixLayoutOpaque_t& c,
                             const cublasLtMatrixLayoutOpaque_t& dd, Problem& p) {
  const bool f32 =
      a.type == CUDA_R_32F && b.type == CUDA_R_32F && c.type == CUDA_R_32F && dd.type == CUDA_R_32F;
  const bool bf16 = a.type == CUDA_R_16BF && b.type == CUDA_R_16BF &&
                    (c.type == CUDA_R_32F || c.type == CUDA_R_16BF) && c.type == dd.type;
  if (!((f32 && (d.compute == CUBLAS_COMPUTE_32F || d.compute == CUBLAS_COMPUTE_32F_FAST_TF32)) ||
        (bf16 && d.compute == CUBLAS_COMPUTE_32F)) ||
      d.scale != CUDA_R_32F) {
    return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                std::string("no supported combination of A ") + type_name(a.type) + ", B " +
                    type_name(b.type) + ", C " + type_name(c.type) + ", D " + type_name(dd.type) +
                    " and compute type " + std::to_string(d.compute) + ", scale " +
                    type_name(d.scale) +
                    " (trident uses FP32, or BF16 A/B with FP32 or BF16 C/D, "
                    "under CUBLAS_COMPUTE_32F)");
  }
  if (d.transa == CUBLAS_OP_C || d.transb == CUBLAS_OP_C) {
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_OP_C on real types: use CUBLAS_OP_T");
  }
  p.m = static_cast<std::int64_t>(dd.rows);
  p.n = static_cast<std::int64_t>(dd.cols);
  p.k = static_cast<std::int64_t>(d.transa == CUBLAS_OP_N ? a.cols : a.rows);
  const std::int64_t a_m = static_cast<std::int64_t>(d.transa == CUBLAS_OP_N ? a.rows : a.cols);
  const std::int64_t b_k = static_cast<std::int64_t>(d.transb == CUBLAS_OP_N ? b.rows : b.cols);
  const std::int64_t b_n = static_cast<std::int64_t>(d.transb == CUBLAS_OP_N ? b.cols : b.rows);
  if (a_m != p.m || b_k != p.k || b_n != p.n || c.rows != dd.rows || c.cols != dd.cols) {
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                std::string("the layouts do not form a product: op(A) from A ") + layout_text(a) +
                    (d.transa == CUBLAS_OP_T ? " transposed" : "") + ", op(B) from B " +
                    layout_text(b) + (d.transb == CUBLAS_OP_T ? " transposed" : "") + ", C " +
                    layout_text(c) + ", D " + layout_text(dd) +
                    " (need op(A) m x k, op(B) k x n, C and D m x n)");
  }
  for (const auto* l : {&a, &b, &c, &dd}) {
    const std::int64_t need =
        static_cast<std::int64_t>(l->order == CUBLASLT_ORDER_COL ? l->rows : l->cols);
    if (l->ld < std::max<std::int64_t>(1, need)) {
      return fail(CUBLAS_STATUS_INVALID_VALUE,
                  "a leading dimension below the matrix's " +
                      std::string(l->order == CUBLASLT_ORDER_COL ? "rows" : "columns") + ": " +
                      layout_text(*l));
    }
  }
  if (a.batch != b.batch || a.batch != dd.batch || c.batch != dd.batch) {
    return fail(CUBLAS_STATUS_INVALID_VALUE, "the layouts' batch counts differ");
  }
  return CUBLAS_STATUS_SUCCESS;
}

// An operand: live device memory of `device` covering the layout, aligned as the algorithm assumes.
cublasStatus_t check_operand(const char* name, const void* p, const cublasLtMatrixLayoutOpaque_t& l,
                             std::uint32_t align, int device) {
  const Lookup lk = find_allocation(p);
  if (!lk.found || (lk.a.kind != MemKind::kDevice && lk.a.kind != MemKind::kManaged) ||
      lk.a.freed) {
    return fail(
        CUBLAS_STATUS_INVALID_VALUE,
        std::string("operand ") + name + " is not live device memory: " + describe_pointer(p));
  }
  if (lk.a.kind == MemKind::kDevice && lk.a.device != device) {
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                std::string("operand ") + name + " is memory of device " +
                    std::to_string(lk.a.device) + ", the stream's is " + std::to_string(device));
  }
  const std::size_t elem = type_bytes(l.type);
  const std::int64_t last = offset(l, static_cast<std::int64_t>(l.rows) - 1,
                                   static_cast<std::int64_t>(l.cols) - 1, l.batch - 1);
  const std::uintptr_t end =
      reinterpret_cast<std::uintptr_t>(p) + static_cast<std::uintptr_t>(last + 1) * elem;
  if (end > lk.a.base + lk.a.bytes) {
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                std::string("operand ") + name + " (" + layout_text(l) + ") runs " +
                    std::to_string(end - lk.a.base - lk.a.bytes) + " bytes past its allocation (" +
                    describe_pointer(p) + ")");
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  if (addr % elem != 0 || addr % align != 0) {
    return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                std::string("operand ") + name + " at " + describe_pointer(p) + " is aligned to " +
                    std::to_string(addr & (~addr + 1)) +
                    " bytes, but the algorithm was chosen for " + std::to_string(align) +
                    "-byte alignment (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_" + name +
                    "_BYTES, 256 unless set): set the preference from the real pointers");
  }
  return CUBLAS_STATUS_SUCCESS;
}

template <class T>
cublasStatus_t set_attr(T& field, const void* buf, std::size_t size) {
  if (!buf || size != sizeof(T))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "attribute of the wrong size");
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: null handle pointer");
  *handle = new cublasLtContext{current_device()};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  static thread_local std::string text;
  text = cublasLtGetStatusName(status);
  auto it = t_status_detail.find(status);
  if (it != t_status_detail.end()) text += " [" + it->second + "]";
  return text.c_str();
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  *desc = new cublasLtMatmulDescOpaque_t;
  (*desc)->compute = compute;
  (*desc)->scale = scale;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              std::size_t size) {
  if (!desc) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "null matmul descriptor");
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      return set_attr(desc->compute, buf, size);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      return set_attr(desc->scale, buf, size);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      return set_attr(desc->pointer_mode, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return set_attr(desc->transa, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return set_attr(desc->transb, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return set_attr(desc->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return set_attr(desc->bias, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return set_attr(desc->bias_type, buf, size);
    default:
      return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "cublasLtMatmulDescSetAttribute: attribute " + std::to_string(attr) +
                      " is not emulated (add it to cuemu's stand-in with its documented meaning)");
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type,
                                          std::uint64_t rows, std::uint64_t cols, std::int64_t ld) {
  *layout = new cublasLtMatrixLayoutOpaque_t;
  (*layout)->type = type;
  (*layout)->rows = rows;
  (*layout)->cols = cols;
  (*layout)->ld = ld;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, std::size_t size) {
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
      return set_attr(layout->order, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      return set_attr(layout->batch, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return set_attr(layout->batch_stride, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
      return set_attr(layout->type, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
      return set_attr(layout->rows, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_COLS:
      return set_attr(layout->cols, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_LD:
      return set_attr(layout->ld, buf, size);
  }
  return fail(CUBLAS_STATUS_NOT_SUPPORTED, "unknown layout attribute");
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, std::size_t size) {
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return set_attr(pref->max_workspace, buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      return set_attr(pref->align[0], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      return set_attr(pref->align[1], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      return set_attr(pref->align[2], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return set_attr(pref->align[3], buf, size);
  }
  return fail(CUBLAS_STATUS_NOT_SUPPORTED, "unknown preference attribute");
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  *returned = 0;
  if (!handle || !desc || !a || !b || !c || !d || !pref) {
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulAlgoGetHeuristic: a null argument");
  }
  if (requested < 1) return fail(CUBLAS_STATUS_INVALID_VALUE, "requested < 1 algorithms");
  Problem p;
  if (const cublasStatus_t st = check_layouts(*desc, *a, *b, *c, *d, p);
      st != CUBLAS_STATUS_SUCCESS)
    return st;
  for (const std::uint32_t al : pref->align) {
    if (al == 0 || (al & (al - 1)) != 0) {
      return fail(CUBLAS_STATUS_INVALID_VALUE,
                  "a minimum alignment preference is not a power of two");
    }
  }
  cublasLtMatmulHeuristicResult_t& r = results[0];
  r = cublasLtMatmulHeuristicResult_t{};
  r.algo.data[0] = kAlgoMagic;
  for (int i = 0; i < 4; ++i) r.algo.data[1 + i] = pref->align[i];
  // A workspace of up to 1 MiB, so that the caller's workspace handling is exercised.
  r.workspaceSize =
      static_cast<std::size_t>(std::min<std::uint64_t>(pref->max_workspace, 1u << 20));
  r.algo.data[5] = r.workspaceSize;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void* alpha_p, const void* a, cublasLtMatrixLayout_t adesc,
                              const void* b, cublasLtMatrixLayout_t bdesc, const void* beta_p,
                              const void* c, cublasLtMatrixLayout_t cdesc, void* d,
                              cublasLtMatrixLayout_t ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  if (!handle) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtMatmul: null handle");
  if (!desc || !adesc || !bdesc || !cdesc || !ddesc || !alpha_p || !beta_p) {
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: a null descriptor or scalar");
  }
  if (desc->pointer_mode != CUBLASLT_POINTER_MODE_HOST) {
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "device pointer mode is not emulated");
  }
  Problem p;
  if (const cublasStatus_t st = check_layouts(*desc, *adesc, *bdesc, *cdesc, *ddesc, p);
      st != CUBLAS_STATUS_SUCCESS)
    return st;
  std::uint32_t align[4] = {256, 256, 256, 256};
  std::size_t algo_workspace = 0;
  if (algo) {
    if (algo->data[0] != kAlgoMagic) {
      return fail(CUBLAS_STATUS_INVALID_VALUE, "the algorithm was not returned by the heuristic");
    }
    for (int i = 0; i < 4; ++i) align[i] = static_cast<std::uint32_t>(algo->data[1 + i]);
    algo_workspace = static_cast<std::size_t>(algo->data[5]);
  }
  if (workspace_bytes < algo_workspace) {
    return fail(CUBLAS_STATUS_INVALID_VALUE, "the workspace (" + std::to_string(workspace_bytes) +
                                                 " bytes) is smaller than the " +
                                                 std::to_string(algo_workspace) +
                                                 " bytes the algorithm asked for");
  }
  cuemu::detail::Stream* s = resolve_stream(stream);
  if (!s) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: an invalid stream");
  if (sticky_error(s->device) != cudaSuccess)
    return fail(CUBLAS_STATUS_EXECUTION_FAILED, "the device has faulted");
  const int device = s->device;
  const float alpha = *static_cast<const float*>(alpha_p);
  const float beta = *static_cast<const float*>(beta_p);
  if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;
  if (p.k > 0) {
    if (auto st = check_operand("A", a, *adesc, align[0], device); st != CUBLAS_STATUS_SUCCESS)
      return st;
    if (auto st = check_operand("B", b, *bdesc, align[1], device); st != CUBLAS_STATUS_SUCCESS)
      return st;
  }
  if (beta != 0.0f || c == d) {
    if (auto st = check_operand("C", c, *cdesc, align[2], device); st != CUBLAS_STATUS_SUCCESS)
      return st;
  }
  if (auto st = check_operand("D", d, *ddesc, align[3], device); st != CUBLAS_STATUS_SUCCESS)
    return st;
  if (c == d &&
      (cdesc->ld != ddesc->ld || cdesc->order != ddesc->order || cdesc->type != ddesc->type)) {
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "in-place C = D needs identical C and D layouts");
  }
  if (workspace_bytes > 0) {
    const Lookup w = find_allocation(workspace);
    if (!w.found || w.a.kind != MemKind::kDevice || w.a.freed ||
        reinterpret_cast<std::uintptr_t>(workspace) + workspace_bytes > w.a.base + w.a.bytes) {
      return fail(CUBLAS_STATUS_INVALID_VALUE,
                  "the workspace is not " + std::to_string(workspace_bytes) +
                      " bytes of live device memory: " + describe_pointer(workspace));
    }
  }
  const cublasLtEpilogue_t epi = desc->epilogue;
  const bool bias_epi = epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_RELU_BIAS ||
                        epi == CUBLASLT_EPILOGUE_GELU_BIAS;
  const bool bgrad = epi == CUBLASLT_EPILOGUE_BGRADA || epi == CUBLASLT_EPILOGUE_BGRADB;
  if (epi != CUBLASLT_EPILOGUE_DEFAULT && epi != CUBLASLT_EPILOGUE_RELU &&
      epi != CUBLASLT_EPILOGUE_GELU && !bias_epi && !bgrad) {
    return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                "epilogue " + std::to_string(epi) + " is not emulated");
  }
  if ((bias_epi || bgrad) && desc->bias == nullptr) {
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                "a bias epilogue without CUBLASLT_MATMUL_DESC_BIAS_POINTER");
  }
  const cublasLtMatmulDescOpaque_t dcopy = *desc;
  const cublasLtMatrixLayoutOpaque_t la = *adesc, lb = *bdesc, lc = *cdesc, ld = *ddesc;
  enqueue(s, "cublasLtMatmul", [=] {
    for (const void* q : {a, b, c, static_cast<const void*>(d)}) {
      const Lookup l = find_allocation(q);
      if (q && l.found && l.a.freed) {
        fault(device, cudaErrorIllegalAddress,
              "cublasLtMatmul ran after an operand was freed: " + describe_pointer(q));
        return;
      }
    }
    const std::int64_t m = p.m, n = p.n, k = p.k;
    std::vector<float> opa(static_cast<std::size_t>(m * std::max<std::int64_t>(k, 1)));
    std::vector<float> opb(static_cast<std::size_t>(std::max<std::int64_t>(k, 1) * n));
    std::vector<float> prod(static_cast<std::size_t>(m * n));
    for (int batch = 0; batch < ld.batch; ++batch) {
      // Row-major op(A) (m x k) and op(B) (k x n), then prod = op(A) op(B) in FP32.
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < k; ++j) {
          const std::int64_t o =
              dcopy.transa == CUBLAS_OP_N ? offset(la, i, j, batch) : offset(la, j, i, batch);
          opa[static_cast<std::size_t>(i * k + j)] = load(a, la.type, o);
        }
      }
      for (std::int64_t i = 0; i < k; ++i) {
        for (std::int64_t j = 0; j < n; ++j) {
          const std::int64_t o =
              dcopy.transb == CUBLAS_OP_N ? offset(lb, i, j, batch) : offset(lb, j, i, batch);
          opb[static_cast<std::size_t>(i * n + j)] = load(b, lb.type, o);
        }
      }
      if (k > 0) {
        dnnl_sgemm('N', 'N', m, n, k, 1.0f, opa.data(), k, opb.data(), n, 0.0f, prod.data(), n);
      } else {
        std::fill(prod.begin(), prod.end(), 0.0f);
      }
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < n; ++j) {
          float v = alpha * prod[static_cast<std::size_t>(i * n + j)];
          if (beta != 0.0f) v += beta * load(c, lc.type, offset(lc, i, j, batch));
          if (bias_epi) v += load(dcopy.bias, dcopy.bias_type, i);
          if (epi == CUBLASLT_EPILOGUE_RELU || epi == CUBLASLT_EPILOGUE_RELU_BIAS)
            v = v > 0.0f ? v : 0.0f;
          if (epi == CUBLASLT_EPILOGUE_GELU || epi == CUBLASLT_EPILOGUE_GELU_BIAS) v = gelu_tanh(v);
          store(d, ld.type, offset(ld, i, j, batch), v);
        }
      }
      if (bgrad) {
        // BGRADA: the bias gradient from op(A), one per row of D; BGRADB: from op(B), one per
        // column of D.
        auto* out = static_cast<float*>(const_cast<void*>(dcopy.bias));
        if (epi == CUBLASLT_EPILOGUE_BGRADA) {
          for (std::int64_t i = 0; i < m; ++i) {
            double sum = 0.0;
            for (std::int64_t j = 0; j < k; ++j) sum += opa[static_cast<std::size_t>(i * k + j)];
            out[i] = static_cast<float>(sum);
          }
        } else {
          for (std::int64_t j = 0; j < n; ++j) {
            double sum = 0.0;
            for (std::int64_t i = 0; i < k; ++i) sum += opb[static_cast<std::size_t>(i * n + j)];
            out[j] = static_cast<float>(sum);
          }
        }
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
