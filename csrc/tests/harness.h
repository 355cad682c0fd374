// A dependency-free test harness (no GoogleTest: the GPU machine has no network
// and no package manager). Each test binary is one ctest test; it prints
// "N passed, M failed, K skipped" and exits 1 on failure, 77 if every test skipped.
#pragma once

#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace fp8ext::test {

struct TestCase {
  const char* name;
  std::function<void()> fn;
};

inline std::vector<TestCase>& registry() {
  static std::vector<TestCase> tests;
  return tests;
}

struct Registrar {
  Registrar(const char* name, std::function<void()> fn) { registry().push_back({name, std::move(fn)}); }
};

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct Skipped : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void skip(const std::string& reason) { throw Skipped(reason); }

template <typename A, typename B>
void expect_eq(const A& a, const B& b, const char* expr_a, const char* expr_b, const char* file,
               int line, const std::string& context = "") {
  if (!(a == b)) {
    std::ostringstream os;
    os << file << ":" << line << ": expected " << expr_a << " == " << expr_b << ", got " << +a
       << " vs " << +b << (context.empty() ? "" : " [") << context << (context.empty() ? "" : "]");
    throw Failure(os.str());
  }
}

int run_all(int argc, char** argv);

}  // namespace fp8ext::test

#define FP8EXT_TEST(name)                                                          \
  static void name();                                                              \
  static ::fp8ext::test::Registrar name##_registrar(#name, name);                  \
  static void name()

#define EXPECT_EQ(a, b) ::fp8ext::test::expect_eq((a), (b), #a, #b, __FILE__, __LINE__)
#define EXPECT_EQ_CTX(a, b, ctx) ::fp8ext::test::expect_eq((a), (b), #a, #b, __FILE__, __LINE__, (ctx))
#define EXPECT_TRUE(cond)                                                          \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::ostringstream os_;                                                      \
      os_ << __FILE__ << ":" << __LINE__ << ": expected " #cond;                   \
      throw ::fp8ext::test::Failure(os_.str());                                    \
    }                                                                              \
  } while (0)
