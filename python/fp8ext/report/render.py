"""Markdown, HTML and PNG output of `fp8ext report`: tables straight from the
study's rows, plots with matplotlib (Agg)."""
from __future__ import annotations

import base64
import html
import os


def _cell(v) -> str:
    """A float as its rows hold it: whole values past 1e4 in full (E5M2's max is 57344, not
    5.734e+04), others to their rounding (repr), tiny ones in 4 significant digits."""
    if isinstance(v, float):
        if v != 0 and abs(v) < 1e-3:
            return f"{v:.4g}"
        if abs(v) >= 1e4:
            return str(int(v)) if v.is_integer() else repr(v)
        return f"{v:g}"
    return str(v)


def table_md(rows: list) -> str:
    if not rows:
        return "_(no rows)_\n"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def table_html(rows: list) -> str:
    if not rows:
        return "<p><em>(no rows)</em></p>"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(r.get(c, '')))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def serving_tables(rows: list) -> tuple:
    """`fp8ext bench serve` rows as (a line naming the run, [(caption, rows)]):
    a decode table and a prefill table with the columns each op has."""
    run = ", ".join(f"{key} {rows[0][key]}" for key in ("gpu", "torch", "commit", "date") if rows and key in rows[0])
    budget = next((r["budget_gb"] for r in rows if "budget_gb" in r), None)
    if budget is not None:
        run += f"; fits in budget: sequences of that context whose KV cache fits next to the weights in {budget:g} GB"
    decode = [{"mode": r["mode"], "batch": r["batch"], "context": r["context"],
               "step ms": r.get("step_ms", "skipped" if "skipped" in r else "-"), "p99 ms": r.get("p99_ms", "-"),
               "tok/s": r.get("tokens_per_s", "-"), "fits in budget": r.get("max_batch_in_budget", "-")}
              for r in rows if r["op"] == "serve_decode"]
    prefill = [{"mode": r["mode"], "prompt tokens": r["prompt_tokens"], "TTFT ms": r["ttft_ms"]}
               for r in rows if r["op"] == "serve_prefill"]
    return run, [("Decode", decode), ("Prefill", prefill)]


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_sqnr(rows: list, path: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4))
    x = range(len(rows))
    for key, style in (("weight e4m3", "-"), ("weight e5m2", "--"), ("activation e4m3", "-"),
                       ("activation e5m2", "--")):
        ax.plot(x, [r[key] for r in rows], style, label=key)
    ax.set_xlabel("decoder linear (model order)")
    ax.set_ylabel("SQNR (dB), per-tensor scale")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bars(labels: list, series: dict, ylabel: str, path: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        ax.bar([j + i * width for j in range(len(labels))], values, width, label=name)
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(labels))])
    ax.set_xticklabels(labels, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    if len(series) > 1:
        ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out_dir: str, title: str, sections: list) -> tuple:
    """sections: [(heading, text, [(caption, rows)], [png file names])] -> (report.md, report.html)."""
    md = [f"# {title}\n"]
    body = [f"<h1>{html.escape(title)}</h1>"]
    for heading, text, tables, plots in sections:
        md.append(f"## {heading}\n\n{text}\n")
        body.append(f"<h2>{html.escape(heading)}</h2><p>{html.escape(text)}</p>")
        for caption, rows in tables:
            md.append(f"**{caption}**\n\n{table_md(rows)}")
            body.append(f"<h3>{html.escape(caption)}</h3>{table_html(rows)}")
        for png in plots:
            md.append(f"![{png}]({png})\n")
            with open(os.path.join(out_dir, png), "rb") as f:
                data = base64.b64encode(f.read()).decode()
            body.append(f'<img alt="{html.escape(png)}" src="data:image/png;base64,{data}">')
    md_path, html_path = os.path.join(out_dir, "report.md"), os.path.join(out_dir, "report.html")
    with open(md_path, "w") as f:
        f.write("\n".join(md))
    style = "body{font-family:sans-serif;max-width:1000px;margin:auto}table{border-collapse:collapse}" \
            "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}img{max-width:100%}"
    with open(html_path, "w") as f:
        f.write(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
                f"<style>{style}</style></head><body>{''.join(body)}</body></html>")
    return md_path, html_path
