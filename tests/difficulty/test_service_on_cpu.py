"""The difficulty service as a real named Ray actor under a local Ray (logical CPUs, no dashboard)."""

import json
import time

import numpy as np
import pytest
import ray

from verl_ext.config import DifficultyConfig
from verl_ext.difficulty import STATE_FILENAME, DifficultyStateFileError, save_state
from verl_ext.difficulty.service import DifficultyService, actor_name
from verl_ext.difficulty.shared_table import SharedDifficultyTable

# Starts Ray, a process group or a fresh interpreter that imports verl: the launch tier (pytest -m launch; CI runs it).
pytestmark = pytest.mark.launch

NAMESPACE = "diva_test_difficulty_service"


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=16, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False)
    yield
    ray.shutdown()


def test_update_metrics_and_snapshot():
    service = DifficultyService.get_or_create("basic")
    pending = service.update_async(["a", "b", 7], [0.0, 1.0, 0.5], step=1)
    metrics = service.finish(pending)
    assert metrics["diva/difficulty/questions_seen"] == 3
    assert metrics["diva/difficulty/updates_in_step"] == 3
    assert service.snapshot() == {"a": 7.0, "b": 3.0, 7: 5.0}
    assert service.state_of("a") == {"difficulty": 7.0, "updates": 1, "last_step": 1, "last_alpha": 0.0}
    np.testing.assert_array_equal(service.difficulties(["a", "zzz"]), [7.0, 5.0])


def test_bad_input_fails_in_the_actor_naming_the_argument_and_keeps_state():
    service = DifficultyService.get_or_create("bad_input")
    service.update(["a", "b"], [0.0, 1.0], step=0)
    before = service.snapshot()
    with pytest.raises(ValueError, match="alphas"):
        service.update(["a", "b"], [0.0, float("nan")], step=1)
    with pytest.raises(ValueError, match="alphas"):
        service.update(["a", "b"], [0.0, 2.0], step=1)
    with pytest.raises(ValueError, match="alphas"):
        service.update(["a", "b"], [0.0], step=1)
    assert service.snapshot() == before
    assert service.metrics()["diva/difficulty/questions_seen"] == 2


def test_experiments_never_share_state():
    a = DifficultyService.get_or_create("exp_a")
    b = DifficultyService.get_or_create("exp_b")
    a_other_ns = DifficultyService.get_or_create("exp_a", namespace=NAMESPACE + "_other")
    a.update(["q"], [0.0], step=1)
    assert b.snapshot() == {} and a_other_ns.snapshot() == {}
    assert DifficultyService.get_or_create("exp_a").snapshot() == {"q": 7.0}  # found again by name
    assert a.name == actor_name("exp_a", DifficultyConfig().service_name) == "diva_difficulty/exp_a"
    assert DifficultyService.connect("exp_a").snapshot() == {"q": 7.0}
    with pytest.raises(ValueError):
        DifficultyService.connect("no_such_experiment")
    with pytest.raises(ValueError, match="experiment_name"):
        DifficultyService.get_or_create("")


@ray.remote(num_cpus=1)
def client_updates(experiment, namespace, client, ids, rounds):
    service = DifficultyService.connect(experiment, namespace=namespace)
    for r in range(rounds):
        service.update(ids, [((client + r) % 5) / 4.0] * len(ids), step=r)
    return client


def test_eight_concurrent_clients_lose_no_update(tmp_path):
    service = DifficultyService.get_or_create("concurrent", live_dir=str(tmp_path))
    ids = [f"q{i}" for i in range(32)] + [1, 2]
    rounds = 10
    assert sorted(ray.get([client_updates.remote("concurrent", NAMESPACE, c, ids, rounds) for c in range(8)])) == list(
        range(8)
    )
    for qid in ids:
        assert service.state_of(qid)["updates"] == 8 * rounds
    assert ray.get(service.handle.info.remote())["version"] == 8 * rounds
    # The journal recorded every one of them too.
    assert sum(1 for _ in open(tmp_path / "journal.jsonl")) == 8 * rounds


def test_killed_actor_restarts_with_last_persisted_state(tmp_path):
    service = DifficultyService.get_or_create("restart", live_dir=str(tmp_path))
    rng = np.random.default_rng(0)
    for step in range(5):
        service.update([f"q{i}" for i in range(step, step + 10)], rng.uniform(0, 1, 10), step)
    before = {q: service.state_of(q) for q in service.snapshot()}
    pid = ray.get(service.handle.info.remote())["pid"]
    ray.kill(service.handle, no_restart=False)
    # ray.kill is asynchronous: poll until a new process answers.
    deadline = time.monotonic() + 60
    while True:
        try:
            if ray.get(service.handle.info.remote(), timeout=30)["pid"] != pid:
                break
        except ray.exceptions.RayActorError:
            pass
        assert time.monotonic() < deadline, "the killed actor did not come back"
        time.sleep(0.2)
    assert {q: service.state_of(q) for q in service.snapshot()} == before
    # It keeps going from there, and a retried request id is not applied twice.
    service.handle.update.remote(["q0"], np.array([1.0]), 9, "req-9")
    ray.get(service.handle.update.remote(["q0"], np.array([1.0]), 9, "req-9"))
    assert service.state_of("q0")["updates"] == before["q0"]["updates"] + 1


