#!/usr/bin/env bash
# Checks the deployment examples in deploy/ against the code, so they cannot drift from it:
#   1. systemd-analyze verify of deploy/systemd/pswitchd.service (a copy whose ExecStart runs
#      /bin/true, as /usr/local/bin/pswitchd is not installed here), when systemd-analyze works
#      in this environment (a trivial known-good unit is verified first);
#   2. the unit's pswitchd command line: every --flag an ABSL_FLAG of tools/pswitchd.cc, the
#      ports, the socket directory, the stop timeout against --drain-timeout-ms, the hardening
#      this deployment relies on (python3);
#   3. deploy/kubernetes/pswitchd-daemonset.yaml parsed (python3 with the yaml module): the same
#      command-line checks, the probes, the scrape annotations, the GPU request, the token Secret's
#      mode, the socket's emptyDir, the Service.
# Exit status: 0 when every part that ran passed, 1 on a failure, 77 when every part was skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

unit=deploy/systemd/pswitchd.service
manifest=deploy/kubernetes/pswitchd-daemonset.yaml
flags_source=tools/pswitchd.cc

ran=0
skipped=0
say() { echo "deploy_test: $*"; }
fail() {
  echo "deploy_test: FAIL: $*" >&2
  exit 1
}
skip() {
  say "SKIP: $*"
  skipped=$((skipped + 1))
}

for f in "$unit" "$manifest" "$flags_source"; do
  [ -f "$f" ] || fail "$f is missing"
done

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# --- 1. systemd-analyze verify ---
verify() {  # verify UNIT_FILE OUTPUT_FILE: systemd-analyze's status; its messages in OUTPUT_FILE
  local status=0
  SYSTEMD_COLORS=0 SYSTEMD_PAGER=cat timeout 120 systemd-analyze verify --man=no "$1" \
    >"$2" 2>&1 || status=$?
  return "$status"
}
true_bin=/bin/true
[ -x "$true_bin" ] || true_bin=/usr/bin/true
if ! command -v systemd-analyze >/dev/null 2>&1; then
  skip "systemd-analyze verify: systemd-analyze is not installed"
elif ! command -v timeout >/dev/null 2>&1 || [ ! -x "$true_bin" ]; then
  skip "systemd-analyze verify: needs timeout(1) and /bin/true"
else
  mkdir -p "$tmp/known-good" "$tmp/unit"
  printf '[Unit]\nDescription=known-good unit\n\n[Service]\nType=simple\nExecStart=%s\n' \
    "$true_bin" >"$tmp/known-good/deploy-test-known-good.service"
  if ! verify "$tmp/known-good/deploy-test-known-good.service" "$tmp/known-good.out" ||
    [ -s "$tmp/known-good.out" ]; then
    # Not the unit's fault: e.g. no systemd manager can be set up here (containers, no root).
    skip "systemd-analyze verify: it fails on a trivial known-good unit in this environment:"
    sed 's/^/    /' "$tmp/known-good.out"
  else
    # The same unit, only the binary replaced: verify checks that ExecStart is executable.
    sed "s#^ExecStart=/usr/local/bin/pswitchd#ExecStart=$true_bin#" "$unit" \
      >"$tmp/unit/pswitchd.service"
    grep -q "^ExecStart=$true_bin" "$tmp/unit/pswitchd.service" ||
      fail "$unit: no ExecStart=/usr/local/bin/pswitchd line to verify"
    status=0
    verify "$tmp/unit/pswitchd.service" "$tmp/unit.out" || status=$?
    # systemd only warns (status 0) about unknown keys and unparsable values: any message
    # counts, but those it also prints for the known-good unit.
    messages="$(grep -vxF -f "$tmp/known-good.out" "$tmp/unit.out" || true)"
    if [ "$status" -ne 0 ] || [ -n "$messages" ]; then
      cat "$tmp/unit.out" >&2
      fail "systemd-analyze verify $unit (ExecStart binary replaced by $true_bin): status" \
        "$status, messages above"
    fi
    say "ok: systemd-analyze verify $unit"
    ran=$((ran + 1))
  fi
