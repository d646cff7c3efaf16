"""A real pswitchd for the package's tests: host backend, free ports, private directory."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PSWITCH_BIN_DIR", os.path.join(ROOT, "build", "bin"))
ARCHIVES = os.path.join(ROOT, "tests", "data", "archives")
STARTED = re.compile(r"event=started .* port=([0-9]+)")


class Daemon:
    """pswitchd in its own directory; `address` once it serves. Stopped by stop()."""

    def __init__(self, *flags, timeout=60):
        self.dir = tempfile.mkdtemp(prefix="pswitch-py-")
        self.log_path = os.path.join(self.dir, "pswitchd.log")
        argv = [os.path.join(BIN, "pswitchd"), "--backend=host", "--listen=127.0.0.1:0",
                "--http-listen=", "--socket=" + os.path.join(self.dir, "m.sock"),
                "--data-root=" + self.dir, *flags]
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(argv, stderr=self._log, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        self.port = None
        while time.monotonic() < deadline:
            text = self.log()
            match = STARTED.search(text)
            if "event=serving" in text and match:
                self.port = int(match.group(1))
                break
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        if self.port is None:
            self.stop()
            raise RuntimeError(f"pswitchd did not start:\n{self.log()}")
        self.address = f"127.0.0.1:{self.port}"

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon():
    """One daemon for the module's tests: zoo models tiny_cnn and tiny_mlp preloaded, room for
    fill jobs, client paths allowed (archives are named by path)."""
    d = Daemon("--preload=tiny_cnn,tiny_mlp", "--allow-client-paths=true",
               "--arena-bytes=536870912", "--standby-workers=1", "--activation-bytes=67108864",
               "--fill-grace-ms=30")
    yield d
    d.stop()


@pytest.fixture
def client(daemon):
    import pswitch
    with pswitch.Client(daemon.address, timeout=120) as c:
        yield c


def wait_for(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