def test_stopped_actor_frees_its_name_at_once():
    service = DifficultyService.get_or_create("stop_then_start")
    service.update(["q0", "q1"], [0.0, 1.0], 0)
    service.stop()
    with pytest.raises(ValueError):
        ray.get_actor(service.name, namespace=service.namespace)
    # No live_dir: the next actor under the same name starts empty instead of finding the dying one.
    assert DifficultyService.get_or_create("stop_then_start").snapshot() == {}


def test_checkpoint_save_and_resume_round_trip(tmp_path):
    src = DifficultyService.get_or_create("ckpt_src")
    rng = np.random.default_rng(1)
    for step in range(6):
        src.update([f"q{i}" for i in rng.choice(50, 20, replace=False)] + [step], rng.uniform(0, 1, 21), step)
    step_folder = tmp_path / "global_step_6"
    path = src.save(str(step_folder))
    assert path == str(step_folder / STATE_FILENAME)

    resumed = DifficultyService.get_or_create("ckpt_resumed", live_dir=str(tmp_path / "live"))
    resumed.update(["stale"], [0.0], 0)  # whatever it held before is replaced
    ids = list(src.snapshot())
    table = SharedDifficultyTable(ids + ["never_seen", "stale"], initial=5.0)
    resumed.attach_table(table)
    assert table.read(table.row_of("stale")) == 7.0
    resumed.load(str(step_folder))
    assert resumed.snapshot() == src.snapshot()
    assert all(resumed.state_of(q) == src.state_of(q) for q in ids)
    np.testing.assert_array_equal(table.values.numpy()[: len(ids)], [src.snapshot()[q] for q in ids])
    assert table.read(table.row_of("never_seen")) == 5.0 and table.read(table.row_of("stale")) == 5.0
    # Same next step on both gives the same result.
    assert resumed.update(ids[:5], [0.3] * 5, 7) == src.update(ids[:5], [0.3] * 5, 7)


def test_corrupt_checkpoint_file_fails_naming_it_and_keeps_state(tmp_path):
    service = DifficultyService.get_or_create("ckpt_corrupt")
    service.update(["a", "b"], [0.0, 1.0], 1)
    step_folder = tmp_path / "global_step_1"
    path = service.save(str(step_folder))
    raw = open(path).read()
    open(path, "w").write(raw[:-40])
    service.update(["a"], [0.0], 2)
    before = service.snapshot()
    with pytest.raises(DifficultyStateFileError, match="partial or corrupt") as err:
        service.load(str(step_folder))
    assert path in str(err.value)
    with pytest.raises(FileNotFoundError, match="global_step_2"):
        service.load(str(tmp_path / "global_step_2"))
    assert service.snapshot() == before
    # A file with a valid checksum but an impossible difficulty is refused too, with the file named.
    good = json.loads(open(service.save(str(tmp_path / "global_step_3"))).read())["state"]
    good["questions"]["difficulty"][0] = 99.0
    bad_path = save_state(good, str(tmp_path / "global_step_4" / STATE_FILENAME))
    with pytest.raises(DifficultyStateFileError, match="outside") as err:
        service.load(str(tmp_path / "global_step_4"))
    assert bad_path in str(err.value)
    assert service.snapshot() == before


def test_refresh_copies_only_changes_into_the_shared_table():
    service = DifficultyService.get_or_create("refresh")
    ids = [f"q{i}" for i in range(100)]
    table = SharedDifficultyTable(ids, initial=5.0)
    with pytest.raises(RuntimeError, match="attach_table"):
        service.refresh()
    service.update(ids[:10], [1.0] * 10, 0)  # before the table is attached
    assert service.attach_table(table) == 10
    service.update(ids[:40], [0.0] * 40, 1)  # the changes come back with the update
    np.testing.assert_array_equal(table.values.numpy(), service.difficulties(ids))
    service.update(ids[30:50] + ["other_dataset"], [1.0] * 21, 2)
    np.testing.assert_array_equal(table.values.numpy(), service.difficulties(ids))
    assert service.refresh() == 0  # nothing left to copy
    # Two overlapping async updates, collected out of order, leave the table right.
    first = service.update_async(ids[60:70], [0.0] * 10, 3)
    second = service.update_async(ids[65:80], [1.0] * 15, 4)
    service.finish(second)
    service.finish(first)
    np.testing.assert_array_equal(table.values.numpy(), service.difficulties(ids))
    assert service.refresh() == 0


def test_non_utf8_checkpoint_file_fails_naming_it_and_keeps_state(tmp_path):
    service = DifficultyService.get_or_create("ckpt_non_utf8")
    service.update(["a", "b"], [0.0, 1.0], 1)
    step_folder = tmp_path / "global_step_1"
    path = service.save(str(step_folder))
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) // 2] = 0xFF  # one byte changed to a value that is not UTF-8
    open(path, "wb").write(bytes(raw))
    service.update(["a"], [0.0], 2)
    before = service.snapshot()
    with pytest.raises(DifficultyStateFileError, match="not UTF-8") as err:
        service.load(str(step_folder))
    assert path in str(err.value)
    assert service.snapshot() == before
    assert service.update(["b"], [1.0], 3)["diva/difficulty/questions_seen"] == 2.0  # the actor still serves
