"""``HFBackend``: batched sampling from a Hugging Face causal LM with exact per-token log-probs.

Our own loop rather than ``model.generate``: we need the log-prob of every sampled token under the very
logits it was sampled from, and a stop-string check per sequence per step. Each batch is left-padded
(attention mask and position ids say where each prompt starts), prefilled once, then decoded one token
per step with the KV cache. A sequence that finishes is dropped from the batch and from the cache, so
it stops costing compute.
"""

from __future__ import annotations

import inspect
from typing import Sequence

import torch

from .base import Generation


class HFBackend:
    """Generate with ``model`` (a ``*ForCausalLM``) and ``tokenizer`` (for EOS, padding and decoding).

    ``batch_size`` prompts are generated together; more prompts run in successive batches. The model is
    put in eval mode for the call and restored afterwards.
    """

    def __init__(self, model, tokenizer, *, batch_size: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        eos = {tokenizer.eos_token_id}
        config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos |= set(config_eos) if isinstance(config_eos, (list, tuple)) else {config_eos}
        self.eos_ids = frozenset(i for i in eos if i is not None)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids, default=0)  # masked out anyway
        # transformers >= 5.2x names the KV cache argument and output ``cache``; older versions
        # ``past_key_values``.
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # under a peft wrapper
        params = inspect.signature(inner.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        stop: Sequence[str],
        max_new_tokens: int,
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int | None = None,
    ) -> list[Generation]:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature <= 0 and not greedy:
            raise ValueError(f"temperature must be > 0 (use greedy=True for argmax), got {temperature}")
        if temperature <= 0:  # greedy with T=0: record the model's own (T=1) log-probs
            temperature = 1.0
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        try:
            out: list[Generation] = []
            for start in range(0, len(prompts), self.batch_size):
                chunk = prompts[start : start + self.batch_size]
                out += self._generate_batch(chunk, list(stop), max_new_tokens, temperature, greedy, generator)
            return out
        finally:
            self.model.train(was_training)

    @torch.inference_mode()
    def _generate_batch(self, prompts, stop, max_new_tokens, temperature, greedy, generator) -> list[Generation]:
        n, P = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((n, P), self.pad_id, dtype=torch.long)  # [n, P] left-padded
        attention_mask = torch.zeros(n, P, dtype=torch.long)  # [n, P]
        for b, p in enumerate(prompts):
            input_ids[b, P - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            attention_mask[b, P - len(p) :] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)  # [n, P]: each prompt starts at 0

        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,  # only the last position's logits: [n, 1, V], not [n, P, V]
        )
        logits, cache = out.logits[:, -1], out[self._cache_arg]  # [n, V]
        next_pos = position_ids[:, -1] + 1  # [n]
        active = list(range(n))  # prompt index of each row still in the batch
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        finish: list[str] = ["length"] * n
        # A stop string of k UTF-8 bytes spans at most k tokens (each token adds >= 1 byte of it), so
        # decoding a short tail each step finds it without re-decoding the whole continuation.
        tail = max((len(s.encode("utf-8")) for s in stop), default=0) + 2

        for _ in range(max_new_tokens):
            logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [a, V]
            if greedy:
                tok = logp.argmax(-1)  # [a]
            else:
                tok = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)  # [a]
            tok_logp = logp.gather(1, tok[:, None]).squeeze(1)  # [a]

            keep = []  # rows (positions in the current batch) that go on
            for row, (b, t, lp) in enumerate(zip(active, tok.tolist(), tok_logp.tolist())):
                tokens[b].append(t)
                logprobs[b].append(lp)
                if t in self.eos_ids:
                    finish[b] = "eos"
                elif stop and self._stop_completed(tokens[b], stop, tail):
                    finish[b] = "stop"
                elif len(tokens[b]) < max_new_tokens:
                    keep.append(row)
            if not keep:
                break
            if len(keep) < len(active):  # drop finished rows from the batch and the KV cache
                idx = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(idx)
                attention_mask, next_pos, tok = attention_mask[idx], next_pos[idx], tok[idx]
                active = [active[row] for row in keep]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(active), 1)], dim=1)
            out = self.model(
                input_ids=tok[:, None],  # [a, 1]
                attention_mask=attention_mask,  # [a, P + steps]
                position_ids=next_pos[:, None],  # [a, 1]
                use_cache=True,
                **{self._cache_arg: cache},
            )
            logits, cache = out.logits[:, -1], out[self._cache_arg]
            next_pos = next_pos + 1

        return [
            Generation(ids, lps, self.tokenizer.decode(ids, skip_special_tokens=True), reason)
            for ids, lps, reason in zip(tokens, logprobs, finish)
        ]

    def _stop_completed(self, ids: list[int], stop: list[str], tail: int) -> bool:
        """Whether a stop string appears in the decoded last ``tail`` tokens.

        Checked after every token, so a hit is always one that the newest token completed. (A tokenizer
        that drops a leading space when decoding a tail could miss a stop string that starts with one.)
        """
        text = self.tokenizer.decode(ids[-tail:], skip_special_tokens=True)
        return any(s in text for s in stop)
