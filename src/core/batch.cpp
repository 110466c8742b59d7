#include "core/batch.hpp"

#include <algorithm>

namespace idempotency {

int order_batch(const std::string_view* keys, int count, int* order, int* first) noexcept {
  for (int i = 0; i < count; i++) order[i] = i;
  // Ties by position: the first appearance of a key comes first among its copies.
  std::sort(order, order + count, [keys](int a, int b) {
    int c = keys[a].compare(keys[b]);
    return c != 0 ? c < 0 : a < b;
  });
  int distinct = 0;
  for (int i = 0; i < count; i++) {
    int position = order[i];
    if (distinct > 0 && keys[order[distinct - 1]] == keys[position]) {
      first[position] = order[distinct - 1];
      continue;
    }
    first[position] = position;
    order[distinct++] = position;
  }
  return distinct;
}

}  // namespace idempotency
