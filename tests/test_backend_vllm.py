"""capo_train.backends.vllm: the CPU-checkable parts (end reasons, sampled log-probs, the weights handed to
the engine from a LoRA actor), and, where vLLM and a GPU are present, generation against the trainer's own
forward pass and weight sync. Without them the GPU tests skip; the OpenAI-compatible path against
``capo serve`` covers the same interface on CPU (tests/test_backend_openai.py)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from capo_train.backends.vllm import (
    VLLMBackend,
    _engine_model,
    cut_after_stop,
    end_reason,
    sampled_logprobs,
    trainer_weights,
)

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_gpu = pytest.mark.skipif(not (HAS_VLLM and torch.cuda.is_available()), reason="needs vllm and a GPU")


def test_end_reasons_stay_apart():
    assert end_reason("stop", "</search>") == "stop"
    assert end_reason("stop", None) == "eos"
    assert end_reason("stop", 2) == "eos"  # a stop token id
    assert end_reason("length", None) == "length"
    with pytest.raises(RuntimeError, match="abort"):
        end_reason("abort", None)


def test_sampled_logprobs_pick_the_sampled_tokens():
    steps = [{5: SimpleNamespace(logprob=-0.5)}, {7: SimpleNamespace(logprob=-1.25), 3: SimpleNamespace(logprob=-3.0)}]
    assert sampled_logprobs([5, 7], steps) == [-0.5, -1.25]
    with pytest.raises(RuntimeError):
        sampled_logprobs([5, 7], None)


def test_tokens_past_the_first_stop_string_are_cut():
    from capo_train.models import make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    ids = tok.encode("<search>cats</search> and more", add_special_tokens=False)
    cut = cut_after_stop(ids, ["</search>"], tok)
    assert tok.decode(cut) == "<search>cats</search>"  # ends with the token completing the stop string
    done = tok.encode("<search>cats</search>", add_special_tokens=False)
    assert cut_after_stop(done, ["</search>"], tok) == done  # the usual case: untouched
    assert cut_after_stop(ids, [], tok) == ids and cut_after_stop(ids, ["</answer>"], tok) == ids
    twice = tok.encode("<a>x</a><a>y</a>", add_special_tokens=False)
    assert tok.decode(cut_after_stop(twice, ["</a>"], tok)) == "<a>x</a>"  # the first occurrence


def engine_with(mode=None, executor=None):
    """An object shaped like vLLM's ``LLM`` as far as the backend reads it."""
    return SimpleNamespace(llm_engine=SimpleNamespace(model_config=SimpleNamespace(logprobs_mode=mode),
                                                      **({"model_executor": executor} if executor else {})))


def test_engines_returning_logits_are_refused():
    from capo_train.models import make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    assert VLLMBackend(engine_with("processed_logprobs"), tok).processed_logprobs
    assert not VLLMBackend(engine_with("raw_logprobs"), tok).processed_logprobs
    for mode in ("raw_logits", "processed_logits"):
        with pytest.raises(ValueError, match="processed_logprobs"):
            VLLMBackend(engine_with(mode), tok)


def test_the_engine_model_is_reached_in_process_or_a_clear_error():
    model = torch.nn.Linear(2, 2)
    runner = SimpleNamespace(get_model=lambda: model, model="a CUDA-graph wrapper")
    in_process = SimpleNamespace(driver_worker=SimpleNamespace(worker=SimpleNamespace(model_runner=runner)))
    assert _engine_model(engine_with("processed_logprobs", in_process)) is model  # get_model() unwraps
    with pytest.raises(RuntimeError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        _engine_model(engine_with("processed_logprobs"))  # V1 with its engine-core subprocess: no model_executor


def test_weights_from_a_lora_actor_are_the_merged_model_under_hf_names():
    from capo_train.models import make_tiny_llama
    from capo_train.models.actor_critic import LoraSettings, _lora

    model, _ = make_tiny_llama(hidden_size=16, num_layers=1, seed=0)
    plain_names = set(model.state_dict())
    peft_model = _lora(model, LoraSettings(r=4, alpha=8, last_layers=0), task_type="CAUSAL_LM")
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_()  # a trained adapter: merging changes the weights
    peft_model.merge_adapter()
    sent = {name: t.clone() for name, t in trainer_weights(peft_model)}
    peft_model.unmerge_adapter()
    assert set(sent) == plain_names
    merged = peft_model.merge_and_unload().state_dict()
    for name, tensor in sent.items():
        torch.testing.assert_close(tensor, merged[name], msg=name)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from capo_train.backends.vllm import VLLMBackend
    from capo_train.models import make_tiny_llama

    path = tmp_path_factory.mktemp("tiny-vllm")
    model, tokenizer = make_tiny_llama(hidden_size=64, num_layers=2, seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    backend = VLLMBackend.from_pretrained(str(path), tokenizer, dtype="float32", gpu_memory_utilization=0.2,
                                          enforce_eager=True)
    return backend, model.cuda(), tokenizer


@needs_gpu
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_logprobs_match_the_training_pass(engine, temperature):
    from capo_train.models.logprobs import lm_logp

    backend, model, tokenizer = engine
    prompt = tokenizer.encode("Question: which door? Answer:")
    generations = backend.generate([prompt] * 4, stop=[], max_new_tokens=16, temperature=temperature, seed=1)
    for gen in generations:
        ids = torch.tensor([prompt + gen.token_ids], device="cuda")
        logp = lm_logp(model, ids, torch.ones_like(ids), temperature=temperature)[0][0]
        trained = logp[len(prompt) - 1 : len(prompt) - 1 + len(gen.token_ids)].tolist()
        assert gen.finish_reason in ("eos", "length")
        assert trained == pytest.approx(gen.logprobs, abs=1e-3)


@needs_gpu
def test_vllm_stop_string_and_weight_sync(engine):
    backend, model, tokenizer = engine
    prompt = tokenizer.encode("abc")
    before = backend.generate([prompt], stop=[], max_new_tokens=8, greedy=True, seed=0)[0]
    with torch.no_grad():
        model.lm_head.weight.add_(torch.randn_like(model.lm_head.weight))
    backend.sync_weights(model)
    after = backend.generate([prompt], stop=[], max_new_tokens=8, greedy=True, seed=0)[0]
    hf = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=8, do_sample=False)[0, len(prompt):]
    assert after.token_ids == hf.tolist()[: len(after.token_ids)] and after.token_ids != before.token_ids
    text = tokenizer.decode(after.token_ids)
    if len(text) > 2:  # stop on a piece of the greedy text: ends on the token that completes it
        stopped = backend.generate([prompt], stop=[text[1:3]], max_new_tokens=8, greedy=True, seed=0)[0]
        assert stopped.finish_reason == "stop" and text[1:3] in stopped.text
        assert text[1:3] not in tokenizer.decode(stopped.token_ids[:-1])