fi

# --- 2 and 3: the command lines and the manifests (python3) ---
python=""
yaml_python=""
for candidate in python3 /usr/bin/python3; do
  command -v "$candidate" >/dev/null 2>&1 || continue
  [ -n "$python" ] || python="$candidate"
  if "$candidate" -c 'import yaml' >/dev/null 2>&1; then
    yaml_python="$candidate"
    break
  fi
done

cat >"$tmp/check.py" <<'PY'
"""Checks a deployment example against tools/pswitchd.cc. Usage: check.py unit|k8s FILE SOURCE"""
import re
import shlex
import sys

mode, path, source = sys.argv[1:4]
errors = []


def error(message):
    errors.append(f"{path}: {message}")


# name -> (type, default as written), from ABSL_FLAG(type, name, default, help).
FLAGS = {
    m.group(2): (m.group(1).strip(), m.group(3).strip())
    for m in re.finditer(r"ABSL_FLAG\(\s*([\w:]+)\s*,\s*(\w+)\s*,\s*([^,]+?)\s*,",
                         open(source).read())
}
if not FLAGS:
    sys.exit(f"{source}: no ABSL_FLAG found; the flag check has nothing to compare with")


def default(name):
    return FLAGS[name][1].strip('"')


def default_port(name):
    return int(default(name).rsplit(":", 1)[1])


def parse_flags(argv, where):
    """{flag: value} of a pswitchd command line; every flag must be one of pswitchd's."""
    values = {}
    i = 1
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            break
        if not arg.startswith("--"):
            error(f"{where}: positional argument {arg!r} (pswitchd takes none)")
            continue
        name, eq, value = arg[2:].partition("=")
        flag = name.replace("-", "_")  # pswitchd accepts dashes for underscores
        negated = flag.startswith("no") and FLAGS.get(flag[2:], ("",))[0] == "bool"
        if flag not in FLAGS and not negated:
            error(f"{where}: --{name} is not a pswitchd flag (no ABSL_FLAG({flag}) in {source})")
            continue
        if negated:
            flag, value = flag[2:], "false"
        elif not eq and FLAGS[flag][0] == "bool":
            value = "true"
        elif not eq:
            if i >= len(argv):
                error(f"{where}: --{name} has no value")
                break
            value = argv[i]
            i += 1
        values[flag] = value
    return values


def is_loopback(address):
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def check_command_line(values, where):
    """What every deployment of pswitchd must get right, whatever runs it."""
    if values.get("insecure", "false") not in ("false", "0"):
        error(f"{where}: --insecure in a production example")
    exposed = [f for f in ("listen", "http_listen")
               if values.get(f, default(f)) and not is_loopback(values.get(f, default(f)))]
    if exposed and not values.get("auth_tokens"):
        error(f"{where}: --{exposed[0].replace('_', '-')} beyond loopback without --auth-tokens")
    for flag in ("listen", "http_listen"):
        address = values.get(flag, default(flag))
        port = int(address.rsplit(":", 1)[1]) if ":" in address else -1
        if port != default_port(flag):
            error(f"{where}: --{flag.replace('_', '-')}={address}: the port should be pswitchd's "
                  f"default, {default_port(flag)}, as in the rest of the examples")
    for flag in ("auth_tokens", "socket", "model_repository"):
        if not values.get(flag, "").startswith("/"):
            error(f"{where}: --{flag.replace('_', '-')} should be an absolute path")
    return int(values.get("drain_timeout_ms", default("drain_timeout_ms"))) / 1000.0


