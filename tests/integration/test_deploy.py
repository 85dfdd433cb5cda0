"""deploy/ checked with what the package registries offer: PyYAML, promtool (Debian package
`prometheus`), systemd-analyze; plus structure checks that tie the files to the runtime:
metric names the runtime exports, the config the example files hold, ports, paths, and the
shutdown timeout that grace periods must exceed. Tools that are absent skip their test with
the reason. No broker needed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from runtime.config import StreamsConfig, load_config
from runtime.metrics import METRIC_NAMES, make_registry
from runtime.status import AppStatus

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"


class _StatusOnly:
    state = "RUNNING"

    def status(self) -> AppStatus:
        return AppStatus.from_dict({"state": "RUNNING"})


def exported_names() -> set[str]:
    """Every sample name a scrape of the runtime can show: its own and process_*."""
    text = generate_latest(make_registry(_StatusOnly())).decode()
    process = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE process_")}
    return set(METRIC_NAMES) | process


_PROMQL_WORDS = {"and", "or", "unless", "offset", "bool", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (label names, functions and keywords removed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\$\w+", "", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        if e[m.end() :].lstrip().startswith("(") or m.group().lower() in _PROMQL_WORDS:
            continue
        names.add(m.group())
    return names


def test_metric_names_parser() -> None:
    expr = 'sum by (topic) (rate(streams_x_total{instance=~"$i"}[5m])) / on(job) up > 0 and bool'
    assert metric_names(expr) == {"streams_x_total", "up"}


def example_config() -> StreamsConfig:
    return load_config(str(DEPLOY / "app.toml"), env={})


def configmap_config(tmp_path: Path) -> StreamsConfig:
    (configmap,) = yaml.safe_load_all((K8S / "configmap.yaml").read_text())
    path = tmp_path / "app.toml"
    path.write_text(configmap["data"]["app.toml"])
    return load_config(str(path), env={})


# --- YAML and the example configuration -----------------------------------------------------


def test_every_yaml_file_parses() -> None:
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 6, files
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs and all(isinstance(d, dict) for d in docs), path


def test_example_configs_are_valid(tmp_path: Path) -> None:
    for config in (example_config(), configmap_config(tmp_path)):
        assert config.admin_socket == "/run/streams-runtime/admin.sock"
        assert config.metrics_port == 9464 and config.metrics_host == "0.0.0.0"
        assert config.state_dir == "/var/lib/streams-runtime"


# --- Kubernetes ---------------------------------------------------------------------------


def k8s_objects() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in K8S.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") != "Kustomization":
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def test_kubernetes_manifests_fit_together(tmp_path: Path) -> None:
    config = configmap_config(tmp_path)
    objects = k8s_objects()
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert all((K8S / r).exists() for r in kustomization["resources"])

    sts = objects[("StatefulSet", "streams-runtime")]
    spec = sts["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    headless = objects[("Service", spec["serviceName"])]
    assert headless["spec"]["clusterIP"] == "None"
    pod = spec["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > config.shutdown_timeout_ms / 1000
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert "lifecycle" not in pod["containers"][0], "SIGTERM is graceful: no preStop needed"

    (container,) = pod["containers"]
    assert container["args"][:1] == ["run"] and "--config" in container["args"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": config.metrics_port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (claim,) = spec["volumeClaimTemplates"]
    assert mounts[claim["metadata"]["name"]] == config.state_dir
    assert config.admin_socket is not None
    assert mounts["run"] == str(Path(config.admin_socket).parent)
    config_volume = next(v for v in pod["volumes"] if v["name"] == "config")
    assert objects[("ConfigMap", config_volume["configMap"]["name"])]
    assert mounts["config"] == "/etc/streams-runtime"

    metrics_service = objects[("Service", "streams-runtime-metrics")]
    assert metrics_service["spec"]["selector"].items() <= labels.items()
    assert metrics_service["spec"]["ports"][0]["targetPort"] == "metrics"
    monitor = objects[("PodMonitor", "streams-runtime")]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"


# --- Prometheus rules ------------------------------------------------------------------------


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yaml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_alerts_cover_the_issue_and_use_exported_metrics() -> None:
    rules = alert_rules()
    names = {r["alert"] for r in rules}
    assert {
        "StreamsConsumerLagGrowing",
        "StreamsProcessingThreadFailed",
        "StreamsNoCommit",
        "StreamsAppError",
        "StreamsBrokerUnreachable",
    } <= names
    known = exported_names()
    for rule in rules:
        used = metric_names(rule["expr"])
        assert used and used <= known, (rule["alert"], used - known)
        assert rule["labels"]["severity"] in ("warning", "critical")


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; .ci/run installs it)")
    return tool


def test_promtool_checks_and_unit_tests_the_alerts() -> None:
    tool = _promtool()
    checked = subprocess.run(
        [tool, "check", "rules", "alerts.yaml"],
        cwd=DEPLOY / "prometheus", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [tool, "test", "rules", "alerts.test.yaml"],
        cwd=DEPLOY / "prometheus", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr


# --- Grafana ---------------------------------------------------------------------------------


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboard.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_dashboard_panels_use_exported_metrics() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboard.json").read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels) >= 10
    known = exported_names()
    used: set[str] = set()
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names and names <= known, (panel["title"], names - known)
            used |= names
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            metric = re.match(r"label_values\((\w+)", variable["query"]["query"])
            assert metric and metric.group(1) in known
    wanted = {
        "streams_records_consumed_total", "streams_records_processed_total",
        "streams_consumer_lag", "streams_commits_total", "streams_app_state",
        "streams_processing_threads_alive", "streams_failed_processing_threads_total",
        "streams_task_buffered_records", "streams_broker_unreachable",
        "streams_last_commit_timestamp_seconds", "streams_poison_records_total",
    }  # fmt: skip
    assert wanted <= used, wanted - used


def test_promtool_parses_the_dashboard_queries(tmp_path: Path) -> None:
    tool = _promtool()
    rules = [
        {"record": f"dashboard:expr_{i}", "expr": expr.replace("$__rate_interval", "5m")
         .replace("$instance", ".*")}
        for i, expr in enumerate(dashboard_exprs())
    ]  # fmt: skip
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run(
        [tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


# --- systemd -----------------------------------------------------------------------------------


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for raw in (DEPLOY / "streams-runtime.service").read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def _seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+)\s*(s|min|ms)?", value)
    assert m, value
    number = float(m.group(1))
    return {"min": number * 60, "ms": number / 1000}.get(m.group(2) or "s", number)


def test_systemd_unit_structure() -> None:
    unit = unit_settings()
    config = example_config()
    assert unit["Type"] == ["simple"]
    assert unit["Restart"] == ["on-failure"]
    assert unit["KillSignal"] == ["SIGTERM"]
    assert "2" in unit["RestartPreventExitStatus"][0].split()
    assert _seconds(unit["TimeoutStopSec"][0]) > config.shutdown_timeout_ms / 1000
    assert "ExecReload" not in unit
    (exec_start,) = unit["ExecStart"]
    assert " run " in exec_start and "--config /etc/streams-runtime/app.toml" in exec_start
    assert unit["StateDirectory"] == [Path(config.state_dir).name]
    assert config.admin_socket is not None
    assert unit["RuntimeDirectory"] == [Path(config.admin_socket).parent.name]
    assert unit["User"] != ["root"] and unit["NoNewPrivileges"] == ["yes"]
    assert unit["ProtectSystem"] == ["strict"]


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed")
    # verify needs the ExecStart binary to exist: point it at this checkout's script.
    script = Path(sys.executable).parent / "streams-runtime"
    if not script.exists():
        pytest.skip(f"{script} missing (pip install -e . creates it)")
    text = (DEPLOY / "streams-runtime.service").read_text()
    text = text.replace("/opt/streams-runtime/venv/bin/streams-runtime", str(script))
    text = text.replace("WorkingDirectory=/opt/streams-runtime/app", f"WorkingDirectory={REPO}")
    unit = tmp_path / "streams-runtime.service"
    unit.write_text(text)
    result = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


# --- the container image -----------------------------------------------------------------------


def containerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Containerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_containerfile_structure() -> None:
    instructions = containerfile_instructions()
    by_keyword: dict[str, list[str]] = {}
    for keyword, rest in instructions:
        by_keyword.setdefault(keyword, []).append(rest)
    assert instructions[0] == ("FROM", "python:3.11-slim")
    (user,) = by_keyword["USER"]
    assert user.split(":")[0] not in ("root", "0")
    assert [k for k, _ in instructions].index("USER") > max(
        i for i, (k, _) in enumerate(instructions) if k == "RUN"
    ), "USER must come after every RUN (nothing runs as root at runtime)"
    (healthcheck,) = by_keyword["HEALTHCHECK"]
    assert "/healthz" in healthcheck and " CMD " in f" {healthcheck} "
    env = " ".join(by_keyword["ENV"])
    port = re.search(r"STREAMS_RUNTIME_METRICS_PORT=(\d+)", env)
    assert port and by_keyword["EXPOSE"] == [port.group(1)]
    state = re.search(r"STREAMS_RUNTIME_STATE_DIR=(\S+)", env)
    assert state and json.loads(by_keyword["VOLUME"][0]) == [state.group(1)]
    assert by_keyword["STOPSIGNAL"] == ["SIGTERM"]
    assert json.loads(by_keyword["ENTRYPOINT"][0]) == ["streams-runtime"]
    assert any("pip install ." in r for r in by_keyword["RUN"])
    for copy in by_keyword["COPY"]:
        *sources, _dest = copy.split()
        for source in sources:
            assert (REPO / source).exists(), f"COPY source {source} missing from the repo"
