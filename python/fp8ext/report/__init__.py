"""`fp8ext report`: the FP8 serving study on a real model, as Markdown, HTML
and PNG plots. CPU sections (formats, recipes, selective precision, FP8 KV
cache) run everywhere through the exact CPU reference; the GPU sections
(GEMM economics, serving) run where CUDA is present and say so where not."""
from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass

import torch

from fp8ext import evaluation
from fp8ext.report import render, study


@dataclass(frozen=True)
class Sizes:
    window: int         # tokens per perplexity window
    windows: int        # windows of lee_background evaluated
    shifted: int        # windows of the shifted text
    calibration: int    # windows (from token 8192 on) for static scales and delayed histories
    sensitivity_windows: int
    all_blocks: bool    # every decoder block in the sensitivity table, or the first, middle and last
    kv_windows: int     # serving-engine perplexity: 1 calibrates the KV scales, the rest are evaluated
    kv_window: int


QUICK = Sizes(window=128, windows=2, shifted=2, calibration=1, sensitivity_windows=1, all_blocks=False,
              kv_windows=2, kv_window=64)
FULL = Sizes(window=512, windows=16, shifted=8, calibration=4, sensitivity_windows=4, all_blocks=True,
             kv_windows=5, kv_window=128)
SHIFTED_TEXT = "pang_lee_polarity.cor"  # short movie-review snippets; the static scales see news text


def _log(msg: str) -> None:
    print(f"[fp8ext report] {msg}", flush=True)


def build_report(out_dir: str = "fp8ext-report", quick: bool = False, only: str | None = None,
                 model: str | None = None) -> str:
    """Writes report.md, report.html and the plots into out_dir; returns the
    HTML path. ``only="gpu"`` skips the model sections (the GPU machine lacks
    the SmolLM2 packages); ``only="cpu"`` skips the GPU ones. ``model``: a local
    Hugging Face Llama checkpoint folder instead of SmolLM2-135M."""
    if only not in (None, "cpu", "gpu"):
        raise ValueError(f"only must be None, 'cpu' or 'gpu', got {only!r}")
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.time()
    name = "SmolLM2-135M" if model is None else os.path.basename(os.path.normpath(model))
    sections = [] if only == "gpu" else _cpu_sections(out_dir, QUICK if quick else FULL, model)
    if only != "cpu":
        sections += _gpu_sections(out_dir, quick)
    title = f"fp8ext report ({'quick' if quick else 'full'}): FP8 serving study on {name}"
    _, html_path = render.write(out_dir, title, sections)
    _log(f"done in {time.time() - t0:.0f} s: {html_path}")
    return html_path


