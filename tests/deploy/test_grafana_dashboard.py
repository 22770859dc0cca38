"""Static checks of deploy/grafana/specnode-dashboard.json (stdlib only, no Grafana): the
fields Grafana's dashboard import needs, and that every metric an expression names is one
the node exports (named in node/serve/metrics.cc or node/serve/serve_node.cc)."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "specnode-dashboard.json"
EXPORTERS = [ROOT / "node" / "serve" / "metrics.cc", ROOT / "node" / "serve" / "serve_node.cc"]
DS = "${DS_PROMETHEUS}"


@pytest.fixture(scope="module")
def dash():
    with open(DASHBOARD, encoding="utf-8") as f:
        return json.load(f)


def panels(dash):
    """Every panel, rows' collapsed children included; rows themselves have no queries."""
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def queries(dash):
    """(where, PromQL) of every panel target and templating query."""
    out = []
    for p in panels(dash):
        for t in p.get("targets", []):
            out.append((f"panel {p.get('id')} {t.get('refId')}", t.get("expr", "")))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        out.append((f"variable {v.get('name')}", q.get("query", "") if isinstance(q, dict) else q))
    return out


def test_top_level_fields(dash):
    assert isinstance(dash["title"], str) and dash["title"]
    assert isinstance(dash["uid"], str) and re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dash["uid"])
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    assert isinstance(dash["panels"], list) and dash["panels"]
    assert dash.get("id") is None  # an import assigns it


def test_datasource_input(dash):
    inputs = dash["__inputs"]
    assert any(i.get("name") == "DS_PROMETHEUS" and i.get("type") == "datasource"
               and i.get("pluginId") == "prometheus" for i in inputs), inputs


def test_panels_are_importable(dash):
    ids = [p.get("id") for p in panels(dash)]
    assert all(isinstance(i, int) and not isinstance(i, bool) for i in ids), ids
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    for p in panels(dash):
        where = f"panel {p.get('id')} ({p.get('title')})"
        assert isinstance(p.get("type"), str) and p["type"], where
        assert isinstance(p.get("title"), str) and p["title"], where
        g = p.get("gridPos")
        assert isinstance(g, dict), where
        for k in ("x", "y", "w", "h"):
            assert isinstance(g.get(k), int) and not isinstance(g[k], bool) and g[k] >= 0, (where, g)
        assert g["w"] >= 1 and g["h"] >= 1 and g["x"] + g["w"] <= 24, (where, g)
        if p["type"] == "row":
            continue
        assert p.get("datasource", {}).get("uid") == DS, where
        targets = p.get("targets")
        assert isinstance(targets, list) and targets, where
        ref_ids = [t.get("refId") for t in targets]
        assert all(isinstance(r, str) and r for r in ref_ids), (where, ref_ids)
        assert len(ref_ids) == len(set(ref_ids)), (where, ref_ids)
        for t in targets:
            assert isinstance(t.get("expr"), str) and t["expr"].strip(), (where, t)
            assert t.get("datasource", {}).get("uid", DS) == DS, (where, t)


def test_panels_do_not_overlap(dash):
    cells = {}
    for p in panels(dash):
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panels {cells[(x, y)]} and {p['id']} overlap"
                cells[(x, y)] = p["id"]


def test_templating(dash):
    variables = dash["templating"]["list"]
    names = {v.get("name") for v in variables}
    assert {"sla", "domain"} <= names, names
    for v in variables:
        assert isinstance(v.get("name"), str) and v["name"], v
        assert isinstance(v.get("type"), str) and v["type"], v
        assert v.get("query"), v
        if v["type"] == "query":
            assert v.get("datasource", {}).get("uid") == DS, v
    used = " ".join(q for _, q in queries(dash))
    for name in ("sla", "domain"):
        assert f"${name}" in used, f"variable {name} is used by no query"


def test_expressions_name_exported_metrics(dash):
    source = "\n".join(p.read_text(encoding="utf-8") for p in EXPORTERS)
    exported = set(re.findall(r'"(specnode_[a-z0-9_]+)', source))
    assert exported, "no metric names found in the exporters' source"
    seen = set()
    for where, expr in queries(dash):
        for name in re.findall(r"\bspecnode_[a-z0-9_]+", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            seen.add(base)
            assert name in exported or base in exported, f"{where}: {name} is not exported"
    # The panels the dashboard is for.
    for name in ("specnode_spec_acceptance", "specnode_spec_k", "specnode_spec_mode",
                 "specnode_spec_accepted_tokens_total", "specnode_spec_draft_tokens_total",
                 "specnode_time_to_first_token_seconds", "specnode_time_per_output_token_seconds",
                 "specnode_request_queue_time_seconds", "specnode_requests_total",
                 "specnode_kv_bytes", "specnode_preemptions_total", "specnode_errors_total"):
        assert name in seen, f"no panel shows {name}"


def test_latency_quantiles_come_from_histograms(dash):
    exprs = [q for _, q in queries(dash)]
    for metric in ("specnode_time_to_first_token_seconds", "specnode_time_per_output_token_seconds"):
        for quantile in ("0.5", "0.99"):
            want = re.compile(rf"histogram_quantile\({quantile},\s*sum by \(le, sla\) "
                              rf"\(rate\({metric}_bucket\{{[^}}]*\}}\[5m\]\)\)\)")
            assert any(want.search(e) for e in exprs), (metric, quantile)
