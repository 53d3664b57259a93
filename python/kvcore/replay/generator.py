"""The built-in workload: what ``kvcore replay`` runs when no trace is given.

Why a generator: real traces are large, third-party and not shipped; an operator's first run needs a
workload with the structures that make prefix caching pay (and fail) in production, reproducible from
a seed:

- **shared system prompts** (a few, Zipf popularity): every session starts with one;
- **tool definitions** (Zipf popularity) after the system prompt in a share of the chats: the
  (system prompt, tools) prefix is shared too;
- **multi-turn chats**: turn ``k + 1``'s prompt is turn ``k``'s prompt, its answer, and a new user
  message, arriving a think time later; the answer's block ids are recorded (``output_ids``), so in
  timed mode the decoded answer is cached and the next turn can hit it;
- **RAG queries**: one turn, system prompt plus a retrieved document nobody else sends (unique,
  polluting the cache);
- **VIP sessions**: a share of sessions with retention priority 1 (for the ``priority`` policy).

Sessions arrive as a Poisson process. Every segment is a whole number of blocks (``block_size``,
16 tokens by default), so a block never straddles two segments and a hash id is exactly "this
prefix": ids are prefix-chained as in Mooncake's traces, and the trace can be written as Mooncake JSONL.
Same config, same workload: every draw comes from one ``numpy.random.Generator`` seeded by ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvcore.exceptions import ConfigError
from kvcore.replay.trace import Trace

__all__ = ["WorkloadConfig", "generate_workload"]


@dataclass(frozen=True)
class WorkloadConfig:
    """Knobs of the built-in workload. Lengths are means of lognormal draws (rounded up to blocks)."""

    seed: int = 0  # RNG seed: the same config always gives the same workload
    num_requests: int = 4000  # requests kept (the earliest, so the window is cut, not the sessions)
    block_size: int = 16  # tokens per hash id; every segment is a multiple of it, >= 1
    session_rate: float = 2.0  # new sessions per second (Poisson), > 0
    num_system_prompts: int = 12  # distinct system prompts, >= 1
    system_prompt_tokens: int = 1500  # mean system prompt length
    num_tool_sets: int = 24  # distinct tool-definition blocks, >= 1
    tool_tokens: int = 2000  # mean tool-definition length
    tool_share: float = 0.5  # share of chats whose prompt includes tools, in [0, 1]
    zipf_exponent: float = 1.2  # popularity of system prompts and tool sets: rank r has weight r^-s
    rag_share: float = 0.3  # share of sessions that are one-turn RAG queries, in [0, 1]
    document_tokens: int = 6000  # mean retrieved-document length (RAG), unique per query
    mean_turns: float = 5.0  # mean turns of a chat (geometric), >= 1
    user_tokens: int = 150  # mean user message length
    answer_tokens: int = 250  # mean answer (output) length
    think_time_s: float = 30.0  # mean time between a turn and the next (exponential), > 0
    max_prompt_tokens: int = 65536  # a chat ends before its prompt would exceed this
    vip_share: float = 0.1  # share of sessions with retention priority 1, in [0, 1]; 0: no priorities

    def __post_init__(self) -> None:
        if (
            self.num_requests < 1
            or self.block_size < 1
            or self.num_system_prompts < 1
            or self.num_tool_sets < 1
        ):
            raise ConfigError("num_requests, block_size, num_system_prompts and num_tool_sets must be >= 1")
        if not (self.session_rate > 0 and self.think_time_s > 0 and self.mean_turns >= 1):
            raise ConfigError("session_rate and think_time_s must be > 0, mean_turns >= 1")
        for name in ("tool_share", "rag_share", "vip_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"{name} must be in [0, 1]")


class _Ids:
    """Hands out fresh, consecutive hash ids (consecutive ids make token building a single range)."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, num_blocks: int) -> npt.NDArray[np.int64]:
        ids = np.arange(self.next, self.next + num_blocks, dtype=np.int64)
        self.next += num_blocks
        return ids


def _zipf_weights(n: int, s: float) -> npt.NDArray[np.float64]:
    w: npt.NDArray[np.float64] = np.arange(1, n + 1, dtype=np.float64) ** -s
    return w / float(w.sum())


