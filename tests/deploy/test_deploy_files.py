"""Static checks of deploy/ that catch rot without Docker or systemd running: the
Dockerfile's build-context paths, scripts, targets, ports and runtime libraries, the
container config, the systemd unit and its environment file. The checks that run the
binary use --specnode (or $SPECNODE_BIN) and skip without it."""
import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
CONTAINER_CONFIG = ROOT / "deploy" / "docker" / "config.yaml"
UNIT = ROOT / "deploy" / "systemd" / "specnode.service"
ENV_FILE = ROOT / "deploy" / "systemd" / "specnode.env"
OPERATIONS = ROOT / "docs" / "operations.md"


@pytest.fixture(scope="session")
def specnode_bin(request):
    path = request.config.getoption("--specnode") or os.environ.get("SPECNODE_BIN")
    if not path or not os.path.exists(path):
        pytest.skip("no specnode binary (pass --specnode PATH)")
    return path


def instructions():
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    out, current = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        current += " " + line[:-1] if line.endswith("\\") else " " + line
        if not line.endswith("\\"):
            word, _, rest = current.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            current = ""
    return out


def of(kind):
    return [args for word, args in instructions() if word == kind]


def copies():
    """(flags, sources, destination) of every COPY."""
    out = []
    for args in of("COPY"):
        words = shlex.split(args)
        flags = [w for w in words if w.startswith("--")]
        paths = [w for w in words if not w.startswith("--")]
        out.append((flags, paths[:-1], paths[-1]))
    return out


def stages():
    return [m.group(1) for args in of("FROM")
            for m in [re.search(r"\bAS\s+(\S+)", args, re.I)] if m]


def yaml_load(path):
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(Path(path).read_text())


def port_of(endpoint):
    return int(str(endpoint).rsplit(":", 1)[1])


def serve_help(binary):
    res = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout


def dockerignored(rel):
    """Whether .dockerignore's patterns (the simple forms it uses) exclude `rel`."""
    ignore = ROOT / ".dockerignore"
    if not ignore.exists():
        return False
    parts = Path(rel).parts
    for pat in ignore.read_text().splitlines():
        pat = pat.strip()
        if not pat or pat.startswith("#"):
            continue
        pat = pat.removeprefix("**/")
        for i in range(len(parts)):
            if Path(*parts[: i + 1]).match(pat) or Path(parts[i]).match(pat):
                return True
    return False


# --- Dockerfile ------------------------------------------------------------------------------

def test_dockerfile_base_and_stages():
    froms = of("FROM")
    assert any("debian:12-slim" in a for a in of("ARG")) or all("debian:12-slim" in f for f in froms)
    assert {"build", "runtime"} <= set(stages())
    assert stages()[-1] == "runtime"  # the image a plain `docker build` produces


def test_every_copied_context_path_exists_and_is_not_dockerignored():
    for flags, sources, _ in copies():
        if any(f.startswith("--from=") for f in flags):
            continue
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
            if src != ".":
                assert not dockerignored(src), f"COPY {src}: excluded by .dockerignore"


def test_copy_from_names_a_stage_and_a_built_target():
    names = set(stages())
    targets = {}
    for cml in ROOT.rglob("CMakeLists.txt"):
        if "build" in cml.relative_to(ROOT).parts[0]:
            continue
        for m in re.finditer(r"add_executable\(\s*([\w-]+)", cml.read_text()):
            targets[m.group(1)] = cml.parent.relative_to(ROOT).as_posix()
    built = set()
    for args in of("RUN"):
        for m in re.finditer(r"--target((?:\s+[\w-]+)+)", args):
            built.update(m.group(1).split())
    assert {"specnode", "specnode-client"} <= built
    for t in built:
        assert t in targets, f"--target {t}: no add_executable({t}) in the repository"
    for flags, sources, _ in copies():
        stage = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
        if stage is None:
            continue
        assert stage in names, f"COPY --from={stage}: no such stage"
        for src in sources:
            name = Path(src).name
            if name in targets:  # a binary: where CMake puts it under the build dir
                assert src.endswith(f"/{targets[name]}/{name}"), (src, targets[name])


