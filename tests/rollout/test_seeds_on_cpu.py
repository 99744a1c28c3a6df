"""Seeds per draw: the same place gives the same seed in every process, other places other seeds."""

import subprocess
import sys
import uuid

from verl_ext.rollout.seeds import SEED_BITS, content_key, is_run_uid, prompt_uid, request_seed


def test_request_seed_depends_on_every_part_and_only_on_them():
    base = request_seed(7, 3, "u", 2)
    assert base == request_seed(7, 3, "u", 2)
    places = [(8, 3, "u", 2), (7, 4, "u", 2), (7, 3, "v", 2), (7, 3, "u", 1)]
    others = {request_seed(*place) for place in places}
    assert base not in others and len(others) == 4
    assert 0 <= base < 2**SEED_BITS


def test_seeds_are_the_same_in_another_process():
    # hash() is salted per process; the seeds must not be.
    code = "from verl_ext.rollout.seeds import *; print(request_seed(1, 2, 'x', 3), prompt_uid(1, 2, 0, 5))"
    env = {"PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    seed, uid = out.stdout.split()
    assert int(seed) == request_seed(1, 2, "x", 3) and uid == prompt_uid(1, 2, 0, 5)


def test_prompt_uids_are_unique_version_8_and_have_no_underscore():
    uids = {prompt_uid(0, step, fetch, row) for step in range(20) for fetch in range(3) for row in range(16)}
    assert len(uids) == 20 * 3 * 16
    assert all("_" not in u and uuid.UUID(u).version == 8 and is_run_uid(u) for u in uids)
    assert not is_run_uid(str(uuid.uuid4())) and not is_run_uid("not-a-uuid")
    assert prompt_uid(1, 0, 0, 0) != prompt_uid(0, 0, 0, 0)


def test_content_key_is_stable_and_separates_contents():
    assert content_key("a", 1) == content_key("a", 1) != content_key("a", 2)


def test_content_key_reads_images_by_their_bytes_not_their_address():
    import numpy as np
    from PIL import Image

    def message(colour):
        image = Image.new("RGB", (8, 8), colour)
        return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "Colour?"}]}]

    # Two image objects (two addresses) with the same pixels: one key; other pixels: another.
    assert content_key(message("red"), 0) == content_key(message("red"), 0) != content_key(message("blue"), 0)
    assert content_key(np.arange(3)) == content_key(np.arange(3)) != content_key(np.arange(4))
    assert content_key({"b": 1, "a": 2}) == content_key({"a": 2, "b": 1})
    assert content_key(object()) == content_key(object())  # by its type alone, never by its address
