"""The simulated engine core: a continuous-batching scheduler stepped one engine step at a time.

It knows nothing of wall-clock time: `step()` decides what the next step computes, applies
its effects and returns the modelled duration. The real-time runner (runner.py) sleeps that
long before it publishes the step's tokens; tests and calibration step it in virtual time.

A step, as in vLLM v1's scheduler: running requests first (one decode token each, or the next
prefill chunk of a partially prefilled prompt), then waiting requests in admission order
within `max_num_batched_tokens` and `max_num_seqs`. When the KV cache cannot hold a running
request's next token, the most recently admitted running request is preempted back to the
head of the waiting queue and later recomputed. A request whose computed tokens reach all
its known tokens samples one new token.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from connector_tax.sim.admission import AdmissionSettings, admission_order
from connector_tax.sim.costs import BatchShape, CostModel, StepCost
from connector_tax.sim.kvcache import BlockPool, block_hashes


@dataclass(frozen=True)
class EngineSettings:
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int = 200000
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)


@dataclass(eq=False)
class SimRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    # Tokens the model will produce: max_tokens with ignore_eos, else where its EOS falls.
    target_tokens: int
    num_computed: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    finish_reason: str | None = None
    _hashes: list[int] | None = None
    # The prompt never changes once submitted: its length is read every step, so keep it.
    prompt_len: int = field(init=False)

    def __post_init__(self) -> None:
        self.prompt_len = len(self.prompt_token_ids)

    @property
    def total_tokens(self) -> int:
        return self.prompt_len + len(self.output_token_ids)

    def hashes(self, block_size: int) -> list[int]:
        if self._hashes is None:
            self._hashes = block_hashes(self.prompt_token_ids, block_size)
        return self._hashes


@dataclass(frozen=True)
class TokenOutput:
    request: SimRequest
    new_token_ids: list[int]
    finished: bool


@dataclass(frozen=True)
class StepResult:
    """One step; queue lengths are as the scheduler left them, before the step ran."""

    step_id: int
    cost: StepCost
    batch: BatchShape
    outputs: list[TokenOutput]
    num_running: int
    num_waiting: int
    num_preempted: int
    kv_cache_usage: float
    prefill_tokens: int
    decode_tokens: int


def next_token_id(request: SimRequest, vocab_size: int) -> int:
    """Greedy decoding is deterministic: the same prompt always continues the same way."""
    seed = request.prompt_token_ids[-1] if request.prompt_token_ids else 0
    return hash((seed, request.prompt_len, len(request.output_token_ids))) % vocab_size


class EngineCore:
    def __init__(
        self,
        settings: EngineSettings,
        cost_model: CostModel,
        vocab_size: int = 32000,
    ) -> None:
        self.settings = settings
        self.cost_model = cost_model
        self.vocab_size = vocab_size
        hw = cost_model.hardware
        self.pool = BlockPool(hw.kv_cache_blocks, hw.block_size, settings.enable_prefix_caching)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self._step_id = 0
        self._admission_round = 0

    def add_request(self, request: SimRequest) -> None:
        self.waiting.append(request)

    def abort_request(self, request: SimRequest) -> None:
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.pool.free(request.request_id)
        request.finish_reason = request.finish_reason or "abort"

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def _preempt_last(self) -> SimRequest:
        victim = self.running.pop()
        self.pool.free(victim.request_id)
        victim.num_computed = 0
        self.waiting.appendleft(victim)
        return victim

    def _schedule_running(self, budget: int) -> tuple[list[tuple[SimRequest, int]], int, int]:
        scheduled: list[tuple[SimRequest, int]] = []
        preempted = 0
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n_new = min(req.total_tokens - req.num_computed, budget)
            while not self.pool.allocate(req.request_id, req.num_computed + n_new):
                victim = self._preempt_last()
                preempted += 1
                if victim is req:
                    break
            else:
                scheduled.append((req, n_new))
                budget -= n_new
                i += 1
                continue
            break
        return scheduled, budget, preempted

    def _admit_waiting(self, budget: int) -> list[tuple[SimRequest, int]]:
        scheduled: list[tuple[SimRequest, int]] = []
        self._admission_round += 1
        order = admission_order(
            self.waiting,
            lambda r: r.total_tokens - r.num_computed,
            budget,
            self.settings.admission,
            self._admission_round,
        )
        block_size = self.pool.block_size
        for req in order:
            if budget <= 0 or len(self.running) >= self.settings.max_num_seqs:
                break
            if req.num_computed == 0:
                hits = self.pool.match_prefix(req.request_id, req.hashes(block_size), req.prompt_len)
                req.num_computed = hits
                req.num_cached_tokens = hits
            remaining = req.total_tokens - req.num_computed
            if self.settings.enable_chunked_prefill:
                n_new = min(remaining, budget)
            elif remaining <= budget or not scheduled:
                n_new = remaining  # a prompt over the budget is admitted alone
            else:
                self._release_prefix(req)
                break  # as vLLM: without chunking, a prompt that does not fit blocks the queue
            if not self.pool.allocate(req.request_id, req.num_computed + n_new):
                self._release_prefix(req)
                break
            self.waiting.remove(req)
            self.running.append(req)
            scheduled.append((req, n_new))
            budget -= n_new
        return scheduled

    def _release_prefix(self, req: SimRequest) -> None:
        self.pool.free(req.request_id)
        req.num_computed = 0

    def step(self) -> StepResult | None:
        """Schedule and run one engine step; None when there is nothing to do."""
        if not self.has_work():
            return None
        budget = self.settings.max_num_batched_tokens
        scheduled, budget, preempted = self._schedule_running(budget)
        if not preempted and self.waiting:
            scheduled += self._admit_waiting(budget)
        if not scheduled:
            return None

        prefill_tokens = decode_tokens = context_tokens = 0
        for req, n_new in scheduled:
            if n_new > 1 or req.num_computed < req.prompt_len:
                prefill_tokens += n_new
            else:
                decode_tokens += n_new
            context_tokens += req.num_computed + n_new
        batch = BatchShape(
            prefill_tokens=prefill_tokens,
            decode_seqs=decode_tokens,
            context_tokens=context_tokens,
            running=len(self.running),
            blocks_in_use=self.pool.num_used,
        )
        cost = self.cost_model.step(batch)
        num_running, num_waiting = len(self.running), len(self.waiting)

        outputs: list[TokenOutput] = []
        block_size = self.pool.block_size
        for req, n_new in scheduled:
            req.num_computed += n_new
            if req.num_computed < req.prompt_len:
                self.pool.cache_blocks(req.request_id, req.hashes(block_size), req.num_computed)
                continue
            if req.num_computed < req.total_tokens:
                continue  # still recomputing after a preemption
            if not req.output_token_ids:
                self.pool.cache_blocks(req.request_id, req.hashes(block_size), req.prompt_len)
            token = next_token_id(req, self.vocab_size)
            req.output_token_ids.append(token)
            finished = len(req.output_token_ids) >= req.target_tokens
            if finished:
                req.finish_reason = "length" if req.target_tokens >= req.max_tokens else "stop"
                self.running.remove(req)
                self.pool.free(req.request_id)
            outputs.append(TokenOutput(req, [token], finished))

        self._step_id += 1
        return StepResult(
            step_id=self._step_id,
            cost=cost,
            batch=batch,
            outputs=outputs,
            num_running=num_running,
            num_waiting=num_waiting,
            num_preempted=preempted,
            kv_cache_usage=self.pool.usage,
            prefill_tokens=prefill_tokens,
            decode_tokens=decode_tokens,
        )
