#include "core/swap/tensor_bounds.h"

#include "gtest/gtest.h"

namespace stensor {
namespace {

TEST(TensorBoundsTest, APointerReachesToTheNextBoundSeen) {
  TensorBounds bounds;
  EXPECT_EQ(bounds.EndFrom(0, 100), 100u);  // nothing seen: the whole allocation
  bounds.Note(40);
  bounds.Note(10);
  bounds.Note(40);  // once
  EXPECT_EQ(bounds.size(), 2u);
  EXPECT_EQ(bounds.EndFrom(0, 100), 10u);
  EXPECT_EQ(bounds.EndFrom(10, 100), 40u);  // its own start is not its end
  EXPECT_EQ(bounds.EndFrom(25, 100), 40u);  // an interior pointer
  EXPECT_EQ(bounds.EndFrom(40, 100), 100u);
  EXPECT_EQ(bounds.EndFrom(0, 5), 5u);  // never past the allocation
}

TEST(TensorBoundsTest, PastTheLimitNewBoundsAreIgnored) {
  TensorBounds bounds;
  for (uint64_t i = 1; i <= TensorBounds::kMaxBounds + 10; ++i) bounds.Note(i * 8);
  EXPECT_EQ(bounds.size(), TensorBounds::kMaxBounds);
  // Ignored bounds make guesses longer, never shorter.
  EXPECT_EQ(bounds.EndFrom(TensorBounds::kMaxBounds * 8, 1 << 20), uint64_t{1} << 20);
}

}  // namespace
}  // namespace stensor