def seconds(text):
    """A systemd time span ("60s", "1min 30s", "90") in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "second": 1, "seconds": 1, "ms": 1e-3, "msec": 1e-3,
             "m": 60, "min": 60, "minute": 60, "minutes": 60, "h": 3600, "hr": 3600,
             "hour": 3600, "hours": 3600}
    total = 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.replace(" ", ""):
        raise ValueError(text)
    for number, unit in parts:
        total += float(number) * units[unit]
    return total


def check_unit():
    service = {}
    section = None
    logical = ""
    for raw in open(path).read().splitlines():
        line = raw.strip()
        if not logical and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        line, logical = logical + line, ""
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        if section == "Service":
            service.setdefault(key.strip(), []).append(value.strip())

    def last(key):
        return service.get(key, [""])[-1]

    starts = service.get("ExecStart", [])
    if len(starts) != 1:
        error(f"want exactly one ExecStart=, found {len(starts)}")
        return
    argv = shlex.split(starts[0])
    if argv[0] != "/usr/local/bin/pswitchd":
        error(f"ExecStart= runs {argv[0]}, not /usr/local/bin/pswitchd")
    values = parse_flags(argv, "ExecStart")
    drain = check_command_line(values, "ExecStart")
    try:
        stop = seconds(last("TimeoutStopSec"))
        if stop <= drain:
            error(f"TimeoutStopSec={last('TimeoutStopSec')} is not longer than the drain timeout "
                  f"({drain:g} s): systemd would SIGKILL pswitchd while it drains its workers")
    except (ValueError, KeyError):
        error(f"TimeoutStopSec={last('TimeoutStopSec')!r} is missing or not a time span")
    socket_dir = values.get("socket", "").rsplit("/", 1)[0]
    runtime_dirs = ["/run/" + d for d in last("RuntimeDirectory").split()]
    # The memdaemon socket: in a RuntimeDirectory= kept private (0700), or in a directory
    # pswitchd creates 0700 right beneath one that lets only the group traverse (0710), where
    # the client Unix socket (--unix-socket, 0660) lives.
    socket_parent = socket_dir.rsplit("/", 1)[0]
    mode = last("RuntimeDirectoryMode")
    if socket_dir in runtime_dirs:
        if mode != "0700":
            error("RuntimeDirectoryMode= should be 0700: the memdaemon socket's directory is private")
    elif socket_parent in runtime_dirs:
        if mode not in ("0700", "0710"):
            error("RuntimeDirectoryMode= should be 0700 or 0710 (the group may traverse, not list)")
    else:
        error(f"--socket's directory {socket_dir} is not in or right beneath a RuntimeDirectory= "
              f"({runtime_dirs})")
    unix_socket = values.get("unix_socket")
    if unix_socket and unix_socket.rsplit("/", 1)[0] not in runtime_dirs:
        error(f"--unix-socket={unix_socket} is not in a RuntimeDirectory= ({runtime_dirs})")
    data_root = values.get("data_root")
    if data_root and data_root not in " ".join(service.get("ReadWritePaths", [])).split():
        error(f"--data-root={data_root} is not in ReadWritePaths= (ProtectSystem=strict)")
    required = {
        "User": "pswitch", "Group": "pswitch", "DynamicUser": "no", "Restart": "on-failure",
        "KillMode": "mixed", "LimitMEMLOCK": "infinity", "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "", "ProtectSystem": "strict", "ProtectHome": "yes",
        "PrivateTmp": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes", "LockPersonality": "yes",
        "RestrictRealtime": "yes", "RestrictSUIDSGID": "yes",
        "SystemCallArchitectures": "native",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    }
    for key, want in required.items():
        if key not in service or last(key) != want:
            error(f"want {key}={want}, found {key}={last(key) if key in service else '(unset)'}")
    if last("PrivateDevices") in ("yes", "true", "1", "on"):
        error("PrivateDevices=yes hides /dev/nvidia*: CUDA could not open the GPU")
    allowed = [v.split()[0] for v in service.get("DeviceAllow", []) if v.split()[1:2] != [""]]
    for needed in ("nvidia-frontend", "nvidia-uvm"):  # /dev/nvidia[0-9]*, nvidiactl; nvidia-uvm
        if not any(needed in a for a in allowed):
            error(f"no DeviceAllow= for the {needed} devices (found {allowed})")
    if any("*" in a for a in allowed if a.startswith("/dev/")):
        error("DeviceAllow= takes no wildcards in /dev paths (use char-GROUP)")


def check_k8s():
    import yaml

    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    sets = [d for d in docs if d.get("kind") == "DaemonSet"]
    if len(sets) != 1:
        error(f"want one DaemonSet, found {len(sets)}")
        return
    ds = sets[0]
    if ds["metadata"].get("namespace") != "pswitch":
        error("the DaemonSet is not in namespace pswitch")
    pod = ds["spec"]["template"]
    spec = pod["spec"]
    labels = pod["metadata"].get("labels", {})
    if ds["spec"]["selector"].get("matchLabels", {}).items() - labels.items():
        error("the DaemonSet's selector does not match its pod labels")
    containers = [c for c in spec["containers"] if c["name"] == "pswitchd"]
    if len(containers) != 1:
        error("want one container named pswitchd")
        return
    c = containers[0]
    argv = list(c.get("command", [])) + list(c.get("args", []))
    if not argv or not argv[0].endswith("/pswitchd"):
        error(f"the pswitchd container's command does not run pswitchd: {argv[:1]}")
        return
    values = parse_flags(argv, "container pswitchd")
    drain = check_command_line(values, "container pswitchd")
    if spec.get("terminationGracePeriodSeconds", 30) <= drain:
        error(f"terminationGracePeriodSeconds is not longer than the drain timeout ({drain:g} s)")

    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    http_port = int(values.get("http_listen", default("http_listen")).rsplit(":", 1)[1])
    tcp_port = int(values.get("listen", default("listen")).rsplit(":", 1)[1])
    for port in (http_port, tcp_port):
        if port not in ports.values():
            error(f"no containerPort {port} (pswitchd listens there)")

    def resolve(port):
        return ports.get(port) if isinstance(port, str) else port

    for probe, route in (("livenessProbe", "/v2/health/live"),
                         ("readinessProbe", "/v2/health/ready"),
                         ("startupProbe", None)):
        get = c.get(probe, {}).get("httpGet")
        if get is None:
            if route:
                error(f"no {probe} httpGet")
            continue
        want = route or "/v2/health/live"
        if get.get("path") != want:
            error(f"{probe}: path {get.get('path')}, want {want}")
        if resolve(get.get("port")) != http_port:
            error(f"{probe}: port {get.get('port')} is not the HTTP port {http_port}")

    annotations = pod["metadata"].get("annotations", {})
    for key, want in (("prometheus.io/scrape", "true"), ("prometheus.io/port", str(http_port)),
                      ("prometheus.io/path", "/metrics")):
        if annotations.get(key) != want:  # strings: annotations are never numbers or booleans
            error(f"annotation {key}: {annotations.get(key)!r}, want {want!r}")

    gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
    if str(gpus) != "1":
        error(f"resources.limits nvidia.com/gpu: {gpus!r}, want 1")
    if "nvidia.com/gpu" not in repr(spec.get("nodeSelector", {})) + repr(spec.get("tolerations")):
        error("no nodeSelector or toleration for nvidia.com/gpu")
    if spec.get("hostIPC") or spec.get("hostPID") or spec.get("hostNetwork"):
        error("host namespaces (hostIPC/hostPID/hostNetwork) are not needed")
    pod_sc = spec.get("securityContext", {})
    sc = c.get("securityContext", {})
    if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
        error("runAsNonRoot is not set")
    if not sc.get("readOnlyRootFilesystem"):
        error("readOnlyRootFilesystem is not set")
    if sc.get("allowPrivilegeEscalation") is not False:
        error("allowPrivilegeEscalation is not false")

    volumes = {v["name"]: v for v in spec.get("volumes", [])}

    def mount_of(container, file_path):  # the volume mount holding file_path, longest first
        best = None
        for m in container.get("volumeMounts", []):
            root = m["mountPath"].rstrip("/") + "/"
            if file_path.startswith(root) and (best is None or len(root) > len(best[0])):
                best = (root, m)
        return best[1] if best else None

    def secret_mode_ok(volume):
        s = volume.get("secret", {})
        modes = [s.get("defaultMode", 0o644)] + [i["mode"] for i in s.get("items", []) if "mode" in i]
        return all(m & 0o077 == 0 for m in modes)

    tokens = values.get("auth_tokens", "")
    m = mount_of(c, tokens)
    volume = volumes.get(m["name"]) if m else None
    if volume is None:
        error(f"--auth-tokens={tokens} is on no mounted volume")
    elif "secret" in volume:
        # fsGroup makes a Secret's files group-readable whatever defaultMode says.
        if not secret_mode_ok(volume):
            error("the token Secret is mounted open to group or others (pswitchd wants 0600/0400)")
        if "fsGroup" in pod_sc:
            error("with fsGroup the token Secret's file becomes group-readable: pswitchd refuses it")
    elif "emptyDir" in volume:
        # Filled by an init container from a Secret of a private mode.
        fillers = [i for i in spec.get("initContainers", [])
                   if any(vm["name"] == m["name"] for vm in i.get("volumeMounts", []))]
        sources = [volumes.get(vm["name"], {}) for i in fillers for vm in i.get("volumeMounts", [])]
        secrets = [v for v in sources if "secret" in v]
        if not secrets:
            error(f"--auth-tokens is on emptyDir {m['name']}, which no init container fills "
                  "from a Secret")
        elif not all(secret_mode_ok(v) for v in secrets):
            error("the token Secret is mounted open to group or others (want 0600/0400)")
    else:
        error(f"--auth-tokens is on volume {m['name']}, neither a Secret nor an emptyDir")

    m = mount_of(c, values.get("socket", ""))
    if m is None or "emptyDir" not in volumes.get(m["name"], {}):
        error(f"--socket={values.get('socket')} is not on an emptyDir")
    repo = values.get("model_repository", "")
    m = mount_of(c, repo.rstrip("/") + "/x")
    if m is None or not m.get("readOnly"):
        error(f"--model-repository={repo} is not a read-only volume mount")

    services = [d for d in docs if d.get("kind") == "Service"]
    if not any(s["metadata"].get("namespace") == "pswitch"
               and s["spec"].get("selector", {}).items() <= labels.items()
               and any(resolve(p.get("targetPort", p["port"])) == http_port
                       for p in s["spec"].get("ports", []))
               for s in services):
        error(f"no Service in namespace pswitch selecting the pods on the HTTP port {http_port}")


{"unit": check_unit, "k8s": check_k8s}[mode]()
for e in errors:
    print(f"deploy_test: FAIL: {e}", file=sys.stderr)
sys.exit(1 if errors else 0)
PY

if [ -z "$python" ]; then
  skip "the systemd unit's command line: python3 is not installed"
else
  "$python" "$tmp/check.py" unit "$unit" "$flags_source" || fail "$unit (messages above)"
  say "ok: $unit: flags, ports, socket directory, stop timeout, hardening"
  ran=$((ran + 1))
fi

if [ -z "$yaml_python" ]; then
  skip "$manifest: no python3 with the yaml module (Debian: python3-yaml)"
else
  "$yaml_python" "$tmp/check.py" k8s "$manifest" "$flags_source" || fail "$manifest (messages above)"
  say "ok: $manifest: flags, probes, annotations, GPU, tokens, socket, Service"
  ran=$((ran + 1))
fi

if [ "$ran" -eq 0 ]; then
  say "every part skipped"
  exit 77
fi
say "PASS ($ran part(s) run, $skipped skipped)"
