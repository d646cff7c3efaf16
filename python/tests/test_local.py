"""The local path: pswitch.Client over pswitchd's Unix socket, tensors through the transfer area.

Answers must be bit-identical to the TCP path's; an array from Client.tensor must be sent as its
own bytes (the request names the slice at the array's address, no copy); outputs are views of
the area whose space comes back when they are dropped; files named by the client travel as fds.
"""
import os
import shutil
import subprocess

import numpy as np
import pytest

import pswitch
from pswitch import errors
from conftest import ARCHIVES, BIN


def image(seed, batch=2):
    return np.random.default_rng(seed).standard_normal((batch, 3, 32, 32), dtype=np.float32)


@pytest.fixture(scope="module")
def unix_path(daemon):
    # pswitchd's --unix-socket=auto puts it beside the memdaemon socket in the daemon's folder.
    path = os.path.join(daemon.dir, "pswitchd.sock")
    if not os.path.exists(path):
        pytest.skip("this pswitchd serves no Unix socket")
    return path


@pytest.fixture
def local(unix_path):
    with pswitch.Client("unix:" + unix_path, timeout=120) as c:
        yield c


@pytest.fixture
def tcp(daemon):
    with pswitch.Client(daemon.address, timeout=120, transport="tcp") as c:
        yield c


def test_unix_answers_are_bit_identical_to_tcp(local, tcp):
    assert local.local and not tcp.local
    for seed, batch in ((1, 2), (2, 1), (3, 5)):
        x = image(seed, batch)
        np.testing.assert_array_equal(local.infer("tiny_cnn", x), tcp.infer("tiny_cnn", x))
    # An area tensor filled in place answers the same as the array it was filled from.
    x = image(4)
    t = local.tensor(x.shape, "float32")
    t[...] = x
    np.testing.assert_array_equal(local.infer("tiny_cnn", t), tcp.infer("tiny_cnn", x))


def test_an_area_tensor_is_sent_without_a_copy(local):
    t = local.tensor((2, 3, 32, 32), "float32")
    assert isinstance(t, np.ndarray) and t.dtype == np.float32
    t[...] = image(5)
    own = local.area_slice(t)
    assert own is not None
    area, offset, length = own
    assert length == t.nbytes and offset % 64 == 0
    r = local.infer_result("tiny_cnn", t)
    # The request named the array's own bytes: the slice at its address, nothing copied.
    assert r.sent_inputs["input"] == own
    # A row of it is sent as its own bytes too (a contiguous view inside the tensor).
    row = t[1:]
    r_row = local.infer_result("tiny_cnn", row)
    assert r_row.sent_inputs["input"] == (area, offset + t[0].nbytes, row.nbytes)
    np.testing.assert_allclose(r_row.output[0], r.output[1], rtol=1e-5, atol=1e-6)  # batch of 1
    # An ordinary array is copied into the area once: sent from a slice of its own, elsewhere.
    x = image(5)
    assert local.area_slice(x) is None
    r_copy = local.infer_result("tiny_cnn", x)
    assert r_copy.sent_inputs["input"] != own
    np.testing.assert_array_equal(r_copy.output, r.output)


def test_torch_area_tensor_is_sent_without_a_copy(local):
    torch = pytest.importorskip("torch")
    t = local.tensor((1, 3, 32, 32), torch=True)
    assert isinstance(t, torch.Tensor)
    t.copy_(torch.from_numpy(image(6, 1)))
    r = local.infer_result("tiny_cnn", t)
    assert r.sent_inputs["input"] == local.area_slice(t)
    assert isinstance(r.output, torch.Tensor)
    assert local.area_slice(r.output) is not None  # the output views the area too


