"""pswitch.Client against a real pswitchd: every call, error mapping, numpy and torch tensors."""
import threading
import time

import numpy as np
import pytest

import pswitch
from pswitch import errors
from conftest import Daemon, wait_for


def image(seed, batch=2):
    return np.random.default_rng(seed).standard_normal((batch, 3, 32, 32), dtype=np.float32)


def test_infer_numpy_is_deterministic_and_batched(client):
    x = image(1)
    a = client.infer("tiny_cnn", x)
    b = client.infer("tiny_cnn", x)
    assert isinstance(a, np.ndarray) and a.dtype == np.float32
    assert a.shape[0] == 2 and a.ndim == 2
    np.testing.assert_array_equal(a, b)
    # Each sample's answer does not depend on its batch mates.
    single = client.infer("tiny_cnn", x[:1])
    np.testing.assert_allclose(single[0], a[0], rtol=1e-5, atol=1e-6)
    result = client.infer_result("tiny_cnn", x)
    assert result.task_id > 0 and result.latency_s > 0
    np.testing.assert_array_equal(result.output, a)


def test_torch_in_torch_out(client):
    torch = pytest.importorskip("torch")
    x = image(2)
    out = client.infer("tiny_cnn", torch.from_numpy(x))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    np.testing.assert_array_equal(out.numpy(), client.infer("tiny_cnn", x))
    # Non-contiguous inputs are laid out for the wire; the answer is the same.
    wide = torch.from_numpy(np.concatenate([x, x], axis=3))[..., ::2]
    assert not wide.is_contiguous()
    np.testing.assert_allclose(client.infer("tiny_cnn", wide).numpy(),
                               client.infer("tiny_cnn", wide.contiguous()).numpy())


def test_bad_inputs_raise_typed_errors(client):
    with pytest.raises(TypeError, match="float64"):
        client.infer("tiny_cnn", np.zeros((1, 3, 32, 32)))  # float64
    with pytest.raises(TypeError, match="numpy array or a torch tensor"):
        client.infer("tiny_cnn", [[1.0]])
    with pytest.raises(errors.InvalidArgumentError) as info:
        client.infer("tiny_cnn", np.zeros((1, 4), dtype=np.int64))
    assert isinstance(info.value, ValueError) and info.value.code == "INVALID_ARGUMENT"
    with pytest.raises(errors.NotFoundError):
        client.infer("no_such_model", image(3))
    with pytest.raises(errors.NotFoundError):
        client.status(987654321)


def test_register_list_unload(client):
    r = client.register("py_mlp", "tiny_mlp", batch=2)
    assert r.name == "py_mlp" and r.layers > 0 and r.groups >= 1 and r.param_bytes > 0
    # Where the registration's time went, phase by phase, loading into the workers last.
    assert [p for p, _ in r.phases] == ["read", "inspect", "profile", "plan", "pin", "load"]
    assert all(seconds >= 0 for _, seconds in r.phases)
    assert "py_mlp" in {m.name for m in client.models()}
    with pytest.raises(errors.AlreadyExistsError):
        client.register("py_mlp", "tiny_mlp")
    with pytest.raises(ValueError):
        client.register("x", "tiny_mlp", archive="/a.pt")
    client.unload("py_mlp")
    assert "py_mlp" not in {m.name for m in client.models()}
    with pytest.raises(errors.NotFoundError):
        client.unload("py_mlp")


def test_register_reports_each_phase_as_it_ends(client):
    seen, details = [], []
    r = client.register("py_progress", "tiny_mlp",
                        progress=lambda phase, seconds: seen.append((phase, seconds)),
                        progress_detail=lambda phase, seconds, text: details.append((phase, text)))
    # Every phase, in order, with the times the answer gives, before register returned.
    assert seen == [tuple(p) for p in r.phases]
    assert seen[-1][0] == "load"
    # And the inspection's steps while it ran (its profile: 3 runs on the CPU).
    assert details[0] == ("inspect", "building the model")
    assert details[-1] == ("inspect", "profiling: run 3 of 3")
    with pytest.raises(TypeError):
        client.register("py_progress_bad", "tiny_mlp", progress_detail="yes")
    client.unload("py_progress")
    # A callback's exception is raised once the registration has answered (it went through).
    with pytest.raises(ZeroDivisionError):
        client.register("py_progress", "tiny_mlp", progress=lambda phase, seconds: 1 / 0)
    assert "py_progress" in {m.name for m in client.models()}
    client.unload("py_progress")
    with pytest.raises(TypeError):
        client.register("py_progress", "tiny_mlp", progress="yes")


