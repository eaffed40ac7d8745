#include "models/layers/work.h"

namespace strata {

PartWork& PartWork::operator+=(const PartWork& o) {
  gemms.insert(gemms.end(), o.gemms.begin(), o.gemms.end());
  attention_flops += o.attention_flops;
  if (o.attention.heads > 0) attention = o.attention;
  logits += o.logits;
  elementwise_fwd += o.elementwise_fwd;
  elementwise_bwd += o.elementwise_bwd;
  f32_fwd += o.f32_fwd;
  f32_bwd += o.f32_bwd;
  collectives_fwd.insert(collectives_fwd.end(), o.collectives_fwd.begin(), o.collectives_fwd.end());
  collectives_bwd.insert(collectives_bwd.end(), o.collectives_bwd.begin(), o.collectives_bwd.end());
  return *this;
}

}  // namespace strata