def test_outputs_view_the_area_until_dropped(local):
    x = local.tensor((2, 3, 32, 32))
    x[...] = image(7)
    before = local.area_stats()["allocated_bytes"]
    r = local.infer_result("tiny_cnn", x)
    out = r.output
    assert local.area_slice(out) is not None
    assert local.area_stats()["allocated_bytes"] > before
    kept = r.copy()
    assert local.area_slice(kept.output) is None
    np.testing.assert_array_equal(kept.output, out)
    r.release()
    assert local.area_stats()["allocated_bytes"] > before  # `out` still holds the space
    del out
    assert local.area_stats()["allocated_bytes"] == before
    # Many results, each released: the space is reused, the areas do not grow.
    areas = local.area_stats()["areas"]
    for _ in range(50):
        local.infer("tiny_cnn", x)
    assert local.area_stats()["areas"] == areas


def test_default_and_local_addresses_take_the_unix_socket(unix_path, monkeypatch):
    monkeypatch.setenv("PSWITCH_UNIX_SOCKET", unix_path)
    for address in (None, "127.0.0.1:7300", "localhost:7300"):
        with pswitch.Client(address, timeout=30) as c:
            assert c.local, address
            assert c.infer("tiny_cnn", image(8)).shape[0] == 2


def test_tcp_tensor_is_an_ordinary_array(tcp):
    t = tcp.tensor((2, 2), "int64")
    assert isinstance(t, np.ndarray) and t.dtype == np.int64
    assert tcp.area_slice(t) is None
    assert tcp.area_stats() == {"areas": 0, "area_bytes": 0, "allocated_bytes": 0}


def test_register_passes_the_archive_as_a_file(local, tmp_path, monkeypatch):
    # A relative path, in a folder pswitchd knows nothing of: only an fd can carry it there.
    shutil.copy(os.path.join(ARCHIVES, "corner_probe.pswitch.pt"), tmp_path / "probe.pt")
    monkeypatch.chdir(tmp_path)
    registered = local.register("local_probe", archive="probe.pt")
    assert registered.name == "local_probe"
    assert "local_probe" in {m.name for m in local.models()}
    local.unload("local_probe")


def test_pswitchctl_register_passes_the_archive_as_a_file(unix_path, tmp_path):
    shutil.copy(os.path.join(ARCHIVES, "corner_probe.pswitch.pt"), tmp_path / "probe.pt")
    ctl = os.path.abspath(os.path.join(BIN, "pswitchctl"))
    run = subprocess.run([ctl, "--server", "unix:" + unix_path, "register", "--name",
                          "ctl_probe", "--archive", "probe.pt"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "registered ctl_probe" in run.stdout
    # Progress as each phase ends, one line each when stderr is not a terminal, load last.
    progress = [line for line in run.stderr.splitlines() if line.startswith("registering ctl_probe: ")]
    assert [line.split(": ")[1].split()[0] for line in progress][-1] == "load", run.stderr
    subprocess.run([ctl, "--server", "unix:" + unix_path, "unload", "--name", "ctl_probe"],
                   check=True, capture_output=True, timeout=120)


def test_area_arrays_outlive_the_client(unix_path):
    client = pswitch.Client("unix:" + unix_path, timeout=60)
    t = client.tensor((2, 3, 32, 32))
    t[...] = image(9)
    y = client.infer("tiny_cnn", t)
    client.close()
    # Still mapped: the arrays hold the memory, whatever became of the connection.
    t[...] = 1.0
    assert float(t.sum()) == t.size
    assert np.isfinite(y).all()
    with pytest.raises(errors.FailedPreconditionError, match="closed"):
        client.tensor((1,))


def test_inputs_without_room_in_the_areas_travel_in_the_request(unix_path, tcp):
    with pswitch.Client("unix:" + unix_path, timeout=60, area_bytes=1 << 20,
                        max_area_bytes=1 << 20) as small:
        x = image(10)
        hog = small.tensor(((1 << 20) // 4 - 16,))  # leaves 64 bytes: no room for x
        r = small.infer_result("tiny_cnn", x)
        assert r.sent_inputs == {}  # sent in the request, answered in the reply
        assert small.area_slice(r.output) is None
        np.testing.assert_array_equal(r.output, tcp.infer("tiny_cnn", x))
        with pytest.raises(errors.ResourceExhaustedError, match="transfer areas full"):
            small.tensor((32,))  # 128 bytes
        del hog
        assert small.infer_result("tiny_cnn", x).sent_inputs != {}  # room again
