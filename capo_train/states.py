"""States: the token ids the policy is conditioned on at step t, built from the env's text.

- :class:`ConcatState` (``rollout.state=concat``): ``state_{t+1} = state_t + action_t + obs_t``, a growing
  chat. Every state is a prefix of the later ones, so the ``packed`` row layout applies.
- :class:`WindowState` (``rollout.state=window``): the prompt is rebuilt each step from the task, the last
  ``k`` (observation, action) pairs and the current observation, as the CAPO recipes do for ALFWorld and
  WebShop (the authors' code: AgentR1/CAPO, ``recipe/<env>/``), optionally with the actions taken before
  the window as a list (``rollout.earlier_actions``). Only the ``per_action`` layout applies.

Both write text through :class:`ChatFormat`: the tokenizer's chat template when it has one, otherwise a
plain ``User: ... / Assistant:`` format.
"""

from __future__ import annotations

from typing import Any, Sequence

PLAIN_FIRST = "User: {obs}\nAssistant:"  # after "{system}\n\n" when there is a system prompt
PLAIN_TURN = "\nUser: {obs}\nAssistant:"


class ChatFormat:
    """Token pieces of a conversation: the first state, and the tokens that follow an action.

    With a chat template, the pieces are differences of templated token lists of a small reference chat,
    so that ``first(system, o0) + a0 + next_turn(a0, o1) + a1 + ...`` equals templating the whole
    conversation whenever the action ids are the tokenisation of their text and the template does not
    rewrite earlier turns (Qwen3's template, for one, drops old ``<think>`` blocks; the concatenated
    state then stays what the model actually saw, which is what matters for training):

    - ``close``: what ends an assistant turn (e.g. ``<|im_end|>\\n``), from the templated reference chat
      minus the same chat with its last message left open (``continue_final_message``).
    - a user turn with the observation, plus the next assistant header: templated chat with the user
      message and generation prompt, minus the chat without them.

    If the action already ends with the first close token (the model sampled its end-of-turn EOS), that
    token is not repeated. Without a chat template: ``bos + "{system}\\n\\nUser: {obs}\\nAssistant:"``, then
    ``"\\nUser: {obs}\\nAssistant:"`` after each action (the action's EOS, if sampled, stays in the state).

    Env text (system prompt, observations) never becomes control tokens: a passage that contains
    ``<|im_end|>`` could otherwise close the user turn and forge an assistant turn. Each special token's
    text gets a zero-width space after its first character, so it reads the same but tokenises as text.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        specials = set(getattr(tokenizer, "all_special_tokens", []))
        specials |= {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special}
        self._defuse = {t: t[0] + "\u200b" + t[1:] for t in sorted(specials, key=len, reverse=True) if len(t) > 1}
        self.templated = getattr(tokenizer, "chat_template", None) is not None
        self.close: list[int] = []
        if self.templated:
            self._ref = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
            self._ref_ids = self._template(self._ref)
            self.close = _suffix(self._ref_ids, self._template(self._ref, continue_final_message=True), "a closed turn")

    def _template(self, messages: list[dict[str, str]], **kwargs: Any) -> list[int]:
        return list(self.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs))

    def text(self, env_text: str) -> str:
        """``env_text`` with every special token's text defused (see the class docstring)."""
        for token, safe in self._defuse.items():
            if token in env_text:
                env_text = env_text.replace(token, safe)
        return env_text

    def first(self, system: str, obs: str) -> list[int]:
        """The first state: system prompt, first observation, assistant header."""
        system, obs = self.text(system), self.text(obs)
        if self.templated:
            messages = [{"role": "system", "content": system}] if system else []
            return self._template(messages + [{"role": "user", "content": obs}], add_generation_prompt=True)
        bos = [self.tokenizer.bos_token_id] if self.tokenizer.bos_token_id is not None else []
        text = (f"{system}\n\n" if system else "") + PLAIN_FIRST.format(obs=obs)
        return bos + self.tokenizer.encode(text, add_special_tokens=False)

    def next_turn(self, action_ids: Sequence[int], obs: str) -> list[int]:
        """Tokens between an action and the next one: end of the assistant turn, user turn, header."""
        obs = self.text(obs)
        if not self.templated:
            return self.tokenizer.encode(PLAIN_TURN.format(obs=obs), add_special_tokens=False)
        full = self._template(self._ref + [{"role": "user", "content": obs}], add_generation_prompt=True)
        turn = _suffix(full, self._ref_ids, "a user turn")
        closed_by_model = bool(self.close) and bool(action_ids) and action_ids[-1] == self.close[0]
        return (self.close[1:] if closed_by_model else self.close) + turn


