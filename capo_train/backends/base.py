"""The generation interface the rollout talks to: token ids in, token ids and their log-probs out.

The rollout never re-tokenises generated text ("token-space consistency", a goal of the authors' code,
AgentR1/StepPO README): a backend returns the exact sampled ids, and the log-prob of each under the
distribution it was sampled from. Those log-probs are the rollout's *old* log-probs, so a backend must
compute them from the same logits it sampled from.

Implementations:
- :class:`capo_train.backends.hf.HFBackend`: a Hugging Face model in this process (the reference).
- :class:`capo_train.backends.vllm.VLLMBackend` (``rollout.backend=vllm``): ``LLM.generate([TokensPrompt(
  prompt_token_ids=p) for p in prompts], [SamplingParams(temperature=..., max_tokens=..., stop=...,
  include_stop_str_in_output=True, logprobs=0, seed=...) per prompt])``; ``token_ids`` = ``output.token_ids``, ``logprobs`` from ``output.logprobs`` (with
  ``logprobs_mode="processed_logprobs"`` when temperature != 1), ``finish_reason`` from ``output``
  (``"stop"`` with a ``stop_reason`` string = a stop string, with ``None`` = EOS).
- :class:`capo_train.backends.openai.OpenAIBackend`: an OpenAI-compatible server (vLLM, or ``capo serve``):
  ``POST /v1/completions`` with ``prompt`` = the token ids, ``logprobs=1`` and vLLM's
  ``return_tokens_as_token_ids=true``, so ids come back without re-tokenising.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence


@dataclass
class Generation:
    """One generated action.

    token_ids:     the sampled tokens, exactly as sampled (the EOS token included when it was sampled).
    logprobs:      per token, log p(token | prefix) under the distribution it was sampled from:
                   ``log_softmax(logits / temperature)``. At temperature 1 (the training default) this is
                   the model's own log-prob, i.e. the old log-prob the losses need. Greedy decoding picks
                   the argmax and still records ``log_softmax(logits / temperature)`` of it (T=1 when
                   greedy is asked for with temperature 0).
    text:          ``tokenizer.decode(token_ids, skip_special_tokens=True)``: for the env only, never
                   tokenised again.
    finish_reason: ``"stop"`` (a stop string completed on the last token), ``"eos"`` or ``"length"``.
    features:      ``[L, H]`` float32, only from ``HFBackend(keep_features=True)``: the model's final hidden
                   state before each generated token (row 0 at the prompt's last token, row j at token j).
                   A value head on the actor's features reads V(s_t) and the per-token values from these,
                   so the trainer skips its critic pass over the batch (``update.values_from_features``).
    frozen_states: ``[len(prompt) + len(token_ids) - 1, H]`` in the model's dtype, only from
                   ``HFBackend(keep_frozen_states=True)`` on a model with frozen leading layers: the hidden
                   state entering the first trainable layer at every position the backend fed (the prompt,
                   then every generated token but the last, which nothing reads). The update runs only the
                   trainable layers from these (``rollout.frozen_layers_from_rollout``).
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    features: Any = None
    frozen_states: Any = None


class GenerationBackend(Protocol):
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
        """One :class:`Generation` per prompt, in order. Each continuation ends at the first completed
        stop string (the token that completes it is kept, nothing after it), at EOS, or after
        ``max_new_tokens`` tokens. The same ``seed`` and inputs give the same output."""
        ...


def check_generate_args(
    prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float, greedy: bool
) -> None:
    """Raise ``ValueError`` for arguments no backend can honour, before any work (or request) is done."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature <= 0 and not greedy:
        raise ValueError(f"temperature must be > 0 (use greedy=True for argmax), got {temperature}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
