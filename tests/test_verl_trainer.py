"""The ``capo_sync`` trainer's advantage step on verl's own data layout, without Ray or a GPU.

TransferQueue is replaced by an in-memory store that holds rows exactly as verl's V1 agent-loop worker
writes them (``AgentLoopOutput.as_dict`` + ``list_of_dict_to_tensordict``: jagged response tensors,
``extra_fields`` as non-tensor data) and the critic's values as ``_compute_values`` writes them (jagged,
response length); verl's padding rows are added as ``upsample_batch_to_divisible_size`` makes them.
Runs in the verl venv.
"""

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

from capo_train.algorithms import get  # noqa: E402
from capo_train.integrations.verl import trainer as capo_trainer  # noqa: E402
from capo_train.integrations.verl.agent_loop import CapoEnvAgentLoop  # noqa: E402
from capo_train.integrations.verl.core import parse_keys  # noqa: E402
from test_verl_parity import make_trajectories, native_step_batch  # noqa: E402
from capo_train.rows import build_rows  # noqa: E402


class MemoryTQ:
    """``kv_batch_get`` / ``kv_batch_put`` over a dict of rows (the two calls the trainer makes)."""

    def __init__(self):
        self.rows: dict[str, dict] = {}

    def kv_batch_get(self, keys, partition_id, select_fields):
        return list_of_dict_to_tensordict([{f: self.rows[k][f] for f in select_fields} for k in keys])

    def kv_batch_put(self, keys, partition_id, fields):
        for i, key in enumerate(keys):
            for name in fields.keys():
                self.rows[key][name] = fields[name][i]
        return KVBatchMeta(keys=list(keys), tags=[{}] * len(keys), partition_id=partition_id)


def test_compute_advantage_reads_and_writes_verl_rows(monkeypatch):
    trajs = make_trajectories(2)
    store = MemoryTQ()
    monkeypatch.setattr(capo_trainer, "tq", store)
    keys, tags = [], []
    torch.manual_seed(0)
    for traj in trajs:
        for t, out in enumerate(CapoEnvAgentLoop.outputs(traj, ["stop"] * len(traj.actions), [])):
            row = out.as_dict()
            row["values"] = torch.randn(len(out.response_ids))  # critic values over the response, jagged
            key = f"uid{traj.group_id}_{traj.traj_id}_{t}"
            store.rows[key] = row
            keys.append(key)
            tags.append({"status": "success"})
    # two padding rows: a copy of a real row's fields with an all-zero response mask
    for i in range(2):
        row = dict(store.rows[keys[0]])
        row["response_mask"] = torch.zeros_like(row["response_mask"])
        store.rows[f"padxyz_{i}_0"] = row
    all_keys = keys + ["padxyz_0_0", "padxyz_1_0"]
    batch = KVBatchMeta(keys=all_keys, tags=tags + [{"is_padding": True}] * 2, partition_id="train")

    trainer = capo_trainer.CapoSyncTrainer.__new__(capo_trainer.CapoSyncTrainer)
    trainer.capo_estimator, trainer.capo_overrides = "capo_action_gae", {"gamma": 0.9, "lam": 0.95}
    trainer.use_critic, trainer.capo_kl_in_reward = True, False
    trainer.config = OmegaConf.create({"algorithm": {"rollout_correction": None}})  # no rollout correction
    metrics = {}
    trainer._compute_advantage(batch, metrics)

    # the same numbers from capo_train's estimator on the same rows (native layout: boundary value = values[0])
    native_rows = build_rows(trajs, "per_action", pad_id=0)
    critic = torch.zeros(native_rows.input_ids.shape)
    for a, key in enumerate(keys):
        start = int(native_rows.boundary_pos[a])
        v = store.rows[key]["values"]
        critic[a, start : start + len(v)] = v
    algo = get("capo").bind({"gamma": 0.9, "lam": 0.95, "bootstrap_truncated": False})
    expected = algo.estimate(native_step_batch(native_rows, critic))
    for a, key in enumerate(keys):
        adv, ret = store.rows[key]["advantages"], store.rows[key]["returns"]
        assert adv.shape == store.rows[key]["response_mask"].shape  # jagged: one entry per response token
        torch.testing.assert_close(adv, expected.advantages[a].expand_as(adv), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ret, expected.returns[a].expand_as(ret), rtol=1e-5, atol=1e-6)
    for key in ("padxyz_0_0", "padxyz_1_0"):
        assert store.rows[key]["advantages"].abs().sum() == 0
    assert metrics["capo/actions"] == len(keys)
    assert metrics["capo/trajectories"] == len(trajs)


def test_keys_parse_into_trajectories_steps_and_groups():
    traj, step, group = parse_keys(["u_1_0_0", "u_1_0_1", "u_1_1_0", "v_0_0"])  # uid "u_1" holds an underscore
    assert traj.tolist() == [0, 0, 1, 2] and step.tolist() == [0, 1, 0, 0] and group.tolist() == [0, 0, 0, 1]
    with pytest.raises(ValueError, match="unexpected TransferQueue key"):
        parse_keys(["nounderscore"])


def test_critic_loss_reads_the_boundary_value_from_verls_unpadded_output():
    """capo_value_loss in verl's critic-loss signature: the critic's output over whole sequences (unpadded,
    as the worker hands it over), verl's left shift, the boundary mask; equal to capo_train's value_loss on
    V(s_t) = output at each action's last state token."""
    from verl.utils import tensordict_utils as tu

    from capo_train.algorithms import value_loss
    from capo_train.integrations.verl.losses import capo_value_loss

    trajs = make_trajectories(3)
    records = [a for tr in trajs for a in tr.actions]
    g = torch.Generator().manual_seed(4)
    outputs = [torch.randn(len(a.prompt_ids) + len(a.action_ids), generator=g) for a in records]
    rows = [{"prompts": torch.tensor(a.prompt_ids), "responses": torch.tensor(a.action_ids),
             "response_mask": torch.ones(len(a.action_ids), dtype=torch.long),
             "values": torch.randn(len(a.action_ids), generator=g), "returns": torch.randn(len(a.action_ids), generator=g)}
            for a in records]
    data = list_of_dict_to_tensordict(rows)
    tu.assign_non_tensor(data, dp_size=1, global_batch_size=None, batch_num_tokens=None)
    model_output = {"values": torch.nested.as_nested_tensor(outputs, layout=torch.jagged)}

    class Cfg:
        cliprange_value = 0.5

    loss, metrics = capo_value_loss(Cfg(), model_output, data)
    boundary = torch.stack([out[len(a.prompt_ids) - 1] for out, a in zip(outputs, records)])
    expected, _ = value_loss(boundary, torch.stack([r["values"][0] for r in rows]),
                             torch.stack([r["returns"][0] for r in rows]), cliprange=0.5)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    assert metrics["critic/vpred_mean"] == pytest.approx(float(boundary.mean()), abs=1e-5)