def _suffix(full: list[int], prefix: list[int], what: str) -> list[int]:
    if full[: len(prefix)] != prefix:
        raise ValueError(
            f"the chat template does not extend a conversation token by token when adding {what}; "
            "concatenated states cannot be built from it (use a tokenizer without a chat template, or fix it)"
        )
    return full[len(prefix) :]


class ConcatState:
    """``state_{t+1} = state_t + action_ids_t + obs_ids_t``; the first state is ``fmt.first(system, obs0)``."""

    def __init__(self, fmt: ChatFormat, system: str, first_obs: str):
        self.fmt = fmt
        self.ids = fmt.first(system, first_obs)

    def prompt(self) -> list[int]:
        return self.ids

    def advance(self, action_ids: list[int], action_text: str, obs: str) -> list[int]:
        """Append an action and the observation that followed; return the observation's tokens."""
        obs_ids = self.fmt.next_turn(action_ids, obs)
        self.ids = self.ids + action_ids + obs_ids
        return obs_ids


class WindowState:
    """A prompt rebuilt every step: the task (first observation), the last ``k`` (observation, action)
    pairs, the current observation, in one user message after the system prompt.

    ``earlier_actions`` > 0 also lists up to that many of the actions taken before the window (their text
    only, not what they observed); -1 lists all of them. A window forgets where an episode has been: on
    SynthHouse a clone with a window of 2 went back to the fridge it had just searched, over and over (the
    list alone did not make that clone win more: docs/results/domains/README.md, SynthHouse). The actions
    are short (~10 tokens each) where observations are long, so the memory stays cheap.

    The history's actions appear as their decoded text: they are part of a state here, not the action
    being trained, so re-tokenising them is harmless. ``advance`` still returns the observation's chat
    tokens, so records look the same in both modes.
    """

    def __init__(self, fmt: ChatFormat, system: str, first_obs: str, k: int, earlier_actions: int = 0):
        if k < 0:
            raise ValueError(f"window must be >= 0, got {k}")
        if earlier_actions < -1:
            raise ValueError(f"earlier_actions must be >= -1 (-1: all), got {earlier_actions}")
        self.fmt, self.system, self.task, self.k = fmt, system, first_obs, k
        self.earlier_actions = earlier_actions
        self.history: list[tuple[str, str]] = []  # (observation before the action, action text)
        self.current = first_obs

    def prompt(self) -> list[int]:
        return self.fmt.first(self.system, self.text())

    def text(self) -> str:
        """The user message. Step 1's observation is the task itself, so it is not repeated."""
        if not self.history:
            return self.task
        parts = [f"Task:\n{self.task}"]
        window_start = max(0, len(self.history) - self.k)
        if self.earlier_actions and window_start > 0:
            first = 0 if self.earlier_actions < 0 else max(0, window_start - self.earlier_actions)
            listed = "\n".join(f"Step {i + 1}: {self.history[i][1]}" for i in range(first, window_start))
            parts.append(f"Earlier actions:\n{listed}")
        for i in range(window_start, len(self.history)):
            observation, action = self.history[i]
            if i > 0:
                parts.append(f"Step {i + 1} observation:\n{observation}")
            parts.append(f"Step {i + 1} action:\n{action}")
        parts.append(f"Current observation (step {len(self.history) + 1}):\n{self.current}")
        return "\n\n".join(parts)

    def advance(self, action_ids: list[int], action_text: str, obs: str) -> list[int]:
        self.history.append((self.current, action_text))
        self.current = obs
        return self.fmt.next_turn(action_ids, obs)
