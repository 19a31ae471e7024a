#include "core/error.h"

#include <gtest/gtest.h>

#include <string>

namespace tandem {
namespace {

TEST(ErrorTest, CheckEqSaysWhatFailedWithBothValuesAndWhere) {
  try {
    const int a = 3, b = 4;
    TANDEM_CHECK_EQ(a, b);
    FAIL();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a == b (3 vs 4) at "), std::string::npos) << what;
    EXPECT_NE(what.find("error_test.cpp:"), std::string::npos) << what;
  }
}

TEST(ErrorTest, CheckMsgThrowsTheRequestedType) {
  EXPECT_THROW(TANDEM_CHECK_MSG(false, FormatError, "bad " << 7), FormatError);
  try {
    TANDEM_CHECK_MSG(1 > 2, Timeout,
                     "peer "
                         << "tcp://x"
                         << " silent");
  } catch (const Timeout& e) {
    EXPECT_STREQ(e.what(), "peer tcp://x silent");
  }
  EXPECT_NO_THROW(TANDEM_CHECK_LT(1, 2));
  EXPECT_THROW(TANDEM_CHECK_GE(1, 2), Error);
}

TEST(ErrorTest, AllErrorsShareOneRoot) {
  EXPECT_THROW(throw InvalidArgument("x"), Error);
  EXPECT_THROW(throw FormatError("x"), Error);
  EXPECT_THROW(throw IoError("x"), Error);
  EXPECT_THROW(throw Timeout("x"), Error);
  EXPECT_THROW(throw DeviceError("x"), Error);
  EXPECT_THROW(throw Unsupported("x"), std::runtime_error);
}

}  // namespace
}  // namespace tandem
