"""``HFBackend``: batched sampling from a Hugging Face causal LM with exact per-token log-probs.

Our own loop rather than ``model.generate``: we need the log-prob of every sampled token under the very
logits it was sampled from, and a stop-string check per sequence per step. Each batch is left-padded
(attention mask and position ids say where each prompt starts), prefilled once, then decoded one token
per step with the KV cache. A sequence that finishes is dropped from the batch and from the cache, so
it stops costing compute.

Prefix reuse: in a multi-turn rollout with concatenated states, the next prompt of an episode is the
previous prompt + the action + the observation. The backend keeps the KV cache of every sequence it
finished in its last call, and a prompt that extends one of them prefills only its new tokens. On CPU
this removes most of a rollout's cost (re-reading the growing prompt every turn). A window state's prompt is
rebuilt each step, so it extends none of them, but it shares its head (the system prompt and the task) with
the episode's last sequence: ``common_prefixes=True`` reuses the cache of the longest head a prompt shares
with any of them, cut there. A backend is meant to live for one rollout: build a new one (or call
``clear_prefixes``) after the weights change.

Features (``keep_features=True``): the decoder's final hidden state at the prompt's last position and at
every fed-back token is what a value head on the actor's features reads, so each :class:`Generation` can
carry them (``[L, H]``) at no extra compute; the trainer then skips its critic pass over the whole batch,
which on CPU cost as much as the rollout itself.

Frozen-layer states (``keep_frozen_states=True``): with LoRA on the last layers only, the first
``frozen_prefix_layers(model)`` decoder layers never change, so their output for a token is the same in the
rollout and in the update. The backend keeps the hidden state entering the first trainable layer at every
position it feeds (a pre-hook on that layer, in the prefill and in each decode step; a reused prefix brings
its own), and each :class:`Generation` carries them for its whole sequence, prompt included, so the update
runs only the trainable layers (``rollout.frozen_layers_from_rollout``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Sequence

import torch

from ..models.logprobs import frozen_prefix_layers
from .base import Generation, check_generate_args


@dataclass
class _Prefix:
    """A finished sequence's tokens and its KV cache (per layer ``(keys, values)``, each ``[H, len, D]``);
    ``states``: the ``[len, H]`` hidden states entering the first trainable layer (``keep_frozen_states``)."""

    tokens: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    states: torch.Tensor | None = None

    @classmethod
    def of_row(cls, tokens: list[int], cache, attention_mask: torch.Tensor, row: int,
               states: torch.Tensor | None = None) -> "_Prefix":
        real = attention_mask[row].bool()  # [S]: the row's real positions, in order
        kv = [(layer.keys[row][:, real[: layer.keys.shape[2]]].clone(),
               layer.values[row][:, real[: layer.values.shape[2]]].clone()) for layer in cache.layers]
        if kv and kv[0][0].shape[1] != len(tokens):
            raise RuntimeError(f"KV cache holds {kv[0][0].shape[1]} positions for {len(tokens)} tokens")
        return cls(tokens, kv, states)

    def cut(self, n: int) -> "_Prefix":
        """The first ``n`` tokens of this sequence, with their cache (a position's keys, values and states
        depend only on the tokens up to it)."""
        return _Prefix(self.tokens[:n], [(k[:, :n], v[:, :n]) for k, v in self.kv],
                       None if self.states is None else self.states[:n])


def _common_length(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class HFBackend:
    """Generate with ``model`` (a ``*ForCausalLM``) and ``tokenizer`` (for EOS, padding and decoding).

    ``batch_size`` prompts are generated together; more prompts run in successive batches. The model is
    put in eval mode for the call and restored afterwards.
    """

    def __init__(self, model, tokenizer, *, batch_size: int = 16, reuse_prefixes: bool = True,
                 common_prefixes: bool = False, keep_features: bool = False, keep_frozen_states: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.reuse_prefixes = reuse_prefixes
        self.common_prefixes = common_prefixes  # reuse a cached sequence's shared head too (rollout.reuse_common_prefix)
        self.keep_features = keep_features
        self._prefixes: list[_Prefix] = []  # the sequences finished in the last generate call
        self.prefilled_tokens = self.reused_tokens = 0  # counters, for benchmarks and tests
        eos = {tokenizer.eos_token_id}
        config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos |= set(config_eos) if isinstance(config_eos, (list, tuple)) else {config_eos}
        self.eos_ids = frozenset(i for i in eos if i is not None)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids, default=0)  # masked out anyway
        # transformers >= 5.2x names the KV cache argument and output ``cache``; older versions
        # ``past_key_values``.
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # under a peft wrapper
        self._config = inner.config  # for building KV caches of reused prefixes
        self._decoder = inner.get_decoder() if keep_features else None
        self._last_hidden: torch.Tensor | None = None  # [rows, H]: the decoder's last position, per forward
        # keep_frozen_states: the first trainable layer (None: no frozen layers, nothing to keep) and its
        # input in the last forward, [rows, positions, H]
        self.frozen_layers = frozen_prefix_layers(model) if keep_frozen_states else None
        self._first_trainable = None if self.frozen_layers is None else inner.get_decoder().layers[self.frozen_layers]
        self._frozen_input: torch.Tensor | None = None
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
        check_generate_args(prompts, max_new_tokens, temperature, greedy)
        if temperature <= 0:  # greedy with T=0: record the model's own (T=1) log-probs
            temperature = 1.0
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        finished: list[_Prefix] = []
        hook = self._decoder.register_forward_hook(self._keep_last_hidden) if self._decoder is not None else None
        frozen_hook = None
        if self._first_trainable is not None:
            frozen_hook = self._first_trainable.register_forward_pre_hook(self._keep_frozen_input, with_kwargs=True)
        try:
            out: list[Generation] = []
            for start in range(0, len(prompts), self.batch_size):
                chunk = prompts[start : start + self.batch_size]
                out += self._generate_batch(chunk, list(stop), max_new_tokens, temperature, greedy, generator, finished)
            return out
        finally:
            for h in (hook, frozen_hook):
                if h is not None:
                    h.remove()
            self._last_hidden = self._frozen_input = None
            self.model.train(was_training)
            self._prefixes = finished if self.reuse_prefixes else []

    def _keep_last_hidden(self, module, args, output) -> None:
        """Forward hook on the decoder: keep its final hidden state at the last position, ``[rows, H]``."""
        hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
        self._last_hidden = hidden[:, -1].float()

    def _keep_frozen_input(self, module, args, kwargs) -> None:
        """Forward pre-hook on the first trainable layer: keep its input hidden states, ``[rows, P, H]``."""
        self._frozen_input = args[0] if args else kwargs["hidden_states"]

    def clear_prefixes(self) -> None:
        """Forget the cached prefixes (needed if the model's weights changed since the last call)."""
        self._prefixes = []

    def _longest_prefix(self, prompt: list[int]) -> _Prefix | None:
        """The longest cached sequence that is a strict prefix of ``prompt`` (at least one new token); with
        ``common_prefixes``, the longest head ``prompt`` shares with any cached sequence, cut there (a window
        state's prompt shares its system prompt and task with the episode's last sequence, not its end)."""
        best, best_n = None, 0
        for prefix in self._prefixes:
            if self.common_prefixes:
                n = min(_common_length(prefix.tokens, prompt), len(prompt) - 1)
            else:
                n = len(prefix.tokens)
                n = n if n < len(prompt) and prompt[:n] == prefix.tokens else 0
            if n > best_n:
                best, best_n = prefix, n
        if best is None or best_n == len(best.tokens):
            return best
        return best.cut(best_n)

    @torch.inference_mode()
    def prompt_features(self, prompts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """The final hidden state (``[H]`` float32 each) at each prompt's last position, from a prefill alone
        that reuses the cached prefixes and leaves them as they are (``keep_features`` only). A truncated
        episode's last state extends the sequence its last action finished, so a shared critic's bootstrap
        value V(s_{T+1}) costs the final observation's tokens instead of a pass over the whole episode."""
        if not self.keep_features:
            raise RuntimeError("prompt_features needs HFBackend(keep_features=True)")
        was_training = self.model.training
        self.model.eval()
        hook = self._decoder.register_forward_hook(self._keep_last_hidden)
        try:
            out: list[torch.Tensor] = []
            for start in range(0, len(prompts), self.batch_size):
                self._prefill([list(p) for p in prompts[start : start + self.batch_size]])
                out += list(self._last_hidden)
            return out
        finally:
            hook.remove()
            self._last_hidden = None
            self.model.train(was_training)

    def _prefill(self, prompts: list[list[int]]):
        """One forward over the prompts' new tokens after their longest cached prefixes; returns the model's
        output (last position's logits, KV cache), the ``[n, Q + P]`` attention mask, ``[n, P]`` positions and
        the reused prefix of each prompt (None where none)."""
        n = len(prompts)
        reused = [self._longest_prefix(p) if self.reuse_prefixes else None for p in prompts]
        past = [len(r.tokens) if r else 0 for r in reused]  # tokens whose KV is reused, per prompt
        Q, P = max(past), max(len(p) - k for p, k in zip(prompts, past))  # reused / new columns
        # Columns: [Q reused positions | P new positions], each block left-padded.
        input_ids = torch.full((n, P), self.pad_id, dtype=torch.long)  # [n, P]
        attention_mask = torch.zeros(n, Q + P, dtype=torch.long)  # [n, Q + P]
        position_ids = torch.zeros(n, P, dtype=torch.long)  # [n, P]
        for b, (p, k) in enumerate(zip(prompts, past)):
            new = p[k:]
            input_ids[b, P - len(new) :] = torch.as_tensor(new, dtype=torch.long)
            attention_mask[b, Q - k : Q] = 1
            attention_mask[b, Q + P - len(new) :] = 1
            position_ids[b, P - len(new) :] = torch.arange(k, len(p))  # positions continue the prefix's
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        position_ids = position_ids.to(self.device)
        kwargs = {}
        if Q:
            kwargs[self._cache_arg] = self._stacked_cache(reused, Q)
        self.prefilled_tokens += sum(len(p) - k for p, k in zip(prompts, past))
        self.reused_tokens += sum(past)

        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,  # only the last position's logits: [n, 1, V], not [n, P, V]
            **kwargs,
        )
        return out, attention_mask, position_ids, reused

    @torch.inference_mode()
    def _generate_batch(self, prompts, stop, max_new_tokens, temperature, greedy, generator, finished) -> list[Generation]:
        prompts = [list(p) for p in prompts]
        n = len(prompts)
        out, attention_mask, position_ids, reused = self._prefill(prompts)
        logits, cache = out.logits[:, -1], out[self._cache_arg]  # [n, V]
        # states[b]: pieces of the hidden states entering the first trainable layer at each position sequence b
        # fed so far ([len, H] each): the reused prefix's, the prefill's new positions (left-padded: the
        # last ones of the row), then one per decode step. None when it cannot be whole (a reused prefix
        # recorded without them).
        states: list[list[torch.Tensor] | None] = [None] * n
        if self.frozen_layers is not None:
            for b, (p, r) in enumerate(zip(prompts, reused)):
                if r is None or r.states is not None:
                    new = len(p) - (len(r.tokens) if r else 0)
                    states[b] = ([r.states] if r else []) + [self._frozen_input[b, self._frozen_input.shape[1] - new :]]
        finished_states: list[torch.Tensor | None] = [None] * n  # states[b] joined: [len(prompt) + len(tokens) - 1, H]
        next_pos = position_ids[:, -1] + 1  # [n]
        active = list(range(n))  # prompt index of each row still in the batch
        # features[b][j]: the final hidden state before token j of sequence b ([H] each; keep_features only)
        features: list[list[torch.Tensor]] = [[h] for h in self._last_hidden] if self.keep_features else []
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
                    continue
                if states and states[b] is not None:  # every position fed: the prompt and all but the last token
                    finished_states[b] = torch.cat(states[b]) if len(states[b]) > 1 else states[b][0].clone()
                if self.reuse_prefixes:  # its KV covers the prompt and every token but the last sampled
                    finished.append(_Prefix.of_row(prompts[b] + tokens[b][:-1], cache, attention_mask, row,
                                                   finished_states[b]))
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
            if self.keep_features:
                for b, h in zip(active, self._last_hidden):
                    features[b].append(h)
            if self.frozen_layers is not None:
                for b, h in zip(active, self._frozen_input):  # h: [1, H], the token just fed
                    if states[b] is not None:
                        states[b].append(h)

        return [
            Generation(ids, lps, self.tokenizer.decode(ids, skip_special_tokens=True), reason,
                       torch.stack(features[b]) if self.keep_features else None, finished_states[b])
            for b, (ids, lps, reason) in enumerate(zip(tokens, logprobs, finish))
        ]

    def _stacked_cache(self, reused: list, Q: int):
        """A batch KV cache of ``Q`` columns: each row's reused prefix, left-padded (pads are masked)."""
        from transformers import DynamicCache

        layers = []
        template = next(r for r in reused if r is not None).kv
        for layer, (k0, v0) in enumerate(template):
            keys = k0.new_zeros(len(reused), k0.shape[0], Q, k0.shape[2])  # [n, H, Q, D]
            values = v0.new_zeros(len(reused), v0.shape[0], Q, v0.shape[2])
            for b, r in enumerate(reused):
                if r is not None:
                    k, v = r.kv[layer]  # [H, len, D]
                    keys[b, :, Q - k.shape[1] :], values[b, :, Q - v.shape[1] :] = k, v
            layers.append((keys, values))
        return DynamicCache(ddp_cache_data=layers, config=self._config)

    def _stop_completed(self, ids: list[int], stop: list[str], tail: int) -> bool:
        """Whether a stop string appears in the decoded last ``tail`` tokens.

        Checked after every token, so a hit is always one that the newest token completed. (A tokenizer
        that drops a leading space when decoding a tail could miss a stop string that starts with one.)
        """
        text = self.tokenizer.decode(ids[-tail:], skip_special_tokens=True)
        return any(s in text for s in stop)