def test_scripts_it_runs_exist():
    for args in of("RUN"):
        for m in re.finditer(r"(?:^|[\s/])(scripts/[\w.-]+)", args):
            script = ROOT / m.group(1)
            assert script.exists() and os.access(script, os.X_OK), m.group(1)
    assert any("scripts/setup --no-venv" in a for a in of("RUN"))
    # fetch-model's --model names are the ones the build arg documents.
    fetch = (ROOT / "scripts" / "fetch-model").read_text()
    for name in ("smollm2", "gemma3-270m"):
        assert f"{name})" in fetch


def test_exposed_ports_match_the_configs_and_docs():
    exposed = {int(p.split("/")[0]) for args in of("EXPOSE") for p in args.split()}
    local = yaml_load(ROOT / "cluster-configs" / "local-cpu.yaml")
    assert port_of(local["serve"]["bind"]) in exposed  # the default ZeroMQ port, 5555
    container = yaml_load(CONTAINER_CONFIG)["serve"]
    for key in ("bind", "metrics_bind", "http_bind", "kv_events_bind"):
        if container.get(key):
            assert port_of(container[key]) in exposed, f"serve.{key} {container[key]} not exposed"
    docs = OPERATIONS.read_text()
    for port in exposed:
        assert str(port) in docs, f"port {port} is not documented in docs/operations.md"
    assert "9464" in (ROOT / "docs" / "serving.md").read_text()  # the metrics example port


def test_entrypoint_healthcheck_and_config_path(specnode_bin):
    entry = json.loads(of("ENTRYPOINT")[0])  # exec form: signals reach specnode itself
    assert entry[:2] == ["/usr/local/bin/specnode", "serve"]
    config_path = entry[entry.index("--config") + 1]
    assert any(dest == config_path and sources == ["deploy/docker/config.yaml"]
               for _, sources, dest in copies())
    help_text = serve_help(specnode_bin)
    for flag in (w for w in entry if w.startswith("--")):
        assert flag in help_text, f"ENTRYPOINT flag {flag} not in `specnode serve --help`"
    health = of("HEALTHCHECK")[0]
    cmd = json.loads(health.split("CMD", 1)[1])
    assert cmd[0] == "/usr/local/bin/specnode-client" and cmd[-1] == "health"
    client = Path(specnode_bin).resolve().parents[1] / "client" / "specnode-client"
    if client.exists():
        usage = subprocess.run([str(client), "--help"], capture_output=True, text=True).stdout
        for flag in (w for w in cmd if w.startswith("--")):
            assert flag in usage, f"HEALTHCHECK flag {flag} not in specnode-client --help"
    assert of("STOPSIGNAL") == ["SIGTERM"]


