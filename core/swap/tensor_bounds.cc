#include "core/swap/tensor_bounds.h"

#include <algorithm>

namespace stensor {

void TensorBounds::Note(uint64_t offset) {
  auto it = std::lower_bound(bounds_.begin(), bounds_.end(), offset);
  if (it != bounds_.end() && *it == offset) return;
  if (bounds_.size() >= kMaxBounds) return;
  bounds_.insert(it, offset);
}

uint64_t TensorBounds::EndFrom(uint64_t offset, uint64_t size) const {
  auto it = std::upper_bound(bounds_.begin(), bounds_.end(), offset);
  return it == bounds_.end() ? size : std::min(*it, size);
}

}  // namespace stensor
