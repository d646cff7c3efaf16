"""Triton's own Python client (PyPI tritonclient[http]) against a real pswitchd: the system
shared-memory calls a standard client makes work unchanged, and an inference whose input and
output lie in shared memory gives the bytes the same request gets with its tensors in the body.

Run by ctest (tritonclient_shm) with the interpreter of tools/install-deps.sh's virtual
environment; exits 77 (SKIPPED) where tritonclient is not installed.

usage: test_tritonclient_shm.py BIN_DIR
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import numpy as np
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm
    from tritonclient.utils import InferenceServerException
except ImportError as error:  # pragma: no cover - the skip path
    print(f"SKIPPED: tritonclient is not installed here ({error}); run tools/install-deps.sh")
    sys.exit(77)

BIN = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PSWITCH_BIN_DIR", "build/bin")
STARTED = re.compile(r"event=started .*http_port=([0-9]+)")


class Daemon:
    """pswitchd (host backend) in its own directory, HTTP on a free loopback port."""

    def __init__(self, *flags, timeout=60):
        self.dir = tempfile.mkdtemp(prefix="pswitch-tc-")
        self.log_path = os.path.join(self.dir, "pswitchd.log")
        argv = [os.path.join(BIN, "pswitchd"), "--backend=host", "--listen=127.0.0.1:0",
                "--http-listen=127.0.0.1:0", "--socket=" + os.path.join(self.dir, "m.sock"),
                "--data-root=" + self.dir, *flags]
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(argv, stderr=self._log, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        self.http_port = None
        while time.monotonic() < deadline and self.process.poll() is None:
            text = self.log()
            match = STARTED.search(text)
            if "event=serving" in text and match:
                self.http_port = int(match.group(1))
                break
            time.sleep(0.05)
        if self.http_port is None:
            self.stop()
            raise RuntimeError(f"pswitchd did not start:\n{self.log()}")

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


class TritonClientSharedMemoryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon("--preload=tiny_mlp", "--standby-workers=0")
        cls.client = httpclient.InferenceServerClient(f"127.0.0.1:{cls.daemon.http_port}",
                                                      network_timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.stop()

    def setUp(self):
        self.client.unregister_system_shared_memory()
        self.handles = []

    def tearDown(self):
        self.client.unregister_system_shared_memory()
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)

    def region(self, name, byte_size):
        key = f"/pswitch-tc-{os.getpid()}-{name}"
        handle = shm.create_shared_memory_region(name, key, byte_size)
        self.handles.append(handle)
        return key, handle

    def input_array(self):
        meta = self.client.get_model_metadata("tiny_mlp")
        features = int(meta["inputs"][0]["shape"][1])
        rng = np.random.default_rng(7)
        return rng.standard_normal((2, features)).astype(np.float32), meta["outputs"][0]["name"]

    def test_register_status_unregister(self):
        in_key, _ = self.region("input_data", 4096)
        out_key, _ = self.region("output_data", 8192)
        self.client.register_system_shared_memory("input_data", in_key, 4096)
        self.client.register_system_shared_memory("output_data", out_key, 8192)
        status = {r["name"]: r for r in self.client.get_system_shared_memory_status()}
        self.assertEqual(set(status), {"input_data", "output_data"})
        self.assertEqual(status["input_data"]["key"], in_key)
        self.assertEqual(int(status["output_data"]["byte_size"]), 8192)
        one = self.client.get_system_shared_memory_status("output_data")
        self.assertEqual([r["name"] for r in one], ["output_data"])

        self.client.unregister_system_shared_memory("input_data")
        names = [r["name"] for r in self.client.get_system_shared_memory_status()]
        self.assertEqual(names, ["output_data"])
        self.client.unregister_system_shared_memory()
        self.assertEqual(list(self.client.get_system_shared_memory_status()), [])

        # A segment that does not exist is refused, and nothing is registered.
        with self.assertRaises(InferenceServerException):
            self.client.register_system_shared_memory("nope", f"/pswitch-tc-{os.getpid()}-none",
                                                      64)
        self.assertEqual(list(self.client.get_system_shared_memory_status()), [])

    def test_infer_in_shared_memory_matches_the_body(self):
        x, output_name = self.input_array()
        # The JSON path, as the baseline.
        body_input = httpclient.InferInput("input", list(x.shape), "FP32")
        body_input.set_data_from_numpy(x, binary_data=False)
        expected = self.client.infer("tiny_mlp", [body_input]).as_numpy(output_name)
        self.assertIsNotNone(expected)

        in_key, in_handle = self.region("input_data", x.nbytes)
        out_bytes = 1 << 16
        out_key, out_handle = self.region("output_data", out_bytes)
        shm.set_shared_memory_region(in_handle, [x])
        self.client.register_system_shared_memory("input_data", in_key, x.nbytes)
        self.client.register_system_shared_memory("output_data", out_key, out_bytes)

        shm_input = httpclient.InferInput("input", list(x.shape), "FP32")
        shm_input.set_shared_memory("input_data", x.nbytes)
        shm_output = httpclient.InferRequestedOutput(output_name, binary_data=True)
        shm_output.set_shared_memory("output_data", out_bytes)
        result = self.client.infer("tiny_mlp", [shm_input], outputs=[shm_output])
        output = result.get_output(output_name)
        self.assertIsNotNone(output)
        parameters = output["parameters"]
        self.assertEqual(parameters["shared_memory_region"], "output_data")
        self.assertEqual(int(parameters["shared_memory_byte_size"]), expected.nbytes)
        self.assertNotIn("data", output)
        got = shm.get_contents_as_numpy(out_handle, np.float32, output["shape"],
                                        offset=int(parameters.get("shared_memory_offset", 0)))
        self.assertEqual(got.tobytes(), expected.tobytes())


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