class _Builder:
    def __init__(self, cfg: WorkloadConfig) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.ids = _Ids()
        bs = cfg.block_size
        self.sys_w = _zipf_weights(cfg.num_system_prompts, cfg.zipf_exponent)
        self.tool_w = _zipf_weights(cfg.num_tool_sets, cfg.zipf_exponent)
        # Prefix ids are made on first use: the (system, tools) prefix continues the system's ids.
        self.sys_blocks = [self.blocks(cfg.system_prompt_tokens) for _ in range(cfg.num_system_prompts)]
        self.tool_blocks = [self.blocks(cfg.tool_tokens) for _ in range(cfg.num_tool_sets)]
        self.prefixes: dict[tuple[int, int], npt.NDArray[np.int64]] = {}
        self.max_blocks = max(1, cfg.max_prompt_tokens // bs)
        # One row per request: (time s, prompt ids, output blocks ids, output tokens, priority)
        self.times: list[float] = []
        self.prompts: list[npt.NDArray[np.int64]] = []
        self.answers: list[npt.NDArray[np.int64]] = []
        self.priorities: list[int] = []

    def blocks(self, mean_tokens: int) -> int:
        """A lognormal length (sigma 0.6) with the given mean, in whole blocks (>= 1)."""
        sigma = 0.6
        tokens = self.rng.lognormal(np.log(max(mean_tokens, 1)) - sigma**2 / 2, sigma)
        return max(1, int(np.ceil(tokens / self.cfg.block_size)))

    def prefix(self, system: int, tools: int) -> npt.NDArray[np.int64]:
        """Ids of a system prompt (tools == -1) or of a system prompt followed by a tool set."""
        key = (system, tools)
        ids = self.prefixes.get(key)
        if ids is None:
            if tools < 0:
                ids = self.ids.take(self.sys_blocks[system])
            else:
                ids = np.concatenate([self.prefix(system, -1), self.ids.take(self.tool_blocks[tools])])
            self.prefixes[key] = ids
        return ids

    def add(self, t: float, prompt: npt.NDArray[np.int64], answer: npt.NDArray[np.int64], prio: int) -> None:
        self.times.append(t)
        self.prompts.append(prompt)
        self.answers.append(answer)
        self.priorities.append(prio)

    def session(self, t: float) -> None:
        cfg, rng = self.cfg, self.rng
        system = int(rng.choice(cfg.num_system_prompts, p=self.sys_w))
        prio = int(rng.random() < cfg.vip_share)
        if rng.random() < cfg.rag_share:
            prompt = np.concatenate(
                [
                    self.prefix(system, -1),
                    self.ids.take(self.blocks(cfg.document_tokens) + self.blocks(cfg.user_tokens)),
                ]
            )[: self.max_blocks]
            self.add(t, prompt, self.ids.take(self.blocks(cfg.answer_tokens)), prio)
            return
        tools = int(rng.choice(cfg.num_tool_sets, p=self.tool_w)) if rng.random() < cfg.tool_share else -1
        turns = int(rng.geometric(1.0 / cfg.mean_turns))
        context = self.prefix(system, tools)
        for _ in range(turns):
            prompt = np.concatenate([context, self.ids.take(self.blocks(cfg.user_tokens))])
            if len(prompt) > self.max_blocks:
                break
            answer = self.ids.take(self.blocks(cfg.answer_tokens))
            self.add(t, prompt, answer, prio)
            context = np.concatenate([prompt, answer])
            t += float(rng.exponential(cfg.think_time_s))

    def build(self) -> Trace:
        cfg, rng = self.cfg, self.rng
        n = cfg.num_requests
        t = 0.0
        cutoff = np.inf  # arrival time of the n-th earliest request so far
        while True:
            t += float(rng.exponential(1.0 / cfg.session_rate))
            if t > cutoff:  # no later session can have a request among the n earliest
                break
            self.session(t)
            if len(self.times) >= n:
                cutoff = float(np.partition(np.asarray(self.times), n - 1)[n - 1])
        order = np.argsort(np.asarray(self.times), kind="stable")[:n]
        bs = cfg.block_size
        prompts = [self.prompts[i] for i in order]
        answers = [self.answers[i] for i in order]
        counts = np.array([len(p) for p in prompts], dtype=np.int64)
        out_counts = np.array([len(a) for a in answers], dtype=np.int64)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        out_indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(out_counts, out=out_indptr[1:])
        times_ms = np.round(np.asarray(self.times)[order] * 1000.0)
        prios = np.asarray([self.priorities[i] for i in order], dtype=np.int32)
        return Trace(
            input_lens=counts * bs,
            output_lens=out_counts * bs,
            hash_indptr=indptr,
            hash_ids=np.concatenate(prompts),
            block_size=bs,
            timestamps_ms=times_ms - times_ms[0],
            priorities=prios if cfg.vip_share > 0 else None,
            output_indptr=out_indptr,
            output_ids=np.concatenate(answers),
            name=f"built-in workload (seed {cfg.seed})",
        )


def generate_workload(config: WorkloadConfig | None = None) -> Trace:
    """Generate the built-in workload (see the module docs); deterministic for a given ``config``."""
    return _Builder(config or WorkloadConfig()).build()
