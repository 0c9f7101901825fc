// CPU document ids and positions (document_ids.h): OpenMP over the samples, one scan each.
#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

void document_ids(const ExecContext& ctx, const DocumentIdsArgs& a) {
  const std::int64_t T = a.seq_len;
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t b = 0; b < a.batch; ++b) {
    const std::int32_t* tokens = a.tokens + b * T;
    std::int32_t* positions = a.positions + b * T;
    std::int32_t* docs = a.docs + b * T;
    std::int32_t doc = 0, start = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      positions[t] = static_cast<std::int32_t>(t) - start;
      docs[t] = doc;
      if (tokens[t] == a.eod_token) {  // the next token starts a document
        ++doc;
        start = static_cast<std::int32_t>(t + 1);
      }
    }
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
