"""TrajectoryStore: flat position-aligned arrays, index-only segments, samples, JSON, persistence."""

from __future__ import annotations

import json

import pytest

from loongsage.agentflow.store import Trajectory, TrajectoryStore


def build() -> Trajectory:
    traj = Trajectory("t", "0")
    root = traj.new_segment("root", None)
    traj.append(root, [1, 2, 3], sampled=False)
    traj.append(root, [4, 5], sampled=True, logprobs=[-0.1, -0.2], versions=[0, 1])
    child = traj.new_segment("subagent", 0)
    traj.append(child, [9, 9], sampled=False)
    traj.append(child, [6], sampled=True, logprobs=[-0.3], versions=[1])
    traj.append(root, [7, 8], sampled=False)  # parent resumes after the child: a second span
    traj.append(root, [10], sampled=True, logprobs=[-0.4], versions=[2])
    return traj


def test_arrays_stay_aligned_and_segments_are_spans():
    traj = build()
    n = len(traj.tokens)
    assert n == 11 and len(traj.loss_mask) == len(traj.logprobs) == len(traj.versions) == n
    root, child = traj.segments
    assert root.spans == [[0, 5], [8, 11]] and child.spans == [[5, 8]]
    assert traj.segment_tokens(root) == [1, 2, 3, 4, 5, 7, 8, 10]
    assert traj.versions == [-1, -1, -1, 0, 1, -1, -1, 1, -1, -1, 2]
    assert traj.active_segment == 0  # a subagent does not take over the mainline


def test_one_sample_per_trainable_segment():
    root, child = build().to_samples(reward=0.5)
    assert root.prompt_ids == [1, 2, 3]
    assert root.response_ids == [4, 5, 7, 8, 10] and root.loss_mask == [1, 1, 0, 0, 1]
    assert root.response_logprobs == [-0.1, -0.2, 0.0, 0.0, -0.4]
    assert root.weight_versions == [0, 1, 1, 1, 2]  # template tokens: the version before them
    assert (child.prompt_ids, child.response_ids, child.loss_mask) == ([9, 9], [6], [1])
    assert child.reward_info["origin"] == "subagent" and child.reward == 0.5


def test_rollback_only_undoes_the_newest_tokens():
    traj = build()
    root = traj.segments[0]
    traj.append(root, [11, 12], sampled=False)
    assert traj.rollback(root, len(root) - 2, len(root.messages))
    assert traj.tokens[-1] == 10 and root.spans[-1] == [8, 11]
    child = traj.segments[1]
    assert not traj.rollback(child, 1, 0)  # its tokens are not the newest: left alone


def test_sampled_tokens_need_their_logprobs():
    traj = Trajectory("t", "0")
    seg = traj.new_segment("root", None)
    with pytest.raises(ValueError, match="2 ids, 1 logprobs"):
        traj.append(seg, [1, 2], sampled=True, logprobs=[0.0])


def test_finish_persists_json_and_returns_samples(tmp_path):
    store = TrajectoryStore(tmp_path)
    traj = store.open("t", "0")
    traj.tokens, traj.loss_mask = [], []
    seg = traj.new_segment("root", None)
    traj.append(seg, [1], sampled=False)
    traj.append(seg, [2], sampled=True, logprobs=[-1.0], versions=[4])
    samples = store.finish("t", "0", reward=1.0)
    assert len(samples) == 1 and samples[0].reward == 1.0 and ("t", "0") not in store
    line = json.loads((tmp_path / "trajectories.jsonl").read_text())
    assert line["tokens"] == [1, 2] and line["loss_mask"] == [0, 1] and line["status"] == "finished"
    assert line["segments"][0]["origin"] == "root"
    with pytest.raises(KeyError, match="unknown trajectory 't'"):
        store.finish("t", "0")


def test_lookup_creates_only_when_allowed():
    assert TrajectoryStore().lookup("x") is None
    assert TrajectoryStore(auto_create=True).lookup("x").trajectory_id == "x"
