// cuda::copy_zero_padded (how the GEMM ops pad an operand they cannot take as
// it is, and drop D's padded columns) against a CPU copy: every access width
// (1 to 16 bytes, chosen by the addresses and strides), rows and columns
// added or dropped, a repeated source row (stride 0), and the bytes between
// dst's rows left alone. Skips (exit 77) without a GPU.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "fp8ext/padded_copy.h"
#include "harness.h"

using namespace fp8ext;
using test::DeviceBuffer;

namespace {

constexpr uint8_t kUntouched = 0xA5;  // dst's bytes past dst_cols in each row stride

struct Case {
  int64_t src_rows, src_cols, src_stride, src_offset;
  int64_t dst_rows, dst_cols, dst_stride, dst_offset;
};

std::string describe(const Case& c) {
  return "src " + std::to_string(c.src_rows) + "x" + std::to_string(c.src_cols) + " stride " +
         std::to_string(c.src_stride) + " +" + std::to_string(c.src_offset) + ", dst " + std::to_string(c.dst_rows) +
         "x" + std::to_string(c.dst_cols) + " stride " + std::to_string(c.dst_stride) + " +" +
         std::to_string(c.dst_offset);
}

// Runs one case on the GPU and compares every byte of dst's buffer with the CPU's.
void check(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  // src ends at its last byte (memcheck would see a read past it); dst keeps one spare byte to check.
  const int64_t src_bytes = c.src_offset + (c.src_rows > 0 ? (c.src_rows - 1) * c.src_stride + c.src_cols : 0);
  const int64_t dst_bytes = c.dst_offset + c.dst_rows * c.dst_stride + 1;
  std::vector<uint8_t> src(src_bytes), want(dst_bytes, kUntouched);
  for (auto& b : src) b = static_cast<uint8_t>(rng() % 255 + 1);  // no zero codes: a missed byte shows
  for (int64_t r = 0; r < c.dst_rows; ++r)
    for (int64_t col = 0; col < c.dst_cols; ++col)
      want[c.dst_offset + r * c.dst_stride + col] =
          r < c.src_rows && col < c.src_cols ? src[c.src_offset + r * c.src_stride + col] : uint8_t{0};
  DeviceBuffer<uint8_t> d_src(src.size()), d_dst(want.size());
  d_src.upload(src);
  test::require_cuda(cudaMemset(d_dst.ptr, kUntouched, want.size()), "memset");
  CUDA_OK(cuda::copy_zero_padded(d_src.ptr + c.src_offset, c.src_rows, c.src_cols, c.src_stride,
                                 d_dst.ptr + c.dst_offset, c.dst_rows, c.dst_cols, c.dst_stride, nullptr));
  test::require_cuda(cudaDeviceSynchronize(), "copy_zero_padded");
  const std::vector<uint8_t> got = d_dst.download();
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      EXPECT_EQ_CTX(int(got[i]), int(want[i]), describe(c) + ": byte " + std::to_string(i));
      return;
    }
}

}  // namespace

FP8EXT_TEST(pads_operands_at_every_access_width) {
  test::require_gpu();
  // K = 4100 (4-byte loads), 1710 (2), 33 (1), 4104 (8), 4096 with zero rows
  // added (16); a source that starts 1, 2, 4, 8 bytes past 16; M = 1; long
  // rows; a weight-sized copy that takes the grid more than one pass.
  const Case cases[] = {
      {300, 4100, 4100, 0, 304, 4112, 4112, 0}, {7, 1710, 1710, 0, 8, 1712, 1712, 0},
      {33, 33, 33, 0, 40, 48, 48, 0},           {5, 4104, 4104, 0, 5, 4112, 4112, 0},
      {257, 4096, 4096, 0, 264, 4096, 4096, 0}, {3, 64, 80, 1, 3, 64, 64, 0},
      {3, 64, 80, 2, 3, 64, 64, 0},             {3, 64, 80, 4, 4, 64, 64, 0},
      {3, 64, 80, 8, 4, 64, 64, 0},             {1, 4100, 4100, 0, 1, 4112, 4112, 0},
      {2, 8216, 8216, 0, 2, 8224, 8224, 0},     {0, 16, 16, 0, 4, 16, 16, 0},
      {8192, 4100, 4100, 0, 8200, 4112, 4112, 0},  // more chunks than one pass of the grid
  };
  uint32_t seed = 1;
  for (const Case& c : cases) check(c, seed++);
}

FP8EXT_TEST(drops_padded_columns_of_d) {
  test::require_gpu();
  // bf16 D [M, N16] -> [M, N] for odd N (2-byte pieces), N = 4 mod 8 (8),
  // fp32 N = 2 mod 4 (8) and odd (4); dst rows in a wider buffer (a stride
  // past dst_cols) must keep the bytes between them.
  const Case cases[] = {
      {1000, 2 * 4096, 2 * 4096, 0, 1000, 2 * 4095, 2 * 4095, 0}, {17, 2 * 1288, 2 * 1288, 0, 17, 2 * 1284, 2 * 1284, 0},
      {9, 4 * 260, 4 * 260, 0, 9, 4 * 258, 4 * 258, 0},           {9, 4 * 260, 4 * 260, 0, 9, 4 * 257, 4 * 257, 0},
      {6, 2 * 136, 2 * 136, 0, 6, 2 * 129, 2 * 136, 0},
      // dst rows starting past 16 (offsets, odd strides): narrower stores.
      {5, 64, 64, 0, 5, 64, 65, 3},                               {5, 100, 112, 0, 6, 100, 102, 2},
      {4, 48, 48, 0, 4, 48, 52, 4},                               {3, 40, 40, 0, 3, 40, 40, 8},
  };
  uint32_t seed = 100;
  for (const Case& c : cases) check(c, seed++);
}

FP8EXT_TEST(repeats_a_row_of_stride_zero) {
  test::require_gpu();
  check({50, 100, 0, 0, 64, 112, 112, 0}, 7);  // an expanded [1, K] operand
}

FP8EXT_TEST(refuses_bad_sizes) {
  // Checked before any launch: runs without a GPU too.
  alignas(16) static uint8_t buf[256];
  EXPECT_EQ(int(cuda::copy_zero_padded(buf, -1, 4, 4, buf + 128, 1, 4, 4, nullptr)), int(cudaErrorInvalidValue));
  EXPECT_EQ(int(cuda::copy_zero_padded(buf, 1, 4, -4, buf + 128, 1, 4, 4, nullptr)), int(cudaErrorInvalidValue));
  EXPECT_EQ(int(cuda::copy_zero_padded(buf, 1, 4, 4, buf + 128, 2, 8, 4, nullptr)), int(cudaErrorInvalidValue));
  EXPECT_EQ(int(cuda::copy_zero_padded(nullptr, 1, 4, 4, buf + 128, 1, 4, 4, nullptr)), int(cudaErrorInvalidValue));
  EXPECT_EQ(int(cuda::copy_zero_padded(buf, 1, 4, 4, nullptr, 1, 4, 4, nullptr)), int(cudaErrorInvalidValue));
  EXPECT_EQ(int(cuda::copy_zero_padded(buf, 1, 4, 4, nullptr, 0, 4, 4, nullptr)), int(cudaSuccess));  // nothing to write
}
