// The KV-cache append and rotary kernels of the sm90 family's kvcache kernel
// (its key splits combine in a cluster: no combine kernel).
#include "attention/kvcache_aux.cuh"

namespace samattn::attention {
SAMATTN_INSTANTIATE_KVCACHE_APPEND(Family::sm90)
}  // namespace samattn::attention