def test_train_status_list_and_cancel(client):
    client.register("py_train", "tiny_cnn", batch=2)
    done = client.train("py_train", 5, seed=1, optimizer="adam", lr=1e-3, momentum=0)
    # Its weights stay in GPU 0's weights cache after the task (nothing to copy next time).
    assert {m.name: m.resident_gpus for m in client.models()}["py_train"] == [0]
    status = client.status(done.task_id)
    assert status.state == "succeeded" and status.iterations_done == 5 and status.error is None
    assert done.task_id in [s.task_id for s in client.status(limit=10)]
    with pytest.raises(ValueError, match="optimizer"):
        client.train("py_train", 1, optimizer="lamb")
    # A long task, cancelled while it runs (or queued): it ends cancelled. The thread blocked in
    # train() holds no GIL, or this thread could neither poll nor cancel (the test would hang
    # until the client's timeout).
    future = threading.Thread(target=lambda: pytest.raises(errors.PswitchError, client.train,
                                                           "py_train", 1000000))
    future.start()
    running = wait_for(lambda: [s for s in client.status(limit=5)
                                if s.model == "py_train" and s.state in ("queued", "switching",
                                                                          "running")],
                       what="the long training task")
    client.cancel(running[0].task_id)
    future.join(timeout=60)
    assert not future.is_alive()
    assert client.status(running[0].task_id).state == "cancelled"
    client.unload("py_train")


def test_infer_async(client):
    futures = [client.infer_async("tiny_cnn", image(s)) for s in range(8)]
    for s, f in enumerate(futures):
        np.testing.assert_array_equal(f.result(timeout=60), client.infer("tiny_cnn", image(s)))


def test_fill_jobs_and_bubbles(client):
    with pytest.raises(errors.FailedPreconditionError):
        client.submit_fill("synthetic", steps=3, step=0.001, memory_bytes=1 << 20,
                           synthetic_step=0.001)
    bubble = 0.02
    client.register_bubble_cycle(0, {"period_ns": int(3 * bubble * 1e9), "bubbles": [
        {"offset_ns": 0, "duration_ns": int(bubble * 1e9), "free_bytes": 64 << 20}]})
    estimate = client.estimate_fill("synthetic", steps=20, step=0.002, memory_bytes=1 << 20,
                                    synthetic_step=0.002)
    assert estimate.job_id == 0 and estimate.state == "submitted"
    job = client.submit_fill("synthetic", steps=20, step=0.002, memory_bytes=1 << 20,
                             synthetic_step=0.002)
    assert job.job_id > 0
    for _ in range(500):
        with client.bubble(0, bubble, 64 << 20):
            time.sleep(bubble)
        time.sleep(0.005)
        status = client.fill_status(job.job_id)
        if status.state == "stopped":
            break
    assert status.state == "stopped" and status.error is None, status
    assert status.steps_done == 20 and status.bubbles >= 1
    stats = client.fill_stats()
    assert stats.bubbles >= status.bubbles and stats.steps >= 20
    with pytest.raises(errors.FailedPreconditionError):
        client.cancel_fill(job.job_id)  # already stopped
    with pytest.raises(errors.NotFoundError):
        client.fill_status(123456)
    with pytest.raises(errors.InvalidArgumentError):
        client.register_bubble_cycle(0, "{not json")
    with pytest.raises(ValueError, match="kind"):
        client.submit_fill("bogus")


