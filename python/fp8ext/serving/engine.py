"""Continuous batching over a LlamaModel and a PagedKVCache, greedy sampling.

Each step either admits waiting requests (as many as the batch limit and the
free pages allow) and prefills them together, which gives each its first
token, or runs one decode step over every running sequence. Finished
sequences leave at once and their pages go back to the pool; a running
sequence that finds no page for its next token preempts the newest running
sequence (itself when it is the newest), which goes back to the head of the
queue to be recomputed. On CUDA
the decode step runs as a CUDA graph captured once per batch-size bucket
(rows past the live batch have length 0, slot -1 and a zero hidden state, so
they read and write nothing and do not move per-tensor activation scales); its block table and KV splits are sized for the cache's
``max_pages_per_seq``, so give the cache the longest context you serve.
"""
from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from fp8ext.checks import check_bool, check_positive_int, is_int
from fp8ext.cuda_graphs import capture
from fp8ext.kv_cache import DecodePlan, PagedKVCache
from fp8ext.serving.model import LlamaModel, check_prompt

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class Request:
    id: int
    prompt: list
    max_new_tokens: int
    eos_token_id: int | None = None
    output: list = field(default_factory=list)
    seq: tuple = ()  # its sequence id in the cache: (the engine, id), never a caller's own

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new_tokens or (
            self.eos_token_id is not None and bool(self.output) and self.output[-1] == self.eos_token_id)


class _Graph:
    """A decode step captured for a fixed batch size: static inputs refilled before each replay."""

    def __init__(self, model: LlamaModel, cache: PagedKVCache, batch: int):
        dev = model.device
        self.tokens = torch.zeros(batch, dtype=torch.long, device=dev)
        self.positions = torch.zeros(batch, dtype=torch.long, device=dev)
        self.slots = torch.full((batch,), -1, dtype=torch.long, device=dev)
        self.live = torch.zeros(batch, dtype=model.dtype, device=dev)
        splits = cache.plan_splits(batch, cache.max_pages_per_seq * cache.page_size,
                                   torch.cuda.get_device_properties(dev).multi_processor_count)
        self.plan = DecodePlan([], torch.zeros(batch, cache.max_pages_per_seq, dtype=torch.int32, device=dev),
                               torch.zeros(batch, dtype=torch.int32, device=dev), splits)
        self.graph, self.logits = capture(
            lambda: model.decode(self.tokens, self.positions, self.slots, self.plan, cache, self.live), dev)

    def __call__(self, tokens, positions, slots, plan: DecodePlan) -> torch.Tensor:
        n, width = plan.block_table.shape
        self.tokens[:n].copy_(tokens)
        self.positions[:n].copy_(positions)
        self.slots.fill_(-1)
        self.slots[:n].copy_(slots)
        self.live.zero_()
        self.live[:n] = 1
        self.plan.block_table.zero_()
        self.plan.block_table[:n, :width].copy_(plan.block_table)
        self.plan.seq_lens.zero_()
        self.plan.seq_lens[:n].copy_(plan.seq_lens)
        self.graph.replay()
        return self.logits[:n]


