// The process-wide stop request (core/stop_request.h): the first signal is kept, later ones do
// not replace it, clearing forgets it (issue 11 case 3).
#include <gtest/gtest.h>

#include <csignal>

#include "core/stop_request.h"

TEST(StopRequest, Issue11Case3TheFirstRequestIsKept) {
  mt::clear_stop_request();
  EXPECT_EQ(mt::stop_signal(), 0);
  mt::request_stop(SIGTERM);
  mt::request_stop(SIGINT);
  EXPECT_EQ(mt::stop_signal(), SIGTERM);
  mt::clear_stop_request();
  EXPECT_EQ(mt::stop_signal(), 0);
}
