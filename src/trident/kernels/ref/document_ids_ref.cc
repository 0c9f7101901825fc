// Reference document ids and positions: the definition in document_ids.h read literally, each
// token counting the end-of-document tokens before it (quadratic in T, one thread).
#include "trident/kernels/document_ids.h"

namespace trident::kernels::ref {

void document_ids(const DocumentIdsArgs& a) {
  for (std::int64_t b = 0; b < a.batch; ++b) {
    const std::int32_t* tokens = a.tokens + b * a.seq_len;
    for (std::int64_t t = 0; t < a.seq_len; ++t) {
      std::int32_t doc = 0;
      std::int64_t first = 0;  // the first position of t's document
      for (std::int64_t s = 0; s < t; ++s) {
        if (tokens[s] == a.eod_token) {
          ++doc;
          first = s + 1;
        }
      }
      a.docs[b * a.seq_len + t] = doc;
      a.positions[b * a.seq_len + t] = static_cast<std::int32_t>(t - first);
    }
  }
}

}  // namespace trident::kernels::ref