def test_an_online_request_is_served_in_a_bubble_or_refused_with_the_reason():
    """Online fill (a latency objective): it waits for the main job's bubble; one no bubble
    can serve in time is refused (the default --online-fill-overflow=refuse)."""
    daemon = Daemon("--preload=tiny_cnn")
    try:
        c = pswitch.Client(daemon.address)
        x = image(5)
        plain = c.infer("tiny_cnn", x)
        with pytest.raises(ValueError, match="online_slo"):
            c.infer("tiny_cnn", x, online_slo=0)
        np.testing.assert_array_equal(c.infer("tiny_cnn", x, online_slo=5), plain)  # no main job
        bubble = 0.05
        c.register_bubble_cycle(0, {"period_ns": int(3 * bubble * 1e9), "bubbles": [
            {"offset_ns": 0, "duration_ns": int(bubble * 1e9), "free_bytes": 64 << 20}]})
        waiting = c.infer_async("tiny_cnn", x, online_slo=30)
        time.sleep(0.3)
        assert not waiting.done(), "served before any bubble"
        with c.bubble(0, bubble, 64 << 20):
            np.testing.assert_array_equal(waiting.result(timeout=30), plain)
        with pytest.raises(errors.DeadlineExceededError, match="latency objective"):
            c.infer("tiny_cnn", x, online_slo=0.05)
        c.close()
    finally:
        daemon.stop()


def test_tokens_and_a_server_that_goes_away(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("admin-token-0123456789 alice admin\n")
    tokens.chmod(0o600)
    d = Daemon("--preload=tiny_mlp", f"--auth-tokens={tokens}")
    try:
        with pytest.raises(errors.UnauthenticatedError):
            pswitch.Client(d.address, token="wrong-token-0123456789")
        with pswitch.Client(d.address, token="admin-token-0123456789", timeout=30) as c:
            assert [m.name for m in c.models()] == ["tiny_mlp"]
            d.stop()
            with pytest.raises(errors.UnavailableError) as info:
                c.models()
            assert isinstance(info.value, ConnectionError)
    finally:
        d.stop()


def test_a_user_trains_its_own_copy_and_progress_shows_while_training(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("admin-token-0123456789 alice admin\n"
                      "user-token-bob-0123456789 bob user\n"
                      "user-token-carol-0123456789 carol user\n")
    tokens.chmod(0o600)
    d = Daemon("--preload=tiny_cnn", f"--auth-tokens={tokens}")
    try:
        with pswitch.Client(d.address, token="user-token-bob-0123456789", timeout=60) as bob, \
                pswitch.Client(d.address, token="user-token-carol-0123456789", timeout=60) as carol:
            x = image(3)
            before = carol.infer("tiny_cnn", x)
            # A shared model is not bob's to change: he trains a copy of his own.
            with pytest.raises(errors.PermissionDeniedError, match="copy name"):
                bob.train("tiny_cnn", 5, lr=10)
            bob.train("tiny_cnn", 5, lr=10, as_model="bobs")
            assert not np.array_equal(bob.infer("bobs", x), before)
            np.testing.assert_array_equal(carol.infer("tiny_cnn", x), before)
            assert [m.name for m in carol.models()] == ["tiny_cnn"]
            with pytest.raises(errors.NotFoundError):
                carol.infer("bobs", x)
            # Progress: iterations_done grows while the copy trains, and stays after a cancel.
            worker = threading.Thread(target=lambda: pytest.raises(errors.PswitchError, bob.train,
                                                                   "bobs", 1000000))
            worker.start()
            running = wait_for(lambda: [s for s in bob.status(limit=5)
                                        if s.model == "bobs" and s.state == "running" and
                                        s.iterations_done > 0],
                               what="progress of the running task")
            task = running[0].task_id
            later = wait_for(lambda: bob.status(task).iterations_done > running[0].iterations_done,
                             what="more progress")
            assert later
            bob.cancel(task)
            worker.join(timeout=60)
            done = bob.status(task)
            assert done.state == "cancelled"
            assert f"after {done.iterations_done} iterations" in str(done.error)
            bob.unload("bobs")
    finally:
        d.stop()


def test_a_closed_client_says_so(daemon):
    c = pswitch.Client(daemon.address)
    c.close()
    with pytest.raises(errors.FailedPreconditionError, match="closed"):
        c.models()
