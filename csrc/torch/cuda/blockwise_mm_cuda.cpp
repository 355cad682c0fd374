// The CUDA scaled_mm_blockwise op: argument checks, the padded path for shapes
// the kernels cannot take directly, and the call into the CUTLASS block-wise
// kernels (csrc/gemm/blockwise_mm_*). Built only with the sm_90a GEMMs.
#ifdef FP8EXT_WITH_SM90_GEMM

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <utility>

#include "../tensor_checks.h"
#include "fp8ext/scaled_mm_blockwise.h"
#include "cuda_status.h"
#include "gemm_operands.h"

namespace fp8ext::torch_ops {
namespace {

using cuda::BlockwiseConfig;

// The 1x128 group scales [M, G] as the kernels read them, with their column
// stride: M-major, the stride a multiple of 4, and storage for M rounded up to
// 4 values in the last column (fp8ext's quantize_per_group writes them so);
// any other layout is copied into one.
std::pair<at::Tensor, int64_t> group_scales(const at::Tensor& s, int64_t m, int64_t groups) {
  const int64_t ld = round_up(std::max<int64_t>(m, 1), kGroupScaleRowAlign);
  const int64_t stride = groups <= 1 ? ld : s.stride(1);
  const int64_t elements = s.storage().nbytes() / static_cast<int64_t>(sizeof(float)) - s.storage_offset();
  const bool usable = (m <= 1 || s.stride(0) == 1) && stride >= m && stride % kGroupScaleRowAlign == 0 &&
                      (groups - 1) * stride + ld <= elements && aligned16(s);
  if (usable) return {s, stride};
  at::Tensor storage = at::zeros({groups, ld}, s.options());
  storage.narrow(1, 0, m).copy_(s.t());
  return {storage.t().narrow(0, 0, m), ld};
}

void check_block_scale(const at::Tensor& s, const char* name, int64_t rows, int64_t cols, const char* what,
                       const at::Tensor& like) {
  TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, name, " must be float32, got ", s.scalar_type());
  TORCH_CHECK_VALUE(s.device() == like.device(), name, " must be on ", like.device(), ", got ", s.device());
  TORCH_CHECK_VALUE(s.dim() == 2 && s.size(0) == rows && s.size(1) == cols, name, " must be ", what, " [", rows,
                    ", ", cols, "], got shape ", s.sizes());
}

cudaError_t launch(const cuda::BlockwiseMmProblem& p, int64_t config, const at::Tensor& like) {
  const auto cfg = static_cast<BlockwiseConfig>(config);
  const size_t bytes = cuda::blockwise_mm_workspace_bytes(p, cfg);
  at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
  return cuda::blockwise_mm(p, cfg, bytes ? workspace.data_ptr() : nullptr, bytes,
                            c10::cuda::getCurrentCUDAStream(like.get_device()).stream());
}

at::Tensor scaled_mm_blockwise_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                                    const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                                    at::ScalarType out_dtype, int64_t config) {
  TORCH_CHECK_TYPE(a.scalar_type() == at::kFloat8_e4m3fn && b.scalar_type() == at::kFloat8_e4m3fn,
                   "a and b must be torch.float8_e4m3fn for the block-wise kernels, got ", a.scalar_type(), " and ",
                   b.scalar_type());
  check_gemm_operands(a, b, out_dtype);
  TORCH_CHECK_VALUE(config >= 0 && config <= static_cast<int64_t>(BlockwiseConfig::kLastConfig),
                    "config must be 0 (auto) to ", static_cast<int>(BlockwiseConfig::kLastConfig), ", got ", config);
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  const int64_t groups = ceil_div(k, kGroupSize);
  check_block_scale(scale_a, "scale_a", m, groups, "one value per 1x128 group of a:", a);
  check_block_scale(scale_b, "scale_b", ceil_div(n, kGroupSize), groups, "one value per 128x128 block of b:", a);
  check_bias_and_gpu(bias, n, out_dtype, a, "fp8ext.scaled_mm (block-wise)");
  cuda::BlockwiseMmProblem dtype_only{};  // the instantiations differ by output dtype only
  dtype_only.d_dtype = out_dtype == at::kBFloat16 ? DType::kBFloat16
                       : out_dtype == at::kHalf   ? DType::kFloat16
                                                  : DType::kFloat32;
  TORCH_CHECK_VALUE(cuda::blockwise_mm_has_config(dtype_only, static_cast<BlockwiseConfig>(config)),
                    "fp8ext.scaled_mm (block-wise): config ",
                    cuda::blockwise_config_name(static_cast<BlockwiseConfig>(config)),
                    " is not instantiated for this output dtype (use auto)");
  c10::cuda::CUDAGuard guard(a.device());

  at::Tensor out = at::empty({m, n}, a.options().dtype(out_dtype));
  if (m == 0 || n == 0) return out;
  if (k == 0) return bias ? out.copy_(bias->unsqueeze(0).expand({m, n})) : out.zero_();

  // K to a multiple of 16 (zero columns add nothing; the last group's scale
  // still covers them), N to whole 16 bytes of D for the TMA store (zero rows
  // of B inside the last 128-row block, whose scale row already exists).
  const int64_t k16 = round_up(k, 16);
  const int64_t n16 = round_up(n, 16 / static_cast<int64_t>(at::elementSize(out_dtype)));
  const at::Tensor ka = kernel_operand(a, k16, m);
  const at::Tensor kb = kernel_operand(b, k16, n16);
  const auto [sa, ld_sa] = group_scales(scale_a, m, groups);
  const bool sb_usable = (groups <= 1 || scale_b.stride(1) == 1) && (scale_b.size(0) <= 1 || scale_b.stride(0) >= groups);
  const at::Tensor sb = sb_usable ? scale_b : scale_b.contiguous();
  const at::Tensor kbias = bias ? padded_vector(*bias, n16) : at::Tensor();
  at::Tensor d = n16 == n ? out : at::empty({m, n16}, a.options().dtype(out_dtype));
  cuda::BlockwiseMmProblem p{ka.data_ptr(), ka.size(0) <= 1 ? k16 : ka.stride(0),
                             kb.data_ptr(), kb.size(0) <= 1 ? k16 : kb.stride(0),
                             m, n16, k16,
                             sa.data_ptr<float>(), ld_sa,
                             sb.data_ptr<float>(), sb.size(0) <= 1 ? groups : sb.stride(0),
                             bias ? kbias.data_ptr() : nullptr, d.data_ptr(), dtype_only.d_dtype, n16};
  if (const char* why = cuda::blockwise_mm_unsupported_reason(p))
    TORCH_CHECK_VALUE(false, "fp8ext.scaled_mm (block-wise): ", why);
  const cudaError_t err = launch(p, config, a);
  check_gemm_status(err, "fp8ext.scaled_mm (block-wise): kernel launch");
  if (d.data_ptr() != out.data_ptr()) out.copy_(d.narrow(1, 0, n));  // torch's copy: see scaled_mm_cuda.cpp
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8ext, CUDA, m) { m.impl("scaled_mm_blockwise", &scaled_mm_blockwise_cuda); }

}  // namespace fp8ext::torch_ops

#endif  // FP8EXT_WITH_SM90_GEMM
