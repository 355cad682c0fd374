// Op schemas of the fp8ext library and the Python module that loads them.
// Implementations register per dispatch key in their own files; fake (meta)
// implementations live in python/fp8ext/ops/fake.py.
#include <Python.h>
#include <torch/library.h>

#include <string>

namespace {

// Build-time capabilities, so Python can ask what this build supports.
std::string cuda_archs() {
#ifdef FP8EXT_CUDA_ARCHS
  return FP8EXT_CUDA_ARCHS;
#else
  return "";
#endif
}

}  // namespace

TORCH_LIBRARY(fp8ext, m) {
  m.def("cuda_archs() -> str", &cuda_archs);
  m.def("cast_to_fp8(Tensor x, ScalarType dtype, bool saturate) -> Tensor");
  m.def("quantize_with_scale(Tensor x, Tensor scale, ScalarType dtype, int pad_k_to) -> Tensor");
  m.def(
      "quantize_per_tensor(Tensor x, ScalarType dtype, int margin, bool power_of_two, "
      "int pad_k_to) -> (Tensor, Tensor)");
  m.def(
      "quantize_delayed(Tensor x, Tensor(a!) amax_history, Tensor(b!) scale, ScalarType dtype, "
      "int margin, bool power_of_two, bool use_history_max, int pad_k_to) -> (Tensor, Tensor)");
  m.def(
      "quantize_per_row(Tensor x, ScalarType dtype, int margin, bool power_of_two, "
      "int pad_k_to) -> (Tensor, Tensor)");
  m.def(
      "quantize_per_group(Tensor x, ScalarType dtype, int margin, bool power_of_two, "
      "int pad_k_to) -> (Tensor, Tensor)");
  m.def(
      "quantize_per_block(Tensor x, ScalarType dtype, int margin, bool power_of_two, "
      "int pad_k_to) -> (Tensor, Tensor)");
  // quantize_per_row(weight * rms_norm(x, eps)) in one launch on the GPU (the CPU
  // and the fallback compose the two: python/fp8ext/ops/fused.py).
  m.def(
      "rms_norm_quantize_per_row(Tensor x, Tensor weight, float eps, ScalarType dtype, int margin, "
      "bool power_of_two, int pad_k_to) -> (Tensor, Tensor)");
  // The same for h = x + residual, which is returned too (q, scale, h): a
  // decoder's residual add fused with the next norm.
  m.def(
      "add_rms_norm_quantize_per_row(Tensor x, Tensor residual, Tensor weight, float eps, ScalarType dtype, "
      "int margin, bool power_of_two, int pad_k_to) -> (Tensor, Tensor, Tensor)");
  // quantize_per_row(silu(gate) * up) for x = [gate | up] [M, 2I]; q is [M, I].
  m.def(
      "silu_mul_quantize_per_row(Tensor x, ScalarType dtype, int margin, bool power_of_two, "
      "int pad_k_to) -> (Tensor, Tensor)");
  // D = (scale_a * scale_b) * (a @ b^T) + bias; config 0 = choose by shape (GemmConfig);
  // use_fast_accum allows FP8 fast accumulation where it is faster.
  m.def(
      "scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, ScalarType out_dtype, "
      "int config, bool use_fast_accum=False) -> Tensor");
  // Block-wise (DeepSeek-V3): D = sum over 128-wide K blocks of scale_a[m, kb] *
  // scale_b[n / 128, kb] * (a @ b^T restricted to the block) + bias; scale_a
  // [M, ceil(K/128)] (1x128 groups), scale_b [ceil(N/128), ceil(K/128)] (128x128 blocks).
  m.def(
      "scaled_mm_blockwise(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, "
      "ScalarType out_dtype, int config) -> Tensor");
  // Paged KV cache (python/fp8ext/kv_cache.py): k, v [T, H_kv, D] stored as
  // cast(x / scale) into [pages, page_size, H_kv, D] pools at slot_mapping
  // (page * page_size + offset; -1 skips a token).
  m.def(
      "kv_cache_write(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, "
      "Tensor k_scale, Tensor v_scale) -> ()");
  // kv_cache_write with RoPE: qkv [T, (H_q + 2 H_kv) * D] (q heads, K heads, V
  // heads), cos and sin [T, D] (Hugging Face's rotate-half tables, both halves the same angles);
  // K is rotated, then written with V; returns the rotated q [T, H_q, D].
  m.def(
      "kv_cache_write_rotary(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor slot_mapping, Tensor k_scale, Tensor v_scale, int num_q_heads) -> Tensor");
  // One query token per sequence, q [B, H_q, D], over the pages of block_table
  // [B, max_pages] up to seq_lens [B]; num_splits splits each sequence's KV
  // (planned on the host, so the captured kernel's grid is fixed); window > 0
  // keeps the last `window` tokens; softcap > 0 caps the logits with tanh.
  m.def(
      "paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seq_lens, "
      "Tensor k_scale, Tensor v_scale, float softmax_scale, int num_splits=1, int window=0, "
      "float softcap=0.0) -> Tensor");
}

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C",
                               "fp8ext native ops (registered under torch.ops.fp8ext)", -1,
                               nullptr};
  return PyModule_Create(&module);
}
