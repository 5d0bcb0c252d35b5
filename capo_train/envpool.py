"""Env pools: where a rollout's env calls (``reset``, ``step``) run while the policy waits for them.

``rollout.collect`` plays all live episodes in lock-step: one batched generate call, then one env call per
episode. Those env calls are independent (each episode owns its env), so they can run at the same time:

- ``serial``: one after the other in the trainer's thread (the behaviour before pools existed).
- ``thread`` (the default, ``rollout.env_pool``): a ``ThreadPoolExecutor`` of ``rollout.env_workers`` threads
  in the trainer's process. Enough for envs that wait outside the GIL: ALFWorld already plays each env's
  game in a child process (``capo_envs/alfworld/engine.py``), so its threads wait on pipes; retrievers over sockets likewise. This is
  SkyRL's design (a ``ThreadPoolExecutor(max_env_workers)`` inside the generator process) and the one verl's
  agent loops use (``asyncio.to_thread`` per step); docs/envpool.md.
- ``process``: ``rollout.env_workers`` spawned worker processes, each holding a share of the envs
  (round-robin); the trainer holds a :class:`ProcessEnv` proxy per env, and a thread per call waits on the
  worker's pipe. For envs that hold the GIL (pure-Python simulators, BM25 scoring) or must not share the trainer's
  process: a JVM started by pyjnius/pyserini in a parent breaks forked children (castorini/pyserini#15,
  #1761), hence ``spawn``, so each worker starts its own.

``rollout.env_workers`` null (the default) is :func:`auto_workers`, the CPUs this process may use. Neither
pool starts more workers than it has envs to serve: threads start as calls need them, processes as envs
are made, so the workers in use are ``min(envs, env_workers)``.

Whatever the pool, trajectories are identical: the rollout draws every seed before the calls, an env's result
depends only on its own calls, and results come back in the order the calls were given
(tests/test_envpool.py compares serial, thread and process rollouts token for token). Tokenisation and the
recording of results stay in the rollout's thread (a fast tokenizer is not safe to share across threads).

This module never imports torch: a spawned worker imports only it, Gymnasium and ``capo_envs``.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Sequence, TypeVar

import gymnasium as gym

POOL_KINDS = ("serial", "thread", "process")
T = TypeVar("T")
R = TypeVar("R")


class EnvWorkerError(RuntimeError):
    """An env call failed inside a worker process; the message carries the worker's traceback."""


class EnvPool:
    """Runs independent env calls ``serial``-ly, on ``workers`` threads, or on ``workers`` spawned processes.

    ``make(env_id, **kwargs)`` builds an env where the pool runs it (in this process for serial/thread, a
    :class:`ProcessEnv` proxy for process); ``map(fn, items)`` applies ``fn`` to every item, concurrently for
    thread/process pools, and returns the results in the items' order (serial stops at the first exception,
    as a loop does; a concurrent pool raises the first one after every call has finished). ``close()`` stops
    the threads and the worker processes (a worker also exits when the trainer dies: its pipe closes).
    """

    def __init__(self, kind: str = "serial", workers: int = 2):
        if kind not in POOL_KINDS:
            raise ValueError(f"env pool must be one of {POOL_KINDS}, got {kind!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"env workers must be an int >= 1, got {workers!r}")
        self.kind, self.workers = kind, workers
        self._workers: list[_Worker] = []
        self._made = 0  # envs built so far: the next one goes to worker _made % workers
        self._executor: ThreadPoolExecutor | None = None
        if kind == "thread":
            self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="capo-env")
        elif kind == "process":
            # Calls to one worker queue on its lock, so more threads than workers only keep every worker busy.
            self._executor = ThreadPoolExecutor(max_workers=4 * workers, thread_name_prefix="capo-env-wait")

    def make(self, env_id: str, **kwargs: Any) -> gym.Env:
        if self.kind != "process":
            return gym.make(env_id, **kwargs)
        if len(self._workers) < self.workers and self._made >= len(self._workers):
            self._workers.append(_Worker())  # spawned as envs arrive: never more processes than envs
        worker = self._workers[self._made % self.workers]
        self._made += 1
        return ProcessEnv(worker, env_id, kwargs)

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        items = list(items)
        if self._executor is None or len(items) <= 1:
            return [fn(item) for item in items]
        futures = [self._executor.submit(fn, item) for item in items]
        errors = [f.exception() for f in futures]  # waits for every call: none is left running on an error
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        return [f.result() for f in futures]

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for worker in self._workers:
            worker.stop()
        self._workers, self._made = [], 0

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EnvPool({self.kind!r}, workers={self.workers})"