class Engine:
    def __init__(self, model: LlamaModel, cache: PagedKVCache, max_batch: int = 256, cuda_graphs: bool | None = None):
        if not isinstance(getattr(model, "_orig_mod", model), LlamaModel):  # torch.compile's wrapper forwards
            raise TypeError(f"model must be a fp8ext.serving.LlamaModel, got {type(model).__name__}")
        if not isinstance(cache, PagedKVCache):
            raise TypeError(f"cache must be a fp8ext.PagedKVCache, got {type(cache).__name__}")
        if cache.num_layers != model.cfg.num_layers or cache.num_kv_heads != model.cfg.num_kv_heads or \
                cache.head_dim != model.cfg.head_dim:
            raise ValueError(f"cache ({cache.num_layers} layers, {cache.num_kv_heads} KV heads, head_dim "
                             f"{cache.head_dim}) does not fit the model ({model.cfg.num_layers}, "
                             f"{model.cfg.num_kv_heads}, {model.cfg.head_dim})")
        check_positive_int("max_batch", max_batch)
        if cuda_graphs is not None:
            check_bool("cuda_graphs", cuda_graphs)  # "False" would turn graphs on
        if cuda_graphs and model.device.type != "cuda":
            raise ValueError(f"cuda_graphs=True needs a model on a CUDA device, got {model.device}")
        self.model, self.cache, self.max_batch = model, cache, max_batch
        self.cuda_graphs = model.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self._owner = object()  # the cache may hold others' sequences (another engine's, a caller's)
        self.waiting: collections.deque = collections.deque()
        self.running: list = []
        self._ids = itertools.count()
        self._graphs: dict = {}
        self._unclaimed: dict = {}  # id -> tokens: finished during generate(), not yet given by run()

    def submit(self, prompt, max_new_tokens: int, eos_token_id: int | None = None) -> int:
        req = self._request(prompt, max_new_tokens, eos_token_id)
        self.waiting.append(req)
        return req.id

    def _request(self, prompt, max_new_tokens: int, eos_token_id) -> Request:
        """A checked request with the next id (not queued)."""
        vocab = self.model.cfg.vocab_size
        prompt = check_prompt(prompt, vocab)
        check_positive_int("max_new_tokens", max_new_tokens)
        if eos_token_id is not None and (not is_int(eos_token_id) or not 0 <= eos_token_id < vocab):
            raise ValueError(f"eos_token_id must be None or an int in [0, {vocab}), got {eos_token_id!r}")
        stored = len(prompt) + max_new_tokens - 1  # the last generated token is never written to the cache
        pages = -(-stored // self.cache.page_size)
        if pages > min(self.cache.num_pages, self.cache.max_pages_per_seq):
            raise ValueError(f"prompt + max_new_tokens stores {stored} tokens in the cache: {pages} pages, "
                             f"more than one sequence may hold")
        rid = next(self._ids)
        return Request(rid, prompt, max_new_tokens, eos_token_id, seq=(self._owner, rid))

    def step(self) -> list:
        """Admits and prefills, or decodes once; returns the requests that finished."""
        admitted = self._admit()
        if admitted:
            slots = [s for _, s in admitted]
            reqs = [r for r, _ in admitted]
            prompts = [torch.tensor(r.prompt + r.output) for r in reqs]
            try:
                logits = self.model.prefill(prompts, slots, self.cache)
            except BaseException:  # an error or an interrupt: nothing admitted, no page kept
                self._requeue(reqs)
                raise
            self.running += reqs
            return self._sample(reqs, logits)
        if self.running:
            return self._decode()
        if self.waiting:  # nothing runs that could free pages: waiting would never end
            req = self.waiting[0]
            need = -(-(len(req.prompt) + len(req.output)) // self.cache.page_size)
            raise RuntimeError(f"request {req.id} needs {need} free KV-cache pages and only "
                               f"{self.cache.free_pages} are free (other sequences in the cache hold the rest)")
        return []

    def run(self) -> dict:
        """Steps until every submitted request finished; {request id: generated
        tokens} of the requests finished since the last run() (those that
        finished during a generate() call included)."""
        while self.waiting or self.running:
            for r in self.step():
                self._unclaimed[r.id] = r.output  # kept there until handed out: a step may raise
        out, self._unclaimed = self._unclaimed, {}
        return out

    def generate(self, prompts, max_new_tokens: int, eos_token_id: int | None = None) -> list:
        """Steps until these prompts' requests finished; their generated tokens,
        in order. Requests submitted earlier run along; those that finish on
        the way are kept for the next run()."""
        if isinstance(prompts, str) or not isinstance(prompts, Iterable):
            raise TypeError(f"prompts must be a list of prompts (token-id sequences), got {type(prompts).__name__}")
        reqs = [self._request(p, max_new_tokens, eos_token_id) for p in prompts]  # all checked before any is queued
        self.waiting.extend(reqs)
        mine = {r.id: None for r in reqs}
        pending = len(mine)
        while pending:
            for r in self.step():
                if r.id in mine:
                    mine[r.id] = r.output
                    pending -= 1
                else:
                    self._unclaimed[r.id] = r.output
        return list(mine.values())

    # ---- internals ------------------------------------------------------------
    def _admit(self) -> list:
        admitted = []
        while self.waiting and len(self.running) + len(admitted) < self.max_batch:
            req = self.waiting[0]
            try:
                slots = self.cache.append(req.seq, len(req.prompt) + len(req.output))
            except RuntimeError:  # out of pages: wait for running sequences to finish
                break
            admitted.append((self.waiting.popleft(), slots))
        return admitted

    def _sample(self, reqs, logits) -> list:
        tokens = logits.float().argmax(-1).tolist()
        finished = []
        for r, t in zip(reqs, tokens):
            r.output.append(t)
            if r.done:
                finished.append(r)
        for r in finished:
            self.running.remove(r)
            self.cache.free(r.seq)
        return finished

    def _reserve_next_slots(self) -> list:
        """One slot per running sequence, preempting the newest others when pages run out."""
        slots, i = {}, 0
        while i < len(self.running):
            r = self.running[i]
            try:
                slots[r.id] = self.cache.append(r.seq, 1)
                i += 1
            except RuntimeError:
                if len(self.running) == 1:
                    raise RuntimeError(f"out of KV-cache pages: request {r.id} cannot grow even alone") from None
                # The newest goes back to the queue (running is in admission order, and the newest
                # has no slot yet this step): r itself when r is the newest, else r retries.
                victim = self.running.pop()
                self.cache.free(victim.seq)
                self.waiting.appendleft(victim)  # recomputed from its prompt + output when pages free up
        return [slots[r.id] for r in self.running]

    def _requeue(self, reqs) -> None:
        """After a failed prefill or decode: `reqs` leave the batch and go back to
        the head of the queue in their order, their pages freed (the cache holds
        slots they never wrote), to be recomputed from prompt + output."""
        for r in reversed(reqs):
            if r in self.running:
                self.running.remove(r)
            self.cache.free(r.seq)
            self.waiting.appendleft(r)

    def _decode(self) -> list:
        slots = self._reserve_next_slots()
        reqs = list(self.running)
        try:
            logits = self._decode_logits(reqs, slots)
        except BaseException:  # e.g. out of memory capturing a new bucket's graph, or an interrupt
            self._requeue(reqs)
            raise
        return self._sample(reqs, logits)

    def _decode_logits(self, reqs, slots) -> torch.Tensor:
        dev = self.model.device
        tokens = torch.tensor([r.output[-1] for r in reqs], device=dev)
        positions = torch.tensor([self.cache.length(r.seq) - 1 for r in reqs], device=dev)
        slot_t = torch.cat(slots).to(dev)
        plan = self.cache.plan([r.seq for r in reqs])
        if self.cuda_graphs:
            bucket = next((b for b in BUCKETS if b >= len(reqs)), None)
            if bucket is not None:
                if bucket not in self._graphs:
                    self._graphs[bucket] = _Graph(self.model, self.cache, bucket)
                return self._graphs[bucket](tokens, positions, slot_t, plan)
        return self.model.decode(tokens, positions, slot_t, plan, self.cache)