def _cpu_sections(out_dir: str, sizes: Sizes, model: str | None = None) -> list:
    _log(f"loading {model or 'SmolLM2-135M'} (float32) and the texts")
    hf, tok, _ = evaluation.load_model(model)
    ids = tok(evaluation.lee_background_text(), add_special_tokens=False, return_tensors="pt").input_ids[0]
    shifted_ids = tok(evaluation.gensim_text(SHIFTED_TEXT), add_special_tokens=False,
                      return_tensors="pt").input_ids[0]
    w = sizes.window
    windows = ids[: sizes.windows * w].reshape(-1, w)
    calibration = list(ids[8192: 8192 + sizes.calibration * w].reshape(-1, 1, w))
    shifted = shifted_ids[: min(sizes.shifted, shifted_ids.numel() // w) * w].reshape(-1, w)
    sens = windows[: sizes.sensitivity_windows]
    base, base_shifted, base_sens = study.ppl(hf, windows), study.ppl(hf, shifted), study.ppl(hf, sens)
    sections = []

    _log("1/6 formats: constants, SQNR per layer, perplexity per format")
    sqnr = study.sqnr_per_layer(hf, windows[:1])
    render.plot_sqnr(sqnr, os.path.join(out_dir, "sqnr.png"))
    fmt_rows = study.format_perplexity(hf, windows, base)
    mean = {k: round(sum(r[k] for r in sqnr) / len(sqnr), 2) for k in sqnr[0] if k != "layer"}
    sections.append((
        "1. E4M3 vs E5M2",
        f"Float32 perplexity {base:.3f} on {windows.numel()} tokens of lee_background. E4M3 trades range for "
        f"one more mantissa bit; with a per-tensor scale the range is rarely the limit, so E4M3's SQNR is higher "
        f"on weights and activations (mean over {len(sqnr)} decoder linears: {mean}).",
        [("Format constants", study.format_constants()), ("W8A8 perplexity (per-tensor current scaling)", fmt_rows),
         ("SQNR per decoder linear (dB)", sqnr)], ["sqnr.png"]))

    _log("2/6 scaling recipes (static scales calibrated on news, evaluated on movie reviews too)")
    rec_rows = study.recipe_study(hf, windows, shifted, calibration, base, base_shifted)
    render.plot_bars([r["recipe"] for r in rec_rows], {"lee_background": [r["increase %"] for r in rec_rows],
                                                       "shifted text": [r["shifted increase %"] for r in rec_rows]},
                     "perplexity increase (%)", os.path.join(out_dir, "recipes.png"))
    layers = len(hf.model.layers)
    blocks = tuple(range(layers)) if sizes.all_blocks else tuple(sorted({0, layers // 2, layers - 1}))
    sens_rows = study.layer_sensitivity(hf, sens, base_sens, _progress(blocks, "sensitivity"))
    render.plot_bars([str(r["block"]) for r in sorted(sens_rows, key=lambda r: r["block"])],
                     {"increase %": [r["increase %"] for r in sorted(sens_rows, key=lambda r: r["block"])]},
                     "perplexity increase (%) with one block in FP8", os.path.join(out_dir, "sensitivity.png"))
    sections.append((
        "2. Scaling recipes",
        f"All decoder linears in FP8 (E4M3), LM head kept. Shifted text: {SHIFTED_TEXT} (float32 perplexity "
        f"{base_shifted:.3f}); static scales come from {sizes.calibration} window(s) of lee_background, so "
        "values beyond their range on the shifted text are clipped; the GPTQ row chooses its weights' FP8 codes "
        "on the same calibration windows (same block scales). Sensitivity: one decoder block at a time in "
        f"FP8 (per-tensor current), most harmful first, on {sens.numel()} tokens (float32 {base_sens:.3f}).",
        [("Recipes", rec_rows), ("Per-block sensitivity", sens_rows)], ["recipes.png", "sensitivity.png"]))

    _log("3/6 selective precision")
    sel_rows = study.selective_precision(hf, windows, base)
    sections.append(("3. Selective precision",
                     "Decoder linears row-wise FP8; then the LM head, the embedding (one scale per row) and the "
                     "norm weights quantized too.", [("Selective precision", sel_rows)], []))

    _log("4/6 FP8 KV cache through the serving engine")
    kv_ids = ids[: sizes.kv_windows * sizes.kv_window].reshape(-1, sizes.kv_window)
    kv_rows = study.kv_cache_study(hf, kv_ids, prefix=sizes.kv_window // 4)
    render.plot_bars([r["cache"] for r in kv_rows], {"tokens per GiB (Llama-3.1-8B)":
                                                     [r["tokens per GiB (Llama-3.1-8B)"] for r in kv_rows]},
                     "KV capacity (tokens per GiB)", os.path.join(out_dir, "kv_capacity.png"))
    sections.append(("4. FP8 KV cache",
                     "Perplexity of the serving engine (prefill of the first quarter of each window, then one decode "
                     "step per token through the paged cache); attention-output error of the first window's prefill "
                     "with K and V stored in each format (per-head scales calibrated on that window).",
                     [("KV cache", kv_rows)], ["kv_capacity.png"]))

    return sections


def _progress(items, label):
    try:
        from tqdm import tqdm
        return list(tqdm(items, desc=label, leave=False))
    except ImportError:
        return list(items)


def _gpu_sections(out_dir: str, quick: bool) -> list:
    if not torch.cuda.is_available():
        why = "skipped: no CUDA GPU on this machine (these sections time the H200 kernels)"
        _log(f"5/6 and 6/6 {why}")
        return [("5. GEMM economics", why, [], []), ("6. Serving", why, [], [])]
    from fp8ext.report import gpu
    out = []
    try:
        _log("5/6 GEMM economics")
        rows = gpu.gemm_economics()
        gpu.plot_roofline(rows, os.path.join(out_dir, "roofline.png"))
        out.append(("5. GEMM economics", "Graph-timed, bf16 inputs quantized once.",
                    [("TFLOP/s", rows), ("Cost of unaligned shapes", gpu.unaligned_cost())], ["roofline.png"]))
    except Exception:  # the report still shows the other sections, and why this one failed
        out.append(("5. GEMM economics", "failed: " + traceback.format_exc(limit=3), [], []))
    try:
        from fp8ext.serving import bench
        sweep = bench.QUICK if quick else bench.CURVES
        _log(f"6/6 serving: decode at batch {sweep['batches']}, context 4096, every mode")
        rows = bench.run(os.path.join(out_dir, "serve"), sweep=sweep)
        gpu.plot_serving(rows, os.path.join(out_dir, "serving.png"))
        run, tables = render.serving_tables(rows)
        out.append(("6. Serving", f"Llama-3.1-8B shape, random weights (fp8ext bench serve).\n\n{run}", tables,
                    ["serving.png"]))
    except Exception:
        out.append(("6. Serving", "failed: " + traceback.format_exc(limit=3), [], []))
    return out
