// CUDA implementations of the quantize ops: argument checks, output allocation
// (shared with the CPU ops), then the torch-free kernels on the current stream.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <tuple>

#include "../quantize_outputs.h"
#include "../tensor_checks.h"
#include "amax_slots.h"
#include "cuda_status.h"
#include "fp8ext/quantize_cuda.h"

namespace fp8ext::torch_ops {
namespace {

using QuantOut = std::tuple<at::Tensor, at::Tensor>;

void check_cuda(cudaError_t err, const char* what) { check_cuda_status(err, what); }

// The per-row kernels run one block per row (grid x: at most 2^31 - 1 blocks).
void check_rows_per_block(const ConstMatrix& x, const char* op) {
  TORCH_CHECK_VALUE(x.rows <= INT32_MAX, op, ": x must have fewer than 2^31 rows, got ", x.rows);
}

void check_device(const at::Tensor& x) { check_sm80_or_newer(x, "x", "quantization"); }

cudaStream_t stream_of(const at::Tensor& x) { return c10::cuda::getCurrentCUDAStream(x.get_device()).stream(); }

// The per-tensor recipes' scratch, on the current device (the ops' guards set it to x's).
// FP8EXT_POISON_WORKSPACE=1 (for tests; read at each call) fills it with FLT_MAX
// first, so a kernel that took any of it as zeroed gives a wrong scale.
at::Tensor amax_workspace() {
  at::Tensor w = at::empty({cuda::kAmaxWorkspaceFloats},
                           at::TensorOptions().device(at::kCUDA, c10::cuda::current_device()).dtype(at::kFloat));
  const char* poison = std::getenv("FP8EXT_POISON_WORKSPACE");
  if (poison && std::strcmp(poison, "1") == 0) w.fill_(std::numeric_limits<float>::max());
  return w;
}

at::Tensor cast_to_fp8_cuda(const at::Tensor& x, at::ScalarType dtype, bool saturate) {
  check_device(x);
  c10::cuda::CUDAGuard guard(x.device());
  const ConstMatrix in = input_matrix(x, "x");
  const Fp8Format f = to_fp8_format(dtype, "dtype");
  at::Tensor q = new_fp8_output(x, dtype, in.cols);
  check_cuda(cuda::cast_to_fp8(in, output_matrix(q, f, in.cols), saturate, stream_of(x)), "cast_to_fp8");
  return q;
}

at::Tensor quantize_with_scale_cuda(const at::Tensor& x, const at::Tensor& scale, at::ScalarType dtype,
                                    int64_t pad_k_to) {
  check_device(x);
  c10::cuda::CUDAGuard guard(x.device());
  const ConstMatrix in = input_matrix(x, "x");
  check_scalar_fp32(scale, "scale", x);
  const Fp8Format f = to_fp8_format(dtype, "dtype");
  at::Tensor q = new_fp8_output(x, dtype, padded_cols(in.cols, pad_k_to));
  check_cuda(cuda::quantize_with_scale(in, scale.data_ptr<float>(), output_matrix(q, f, in.cols), stream_of(x)),
             "quantize_with_scale");
  return q;
}

QuantOut quantize_delayed_cuda(const at::Tensor& x, at::Tensor& amax_history, at::Tensor& scale,
                               at::ScalarType dtype, int64_t margin, bool power_of_two, bool use_history_max,
                               int64_t pad_k_to) {
  check_device(x);
  c10::cuda::CUDAGuard guard(x.device());
  const ConstMatrix in = input_matrix(x, "x");
  const ScaleRule rule = scale_rule(dtype, margin, power_of_two);
  check_scalar_fp32(scale, "scale", x);
  check_amax_history(amax_history, x);
  check_delayed_state_apart(x, amax_history, scale);
  at::Tensor q = new_fp8_output(x, dtype, padded_cols(in.cols, pad_k_to));
  at::Tensor used = new_scalar_scale(x);
  at::Tensor amax = amax_workspace();
  check_cuda(cuda::quantize_delayed(in, rule, use_history_max, amax_history.data_ptr<float>(), amax_history.numel(),
                                    scale.data_ptr<float>(), output_matrix(q, rule.format, in.cols),
                                    used.data_ptr<float>(), amax.data_ptr<float>(), stream_of(x)),
             "quantize_delayed");
  return {q, used};
}

// per-tensor current, per-row, per-group and per-block share one shape: allocate, launch, return.
template <at::Tensor (*NewScales)(const at::Tensor&),
          cudaError_t (*Launch)(const ConstMatrix&, const ScaleRule&, const Fp8Matrix&, float*, cudaStream_t)>
QuantOut quantize_scaled_cuda(const at::Tensor& x, at::ScalarType dtype, int64_t margin, bool power_of_two,
                              int64_t pad_k_to) {
  check_device(x);
  c10::cuda::CUDAGuard guard(x.device());
  const ConstMatrix in = input_matrix(x, "x");
  const ScaleRule rule = scale_rule(dtype, margin, power_of_two);
  at::Tensor q = new_fp8_output(x, dtype, padded_cols(in.cols, pad_k_to));
  at::Tensor s = NewScales(x);
  check_cuda(Launch(in, rule, output_matrix(q, rule.format, in.cols), s.data_ptr<float>(), stream_of(x)),
             "quantization kernel");
  return {q, s};
}

void check_norm_weight(const at::Tensor& weight, const at::Tensor& x, int64_t cols, double eps) {
  TORCH_CHECK_VALUE(weight.device() == x.device(), "weight must be on x's device (", x.device(), "), got ",
                    weight.device());
  TORCH_CHECK_TYPE(weight.scalar_type() == x.scalar_type(), "weight must have x's dtype (", x.scalar_type(),
                   "), got ", weight.scalar_type());
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == cols && weight.is_contiguous(),
                    "weight must be a contiguous [", cols, "] tensor, got shape ", weight.sizes());
  TORCH_CHECK_VALUE(eps >= 0.0, "eps must be >= 0, got ", eps);
}

QuantOut rms_norm_quantize_per_row_cuda(const at::Tensor& x, const at::Tensor& weight, double eps,
                                        at::ScalarType dtype, int64_t margin, bool power_of_two, int64_t pad_k_to) {
  check_device(x);
  c10::cuda::CUDAGuard guard(x.device());
  const ConstMatrix in = input_matrix(x, "x");
  check_rows_per_block(in, "rms_norm_quantize_per_row");
  check_norm_weight(weight, x, in.cols, eps);
  const ScaleRule rule = scale_rule(dtype, margin, power_of_two);
  at::Tensor q = new_fp8_output(x, dtype, padded_cols(in.cols, pad_k_to));
  at::Tensor s = new_row_scales(x);
  check_cuda(cuda::rms_norm_quantize_per_row(in, weight.data_ptr(), static_cast<float>(eps), rule,
                                             output_matrix(q, rule.format, in.cols), s.data_ptr<float>(),
                                             stream_of(x)),
             "rms_norm_quantize_per_row");
  return {q, s};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_quantize_per_row_cuda(
    const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps, at::ScalarType dtype,
    int64_t margin, bool power_of_two, int64_t pad_k_to) {
  check_device(x);
  c10::cuda::CUDAGuard guard(x.device());
  const ConstMatrix in = input_matrix(x, "x");
  check_rows_per_block(in, "add_rms_norm_quantize_per_row");
  TORCH_CHECK_VALUE(residual.sizes() == x.sizes() && residual.device() == x.device(),
                    "residual must match x (", x.sizes(), " on ", x.device(), "), got ", residual.sizes(), " on ",
                    residual.device());
  TORCH_CHECK_TYPE(residual.scalar_type() == x.scalar_type(), "residual must have x's dtype (", x.scalar_type(),
                   "), got ", residual.scalar_type());
  check_norm_weight(weight, x, in.cols, eps);
  const ScaleRule rule = scale_rule(dtype, margin, power_of_two);
  const at::Tensor res = residual.contiguous();
  at::Tensor sum = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor q = new_fp8_output(x, dtype, padded_cols(in.cols, pad_k_to));
  at::Tensor s = new_row_scales(x);
  check_cuda(cuda::add_rms_norm_quantize_per_row(in, res.data_ptr(), sum.data_ptr(), weight.data_ptr(),
                                                 static_cast<float>(eps), rule,
                                                 output_matrix(q, rule.format, in.cols), s.data_ptr<float>(),
                                                 stream_of(x)),
             "add_rms_norm_quantize_per_row");
  return {q, s, sum};
}

QuantOut silu_mul_quantize_per_row_cuda(const at::Tensor& x, at::ScalarType dtype, int64_t margin,
                                        bool power_of_two, int64_t pad_k_to) {
  check_device(x);
  c10::cuda::CUDAGuard guard(x.device());
  const ConstMatrix in = input_matrix(x, "x");
  check_rows_per_block(in, "silu_mul_quantize_per_row");
  TORCH_CHECK_VALUE(in.cols % 2 == 0, "x must be [M, 2 * I] (gate, then up), got ", in.cols, " columns");
  const ScaleRule rule = scale_rule(dtype, margin, power_of_two);
  at::Tensor q = new_fp8_output(x, dtype, padded_cols(in.cols / 2, pad_k_to));
  at::Tensor s = new_row_scales(x);
  check_cuda(cuda::silu_mul_quantize_per_row(in, rule, output_matrix(q, rule.format, in.cols / 2),
                                             s.data_ptr<float>(), stream_of(x)),
             "silu_mul_quantize_per_row");
  return {q, s};
}

cudaError_t quantize_per_row_launch(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q, float* scale,
                                    cudaStream_t stream) {
  check_rows_per_block(x, "quantize_per_row");
  return cuda::quantize_per_row(x, rule, q, scale, stream);
}

// The 128x128 kernel's grid has a block row per 128 rows in grid.y (at most 65535).
cudaError_t quantize_per_block_launch(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q, float* scales,
                                      cudaStream_t stream) {
  TORCH_CHECK_VALUE(x.rows <= int64_t{65535} * 128, "quantize_per_block: x must have at most ", int64_t{65535} * 128,
                    " rows (65535 blocks of 128) on CUDA, got ", x.rows);
  return cuda::quantize_per_block(x, rule, q, scales, stream);
}

// Current scaling with its amax workspace, and in eager calls the stream's
// amax slots (amax_slots.h), which spare the two passes their zeroing kernel.
cudaError_t quantize_per_tensor_launch(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q, float* scale,
                                       cudaStream_t stream) {
  at::Tensor amax = amax_workspace();
  // Small tensors take the one-pass kernel on sm_90 (no amax slot): spare them the lease's host work.
  AmaxSlotsLease lease(stream, x.rows * x.cols > cuda::kOnePassMaxElements);
  const cudaError_t err = cuda::quantize_per_tensor(x, rule, q, scale, amax.data_ptr<float>(), stream, lease.slots());
  lease.finish(err == cudaSuccess);
  return err;
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8ext, CUDA, m) {
  m.impl("cast_to_fp8", &cast_to_fp8_cuda);
  m.impl("quantize_with_scale", &quantize_with_scale_cuda);
  m.impl("quantize_per_tensor", &quantize_scaled_cuda<new_scalar_scale, quantize_per_tensor_launch>);
  m.impl("quantize_delayed", &quantize_delayed_cuda);
  m.impl("quantize_per_row", &quantize_scaled_cuda<new_row_scales, quantize_per_row_launch>);
  m.impl("quantize_per_group", &quantize_scaled_cuda<new_group_scales, cuda::quantize_per_group>);
  m.impl("quantize_per_block", &quantize_scaled_cuda<new_block_scales, quantize_per_block_launch>);
  m.impl("rms_norm_quantize_per_row", &rms_norm_quantize_per_row_cuda);
  m.impl("add_rms_norm_quantize_per_row", &add_rms_norm_quantize_per_row_cuda);
  m.impl("silu_mul_quantize_per_row", &silu_mul_quantize_per_row_cuda);
}

}  // namespace fp8ext::torch_ops
