#!/usr/bin/env python3
"""Render or lint a Helm chart with the real Helm engine (Helm v4's Go library, bundled by the PyPI
package helm-python-sdk). No cluster is contacted.

  helm-render.py render CHART [--values-json JSON] [--name NAME] [--namespace NS]
      prints the manifests as `helm template` would (one YAML stream, `# Source:` headers);
      exit 1 with Helm's message on stderr when values fail the schema or a template fails.
  helm-render.py lint CHART [--values-json JSON] [--kube-version v1.33.0]
      prints every finding; exit 1 when Helm reports a warning or an error (strict).
  helm-render.py install CHART --name NAME --namespace NS [--values-json JSON] [--timeout S]
      `helm upgrade --install --create-namespace --wait` against the cluster of $KUBECONFIG
      (used by the real-cluster e2e suite when no `helm` binary is on PATH).
  helm-render.py uninstall --name NAME --namespace NS
"""
import argparse
import json
import sys

import helm_python as helm


def render(args: argparse.Namespace) -> int:
    values = json.loads(args.values_json) if args.values_json else None
    chart = helm.Chart.load(args.chart)
    try:
        manifests = chart.render(
            values, name=args.name, namespace=args.namespace, is_install=True, revision=1
        )
    except helm.HelmError as error:
        print(f"helm render failed: {error}", file=sys.stderr)
        return 1
    out = []
    # Helm installs in its own kind order; for reading and testing, template path order is enough.
    for path in sorted(manifests):
        body = manifests[path]
        if path.endswith("NOTES.txt"):
            continue
        if not body.strip():
            continue
        out.append(f"---\n# Source: {path}\n{body.strip()}\n")
    sys.stdout.write("".join(out))
    return 0


def notes(args: argparse.Namespace) -> int:
    values = json.loads(args.values_json) if args.values_json else None
    chart = helm.Chart.load(args.chart)
    manifests = chart.render(values, name=args.name, namespace=args.namespace, is_install=True, revision=1)
    for path, body in manifests.items():
        if path.endswith("NOTES.txt"):
            sys.stdout.write(body)
    return 0


def lint(args: argparse.Namespace) -> int:
    values = json.loads(args.values_json) if args.values_json else None
    report = helm.lint(args.chart, values, strict=True, kube_version=args.kube_version)
    names = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}
    worst = 0
    for message in report.get("messages", []):
        severity = message.get("severity", 0)
        worst = max(worst, severity)
        print(f"[{names.get(severity, severity)}] {message.get('path')}: {message.get('error')}".rstrip())
    for error in report.get("errors") or []:
        worst = 3
        print(f"[ERROR] {error}".rstrip())
    linted = report.get("total_charts_linted", 0)
    if linted < 1:
        print("no chart was linted", file=sys.stderr)
        return 1
    print(f"helm lint (Helm {helm.helm_sdk_version()}, strict): {linted} chart(s), "
          f"{'failed' if worst >= 2 else 'ok'}")
    return 1 if worst >= 2 else 0


def install(args: argparse.Namespace) -> int:
    values = json.loads(args.values_json) if args.values_json else None
    config = helm.Config(namespace=args.namespace)
    try:
        try:
            config.status(args.name)
            exists = True
        except helm.HelmNotFoundError:
            exists = False
        if exists:
            release = config.upgrade(args.chart, args.name, values, namespace=args.namespace,
                                     timeout=args.timeout, wait="watcher")
        else:
            release = config.install(args.chart, args.name, values, namespace=args.namespace,
                                     timeout=args.timeout, wait="watcher", create_namespace=True)
    except helm.HelmError as error:
        print(f"helm install failed: {error}", file=sys.stderr)
        return 1
    info = release.get("info", {}) if isinstance(release, dict) else {}
    print(f"release {args.name} in {args.namespace}: {info.get('status', 'deployed')}")
    return 0


def uninstall(args: argparse.Namespace) -> int:
    config = helm.Config(namespace=args.namespace)
    try:
        config.uninstall(args.name, ignore_not_found=True, wait="watcher", timeout=args.timeout)
    except helm.HelmError as error:
        print(f"helm uninstall failed: {error}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("render", "notes", "lint", "install", "uninstall"):
        p = sub.add_parser(name)
        if name != "uninstall":
            p.add_argument("chart")
        p.add_argument("--values-json", default="")
        p.add_argument("--name", default="rocefabric")
        p.add_argument("--namespace", default="rocefabric-system")
        p.add_argument("--kube-version", default="v1.33.0")
        p.add_argument("--timeout", type=int, default=300)
    args = parser.parse_args()
    actions = {"render": render, "notes": notes, "lint": lint, "install": install, "uninstall": uninstall}
    return actions[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