def test_container_config_passes_check_config(specnode_bin, tmp_path):
    tiny = tmp_path / "model.gguf"
    subprocess.run([specnode_bin, "tiny-model", "--out", str(tiny)], check=True,
                   capture_output=True)
    env = dict(os.environ, SPECNODE_MODEL=str(tiny))
    res = subprocess.run([specnode_bin, "serve", "--check-config", "--config",
                          str(CONTAINER_CONFIG)], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    assert "tcp://0.0.0.0:5555" in res.stdout


def needed_libraries(binary):
    """DT_NEEDED of a binary (its direct shared libraries), via readelf."""
    if shutil.which("readelf") is None:
        pytest.skip("readelf not found")
    out = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def test_runtime_stage_installs_the_binarys_libraries(specnode_bin):
    """Each library specnode links directly, where a Debian package provides it here, is
    installed by the runtime stage (libraries outside packages, e.g. CUDA's, are a GPU
    build's and not in this CPU image)."""
    if shutil.which("dpkg") is None:
        pytest.skip("dpkg not found (not a Debian system)")
    sanitizers = [lib for lib in needed_libraries(specnode_bin)
                  if re.match(r"lib(a|ub|t|l|hwa)san\.so", lib)]
    if sanitizers:
        # The image builds Release (Dockerfile's build stage); a sanitizer build's runtime
        # libraries say nothing about what the image needs.
        pytest.skip(f"{specnode_bin} is a sanitizer build (links {', '.join(sanitizers)})")
    runtime = " ".join(a for a in of("RUN") if "apt-get install" in a and "libzmq5" in a)
    installed = set(runtime.split())
    base = {"libc6", "libgcc-s1"}  # in debian:12-slim
    ldd = subprocess.run(["ldd", specnode_bin], capture_output=True, text=True).stdout
    paths = dict(re.findall(r"^\s*(\S+) => (\S+)", ldd, re.M))
    missing = []
    for lib in needed_libraries(specnode_bin):
        path = paths.get(lib)
        if path is None or path.startswith("/usr/local/"):
            continue
        res = subprocess.run(["dpkg", "-S", os.path.realpath(path)], capture_output=True,
                             text=True)
        if res.returncode != 0:
            res = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
        if res.returncode != 0:
            continue
        pkg = res.stdout.split(":")[0]
        if pkg not in installed and pkg not in base:
            missing.append(f"{lib} ({pkg})")
    assert not missing, f"runtime stage lacks {missing}"


# --- systemd ---------------------------------------------------------------------------------

def unit():
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string(UNIT.read_text())
    return parser


def drain_timeouts():
    out = [float(yaml_load(ROOT / "cluster-configs" / "local-cpu.yaml")["serve"]["drain_timeout_s"])]
    out.append(float(yaml_load(CONTAINER_CONFIG)["serve"].get("drain_timeout_s", out[0])))
    return out


def test_unit_sections_and_service_settings():
    u = unit()
    assert {"Unit", "Service", "Install"} <= set(u.sections())
    s = u["Service"]
    assert s["Type"] == "simple"  # specnode does not speak sd_notify
    assert s["User"] == "specnode"
    assert s["Restart"] == "on-failure"
    assert s["KillSignal"] == "SIGTERM"
    assert s["EnvironmentFile"] == "-/etc/specnode/specnode.env"
    assert s["ExecStart"] == "/usr/local/bin/specnode serve --config /etc/specnode/config.yaml"
    assert float(s["TimeoutStopSec"]) > max(drain_timeouts()) + 5
    assert int(s["LimitNOFILE"]) >= 4096
    for key, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                       ("PrivateTmp", "yes")):
        assert s[key] == value, key
    assert "/var/lib/specnode/models" in s["ReadOnlyPaths"].split()
    assert u["Install"]["WantedBy"] == "multi-user.target"


def test_unit_exec_flags_exist(specnode_bin):
    help_text = serve_help(specnode_bin)
    s = unit()["Service"]
    for key in ("ExecStart", "ExecStartPre"):
        if key not in s:
            continue
        words = shlex.split(s[key])
        assert words[:2] == ["/usr/local/bin/specnode", "serve"], s[key]
        for flag in (w for w in words if w.startswith("--")):
            assert flag in help_text, f"{key} flag {flag} not in `specnode serve --help`"


def test_systemd_analyze_verify(specnode_bin, tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not found")
    copy = tmp_path / "specnode.service"  # the unit with this build's binary (verify checks it)
    copy.write_text(UNIT.read_text().replace("/usr/local/bin/specnode",
                                             os.path.abspath(specnode_bin)))
    res = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)],
                         capture_output=True, text=True, cwd=tmp_path)
    ours = [line for line in (res.stdout + res.stderr).splitlines() if "specnode.service" in line]
    assert res.returncode == 0 and not ours, res.stdout + res.stderr


def test_env_file_names_variables_the_code_reads():
    # Settings, set or commented out: KEY=value lines (prose comments are skipped).
    names = set(re.findall(r"^#?([A-Z][A-Z0-9_]*)=", ENV_FILE.read_text(), re.M))
    assert "SPECNODE_API_KEY" in names
    sources = "".join(p.read_text(errors="replace") for d in ("node", "model", "runtime")
                      for p in (ROOT / d).rglob("*.cc"))
    sources += "".join(p.read_text(errors="replace") for p in (ROOT / "node").rglob("*.h"))
    for name in names:
        assert f'"{name}"' in sources, f"{name}: no source reads it"