def pool_map(pool: EnvPool | None, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``pool.map(fn, items)``, or a plain in-order loop without a pool."""
    return [fn(item) for item in items] if pool is None else pool.map(fn, items)


def pool_from_config(rollout: Any) -> EnvPool | None:
    """The pool ``rollout.env_pool`` / ``rollout.env_workers`` ask for (``env_workers`` null:
    :func:`auto_workers`); None for ``serial`` (the trainer then runs exactly as it did before pools
    existed). Missing keys (an older config object) mean serial."""
    kind = getattr(rollout, "env_pool", "serial")
    if kind == "serial":
        return None
    workers = getattr(rollout, "env_workers", None)
    return EnvPool(kind, auto_workers() if workers is None else workers)


def auto_workers() -> int:
    """The CPUs this process may use (its affinity mask, else ``os.cpu_count()``), shared with the other
    training processes on this node (``LOCAL_WORLD_SIZE``, set by ``torchrun`` / ``accelerate launch``);
    at least 1. A pool never uses more workers than it has envs, so this is an upper bound."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    try:
        local_processes = max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)
    except ValueError:
        local_processes = 1
    return max(cpus // local_processes, 1)


# ----------------------------------------------------------------------------- process workers


class _Worker:
    """One spawned process serving env calls for the envs it holds; one call at a time (a lock)."""

    def __init__(self):
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child,), daemon=True, name="capo-env-worker")
        self.process.start()
        child.close()
        self._lock = threading.Lock()
        self._next_key = 0

    def new_key(self) -> int:
        with self._lock:
            self._next_key += 1
            return self._next_key

    def call(self, op: str, key: int, *payload: Any) -> Any:
        with self._lock:
            if not self.process.is_alive():
                raise EnvWorkerError(f"the env worker (pid {self.process.pid}) has exited "
                                     f"(exit code {self.process.exitcode})")
            try:
                self._conn.send((op, key, payload))
                status, value = self._conn.recv()
            except (EOFError, OSError, BrokenPipeError) as e:
                raise EnvWorkerError(f"the env worker (pid {self.process.pid}) died during {op!r}: {e}") from None
        if status == "error":
            raise value if isinstance(value, BaseException) else EnvWorkerError(str(value))
        return value

    def stop(self) -> None:
        with self._lock:
            try:
                self._conn.send(("shutdown", 0, ()))
            except (OSError, BrokenPipeError):
                pass
            self.process.join(timeout=10)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(timeout=5)
            self._conn.close()


_MISSING = "__capo_missing__"


class ProcessEnv:
    """The trainer's handle on an env that lives in a worker process: ``reset``/``step``/``close``, plus any
    attribute of ``env.unwrapped`` (``task_ids()``, ``expert_action()``, ``protocol``, ...) fetched from the
    worker, so ``env.unwrapped`` is the proxy itself. Plain values are copies, methods run in the worker."""

    def __init__(self, worker: _Worker, env_id: str, kwargs: dict):
        self._worker, self._key = worker, worker.new_key()
        self._closed = False
        self._attrs: dict[str, Any] = {}
        worker.call("make", self._key, env_id, kwargs)  # a bad id or kwarg raises here, as gym.make would

    @property
    def unwrapped(self) -> ProcessEnv:
        return self

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        return self._worker.call("reset", self._key, seed, options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        return self._worker.call("step", self._key, action)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._worker.process.is_alive():
                self._worker.call("close", self._key)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._attrs:
            return self._attrs[name]
        kind, value = self._worker.call("getattr", self._key, name)
        if kind == "missing":
            raise AttributeError(f"the env in the worker has no attribute {name!r}")
        if kind == "method":
            value = _RemoteMethod(self._worker, self._key, name)
        if kind == "method" or name in ("spec", "protocol"):  # fixed for an env's life; other values may change
            self._attrs[name] = value
        return value


class _RemoteMethod:
    """A method of a :class:`ProcessEnv`'s env, run in its worker."""

    def __init__(self, worker: _Worker, key: int, name: str):
        self._worker, self._key, self.__name__ = worker, key, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._worker.call("call", self._key, self.__name__, args, kwargs)


def serve(conn) -> None:
    """A worker's loop: ``(op, key, payload)`` requests in, ``("ok", value)`` or ``("error", exception)`` out.
    Envs are built here, so whatever they start (child processes, JVMs, indexes) belongs to this process."""
    import capo_envs  # noqa: F401  (registers the capo/* ids)

    envs: dict[int, gym.Env] = {}
    try:
        while True:
            try:
                op, key, payload = conn.recv()
            except (EOFError, OSError):  # the trainer has gone
                break
            if op == "shutdown":
                break
            try:
                conn.send(("ok", _handle(envs, op, key, payload)))
            except Exception as error:  # noqa: BLE001  (every failure goes back to the caller)
                conn.send(("error", _portable(error)))
    finally:
        for env in envs.values():
            try:
                env.close()
            except Exception:  # noqa: BLE001,S110  (best effort on the way out)
                pass


def _handle(envs: dict[int, gym.Env], op: str, key: int, payload: Sequence[Any]) -> Any:
    if op == "make":
        env_id, kwargs = payload
        envs[key] = gym.make(env_id, **kwargs)
        return None
    env = envs[key]
    if op == "reset":
        seed, options = payload
        return env.reset(seed=seed, options=options)
    if op == "step":
        return env.step(payload[0])
    if op == "close":
        envs.pop(key).close()
        return None
    if op == "getattr":
        name = payload[0]
        if name == "spec":
            return "value", env.spec
        value = getattr(env.unwrapped, name, _MISSING)
        if isinstance(value, str) and value == _MISSING:
            return "missing", None
        return ("method", None) if callable(value) else ("value", value)
    if op == "call":
        name, args, kwargs = payload
        return getattr(env.unwrapped, name)(*args, **kwargs)
    raise ValueError(f"unknown env worker op {op!r}")


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else an EnvWorkerError with its type, message and traceback."""
    import pickle

    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001
        return EnvWorkerError(f"{type(error).__name__}: {error}\n(in the env worker)\n{text}")
