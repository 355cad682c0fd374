#include <cstring>

#include "harness.h"

namespace fp8ext::test {

int run_all(int argc, char** argv) {
  const char* filter = argc > 1 ? argv[1] : nullptr;
  int passed = 0, failed = 0, skipped = 0;
  for (const TestCase& t : registry()) {
    if (filter && !std::strstr(t.name, filter)) continue;
    try {
      t.fn();
      ++passed;
      std::printf("[ PASS ] %s\n", t.name);
    } catch (const Skipped& s) {
      ++skipped;
      std::printf("[ SKIP ] %s: %s\n", t.name, s.what());
    } catch (const std::exception& e) {
      ++failed;
      std::printf("[ FAIL ] %s: %s\n", t.name, e.what());
    }
  }
  std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  if (failed > 0) return 1;
  if (passed == 0 && skipped > 0) return 77;
  return 0;
}

}  // namespace fp8ext::test

int main(int argc, char** argv) { return fp8ext::test::run_all(argc, argv); }
