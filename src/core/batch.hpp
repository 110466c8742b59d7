// A batch of keys (idem_once_many): in which order its keys are taken, and which
// position decides a key that appears more than once. Pure C++: the glue gives the
// keys' stored bytes and gets positions back.
#pragma once

#include <string_view>

namespace idempotency {

// Fills `order` with the position of each distinct key's first appearance, sorted by
// the keys' stored bytes (shorter first among equal prefixes), and `first[i]` with the
// position of the first appearance of keys[i] (i itself for a first appearance).
// Returns the number of distinct keys (the used length of `order`). Every batch takes
// the keys it shares with another in the same order, so two batches never wait for
// each other in a cycle through their own keys; a repeated key is decided once, at its
// first position, and is false at the others, as if the batch ran one key at a time
// in array order. `order` and `first` have room for `count`; allocates nothing.
int order_batch(const std::string_view* keys, int count, int* order, int* first) noexcept;

}  // namespace idempotency
