#include "tools/room_clock.h"

#include "gtest/gtest.h"

namespace stensor {
namespace {

// Two copies out of 4 units each, done at 10 and 20: room beside them is
// there at once, after the first, or after both, as the slack allows.
TEST(RoomClockTest, WaitsForAsManyCopiesOutAsTheSlackCannotHold) {
  RoomClock clock;
  clock.Freed(20, 4);
  clock.Freed(10, 4);  // out of order: kept by time
  EXPECT_EQ(clock.ReadyFor(8, 0), 0);
  EXPECT_EQ(clock.ReadyFor(5, 0), 10);
  EXPECT_EQ(clock.ReadyFor(0, 0), 20);
  EXPECT_EQ(clock.ReadyFor(-3, 0), 20);  // overdrawn: after every copy
  EXPECT_EQ(clock.ReadyFor(0, 15), 20);  // the first is done by then
  EXPECT_EQ(clock.ReadyFor(0, 25), 25);
  clock.Freed(30, 0);  // nothing held
  EXPECT_EQ(clock.ReadyFor(0, 26), 26);
}

}  // namespace
}  // namespace stensor
