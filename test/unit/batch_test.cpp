// The order of a batch's keys: sorted by bytes, each distinct key once, at its first
// position; repeats point at it.
#include <gtest/gtest.h>

#include <string_view>
#include <vector>

#include "core/batch.hpp"

namespace idempotency {
namespace {

struct Ordered {
  std::vector<int> order;
  std::vector<int> first;
};

Ordered order_of(const std::vector<std::string_view>& keys) {
  Ordered result{std::vector<int>(keys.size()), std::vector<int>(keys.size())};
  int n = order_batch(keys.data(), static_cast<int>(keys.size()), result.order.data(),
                      result.first.data());
  result.order.resize(n);
  return result;
}

TEST(OrderBatch, EmptyBatch) {
  Ordered r = order_of({});
  EXPECT_TRUE(r.order.empty());
}

TEST(OrderBatch, SortsByBytes) {
  Ordered r = order_of({"c", "a", "b"});
  EXPECT_EQ(r.order, (std::vector<int>{1, 2, 0}));
  EXPECT_EQ(r.first, (std::vector<int>{0, 1, 2}));
}

TEST(OrderBatch, ShorterFirstAmongEqualPrefixes) {
  Ordered r = order_of({"ab", "a", "abc"});
  EXPECT_EQ(r.order, (std::vector<int>{1, 0, 2}));
}

TEST(OrderBatch, RepeatsDecidedAtTheirFirstPosition) {
  Ordered r = order_of({"b", "a", "b", "a", "b"});
  EXPECT_EQ(r.order, (std::vector<int>{1, 0}));
  EXPECT_EQ(r.first, (std::vector<int>{0, 1, 0, 1, 0}));
}

TEST(OrderBatch, BytesNotCharacters) {
  // A stored UUID starts with a zero byte: compared as bytes, it sorts first.
  std::string_view uuid("\0\x12\x34", 3);
  Ordered r = order_of({"a", uuid, std::string_view("\0\x12", 2)});
  EXPECT_EQ(r.order, (std::vector<int>{2, 1, 0}));
}

TEST(OrderBatch, TwoBatchesShareAnOrder) {
  // Whatever the order in each batch, the shared keys come in the same relative order.
  Ordered one = order_of({"k3", "x", "k1", "k2"});
  Ordered two = order_of({"k2", "k1", "y", "k3"});
  std::vector<std::string_view> keys_one{"k3", "x", "k1", "k2"};
  std::vector<std::string_view> keys_two{"k2", "k1", "y", "k3"};
  std::vector<std::string_view> shared_one, shared_two;
  for (int p : one.order)
    if (keys_one[p] != "x") shared_one.push_back(keys_one[p]);
  for (int p : two.order)
    if (keys_two[p] != "y") shared_two.push_back(keys_two[p]);
  EXPECT_EQ(shared_one, shared_two);
}

}  // namespace
}  // namespace idempotency
