"""A resume that was asked for never starts from scratch silently; a lost node is named with what ran there."""

from __future__ import annotations

import threading
import time

import pytest

from verl_ext.cluster.node_watch import NodeLostError, NodeWatch, could_be_a_lost_peer, describe_lost, lost_nodes
from verl_ext.cluster.storage import LATEST_NAME, RECORD_NAME, RunRecord, StorageError, check_resume


def _save(folder, step: int) -> None:
    (folder / f"global_step_{step}").mkdir(exist_ok=True)
    (folder / LATEST_NAME).write_text(str(step))
    RunRecord(str(folder)).saved(step)


def test_a_new_run_says_it_starts_at_step_0_and_keeps_a_record(tmp_path):
    line = check_resume(str(tmp_path), "auto", "exp", restart=False)
    assert line == f"new run: starting at step 0 (no checkpoint in {tmp_path} yet)"
    assert RunRecord(str(tmp_path)).read()["saved_steps"] == []
    _save(tmp_path, 2)
    assert check_resume(str(tmp_path), "auto", "exp", restart=True) == f"resuming from {tmp_path}/global_step_2"


def test_a_restart_that_finds_no_record_of_its_run_fails(tmp_path):
    with pytest.raises(StorageError, match=f"restart .* no record in {tmp_path} \\({RECORD_NAME} is missing\\)"):
        check_resume(str(tmp_path), "auto", "exp", restart=True)


def test_a_restart_before_the_first_checkpoint_starts_over_and_says_so(tmp_path):
    check_resume(str(tmp_path), "auto", "exp", restart=False)  # attempt 1 starts, dies before saving
    assert check_resume(str(tmp_path), "auto", "exp", restart=True).startswith("new run: starting at step 0")


@pytest.mark.parametrize("latest", [None, 1])
def test_a_checkpoint_the_run_saved_but_cannot_see_fails_loudly(tmp_path, latest):
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    if latest is None:
        (tmp_path / LATEST_NAME).unlink()  # a node that sees no marker (or it was deleted)
    else:
        (tmp_path / LATEST_NAME).write_text(str(latest))
    seen = "no checkpoint" if latest is None else f"step {latest} as the latest"
    with pytest.raises(StorageError, match=f"saved step 2 in {tmp_path} .* verl finds {seen}"):
        check_resume(str(tmp_path), "auto", "exp", restart=False)


def test_resume_disabled_or_by_path(tmp_path):
    assert "trainer.resume_mode=disable" in check_resume(str(tmp_path), "disable", "exp", restart=True)
    with pytest.raises(StorageError, match="resume_from_path='/nowhere': no folder"):
        check_resume(str(tmp_path), "resume_path", "exp", restart=False, resume_path="/nowhere")
    line = check_resume(str(tmp_path), "resume_path", "exp", restart=False, resume_path=str(tmp_path))
    assert line == f"resuming from {tmp_path} (trainer.resume_from_path)"


def test_an_unreadable_record_is_named(tmp_path):
    (tmp_path / RECORD_NAME).write_text("{not json")
    with pytest.raises(StorageError, match=f"{RECORD_NAME} is unreadable"):
        check_resume(str(tmp_path), "auto", "exp", restart=False)


REPORT = {
    "nodes": {
        "n1": {"name": "head", "ip": "127.0.0.1", "head": True, "gpus": 1},
        "n2": {"name": "node-1", "ip": "127.0.0.1", "head": False, "gpus": 1},
    },
    "trainer": {"node": "n1", "gpus": []},
    "groups": {
        "training ranks": ["n1", "n2"],
        "rollout replicas": ["n1", "n2"],
        "agent-loop workers": ["n2", "n1"],
        "difficulty service": ["n1"],
    },
}


