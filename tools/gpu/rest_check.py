#!/usr/bin/env python3
"""The HTTP port against a running pswitchd (tools/gpu/validate.sh's `rest` step, on CUDA).

Usage: rest_check.py BASE_URL OUT_DIR

Alternates JSON inferences between the registered models (each one a switch), then saves a
/metrics scrape and a /v1/trace timeline under OUT_DIR, unloads the first model and checks
that its pinned weights are gone and that it answers 404. Standard library only. Prints
headline figures as lines starting with "FIG " and exits non-zero on any failed check.
"""
import json
import os
import statistics
import sys
import time
import urllib.error
import urllib.request


def call(method, url, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def gauge(text, name):
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{}"):
            return float(line.split()[-1])
    raise SystemExit(f"rest_check: no {name} in the scrape")


def fill_value(datatype):
    return 0.5 if datatype.startswith("FP") else 1


def main():
    base, out = sys.argv[1].rstrip("/"), sys.argv[2]
    for _ in range(1500):  # the port opens once the start-up self-check is done
        try:
            status, _ = call("GET", base + "/v2/health/ready", timeout=5)
        except urllib.error.URLError:
            status = 0
        if status == 200:
            break
        time.sleep(0.2)
    else:
        raise SystemExit("rest_check: never ready")
    status, body = call("GET", base + "/v1/gpus")
    assert status == 200, body
    # The port serves while the start-up models still register: wait for two.
    models = []
    for _ in range(600):
        status, body = call("POST", base + "/v2/repository/index", {})
        assert status == 200, body
        models = [m["name"] for m in json.loads(body) if m.get("state") == "READY"]
        if len(models) >= 2:
            break
        time.sleep(0.2)
    else:
        raise SystemExit(f"rest_check: needs two loaded models, has {models}")
    requests = {}
    for m in models:
        status, body = call("GET", f"{base}/v2/models/{m}")
        assert status == 200, body
        spec = json.loads(body)["inputs"][0]
        shape = [1 if d < 0 else d for d in spec["shape"]]
        n = 1
        for d in shape:
            n *= d
        requests[m] = {"inputs": [{"name": spec["name"], "shape": shape,
                                   "datatype": spec["datatype"],
                                   "data": [fill_value(spec["datatype"])] * n}]}
    latencies = {m: [] for m in models}
    for i in range(12):
        m = models[i % len(models)]
        t0 = time.perf_counter()
        status, body = call("POST", f"{base}/v2/models/{m}/infer", requests[m])
        latencies[m].append((time.perf_counter() - t0) * 1e3)
        assert status == 200, body
    for m, l in latencies.items():
        print(f"FIG REST infer {m} with a switch each time: p50 {statistics.median(l):.2f} ms "
              f"(client, JSON, n={len(l)})")
    status, scrape = call("GET", base + "/metrics")
    assert status == 200, scrape
    scrape = scrape.decode()
    with open(os.path.join(out, "metrics.txt"), "w") as f:
        f.write(scrape)
    status, trace = call("GET", base + "/v1/trace?seconds=120")
    assert status == 200, trace
    with open(os.path.join(out, "trace.json"), "wb") as f:
        f.write(trace)
    events = json.loads(trace)["traceEvents"]
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    per_track = {}
    for e in events:
        if e.get("ph") in ("X", "i"):
            track = names.get((e["pid"], e["tid"]), "?")
            per_track[track] = per_track.get(track, 0) + 1
    print("FIG trace events by track: " +
          ", ".join(f"{t} {n}" for t, n in sorted(per_track.items())))
    before = gauge(scrape, "pswitch_pinned_weight_bytes")
    victim = models[0]
    status, body = call("POST", f"{base}/v2/repository/models/{victim}/unload", {})
    assert status == 200, body
    status, body = call("POST", f"{base}/v2/models/{victim}/infer", requests[victim])
    assert status == 404, (status, body)
    status, scrape = call("GET", base + "/metrics")
    after = gauge(scrape.decode(), "pswitch_pinned_weight_bytes")
    assert after < before, (before, after)
    other = models[1]
    status, body = call("POST", f"{base}/v2/models/{other}/infer", requests[other])
    assert status == 200, body
    print(f"FIG unload {victim}: pinned weights {before / 2**20:.1f} -> {after / 2**20:.1f} MiB, "
          f"infer on it 404, {other} still serves")


if __name__ == "__main__":
    main()