def test_a_lost_node_is_described_by_what_ran_there():
    assert lost_nodes(REPORT, {"n1", "n2", "n3"}) == []
    assert lost_nodes(REPORT, {"n1"}) == ["n2"]
    idle = {**REPORT, "nodes": {**REPORT["nodes"], "n3": {"name": "cpu-0", "ip": "10.0.0.3", "head": False, "gpus": 0}}}
    assert lost_nodes(idle, {"n1", "n2"}) == []  # a node that runs none of the job may go
    assert describe_lost(REPORT, "n2") == (
        "[cluster] lost node node-1 (127.0.0.1): it ran training rank 1, rollout replica 1, agent-loop worker 0"
    )
    assert describe_lost(REPORT, "n1").startswith(
        "[cluster] lost node head (127.0.0.1): it ran the trainer process, training rank 0, rollout replica 0"
    )


def test_the_watch_reports_the_first_loss_and_stops(capsys):
    alive = [{"n1", "n2"}, {"n1", "n2"}, {"n1"}]
    lost: list = []
    done = threading.Event()

    def on_loss(nodes):
        lost.append(nodes)
        done.set()

    watch = NodeWatch(
        REPORT, interval_s=0.01, on_loss=on_loss, alive=lambda: alive.pop(0) if len(alive) > 1 else alive[0]
    )
    watch.start()
    assert done.wait(10)
    watch.join(10)
    assert lost == [["n2"]] and not watch.is_alive()
    assert "[cluster] lost node node-1 (127.0.0.1): it ran training rank 1" in capsys.readouterr().out


def _gloo_reset():
    # What attempt 2 of the lost-node run raised from a checkpoint's barrier (a RayTaskError around it, in the trainer)
    try:
        raise RuntimeError("[gloo/transport/tcp/pair.cc:538] Read error [127.0.0.1]:22736: Connection reset by peer")
    except RuntimeError as inner:
        try:
            raise RuntimeError("ray::WorkerDict.actor_rollout_save_checkpoint() failed") from inner
        except RuntimeError as outer:
            return outer


def test_an_error_a_lost_node_caused_names_it_once_the_gcs_sees_it(capsys):
    """A collective's reset came before Ray marked the node dead: the watch waits for the verdict, prints the lost
    node and raises NodeLostError from the error, which it names."""
    alive = [{"n1", "n2"}] * 3 + [{"n1"}]
    watch = NodeWatch(REPORT, interval_s=0.01, alive=lambda: alive.pop(0) if len(alive) > 1 else alive[0])
    err = _gloo_reset()
    assert could_be_a_lost_peer(err)  # by its cause
    with pytest.raises(NodeLostError, match=r"lost node node-1 \(127\.0\.0\.1\): it ran training rank 1.*") as got:
        watch.name_lost(err, wait_s=10)
    assert got.value.__cause__ is err and "It failed the trainer with RuntimeError" in str(got.value)
    assert "MAX_RESTARTS" in str(got.value)
    assert "[cluster] lost node node-1 (127.0.0.1): it ran training rank 1" in capsys.readouterr().out


def test_other_errors_go_on_at_once_and_a_reset_with_every_node_alive_after_the_wait(capsys):
    calls = []

    def alive():
        calls.append(time.monotonic())
        return {"n1", "n2"}

    watch = NodeWatch(REPORT, interval_s=0.01, alive=alive)
    assert not could_be_a_lost_peer(ValueError("diva.advantage.k must be >= 0"))
    started = time.monotonic()
    assert watch.name_lost(ValueError("diva.advantage.k must be >= 0"), wait_s=30) is None
    assert len(calls) == 1 and time.monotonic() - started < 5  # asked once, no wait
    calls.clear()
    dead_actor = RuntimeError("found dead: rollout server 0 of replica 0 on head: ActorDiedError: the actor died")
    assert not could_be_a_lost_peer(dead_actor)  # named by the liveness check; no wait for an actor on a live node
    one_node = {**REPORT, "groups": {"training ranks": ["n1", "n1"]}}
    assert NodeWatch(one_node, interval_s=0.01, alive=alive).name_lost(_gloo_reset(), wait_s=30) is None
    assert len(calls) == 1  # one node: a lost node takes the trainer with it, nothing to wait for
    calls.clear()
    started = time.monotonic()
    assert watch.name_lost(_gloo_reset(), wait_s=0.3) is None  # the caller re-raises its own error
    assert 0.3 <= time.monotonic() - started < 5 and len(calls) > 2
    assert capsys.readouterr().out == ""
