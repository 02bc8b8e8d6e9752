//! The real Helm engine, reached through `.ci/helm-render.py` and the PyPI package
//! `helm-python-sdk` (Helm v4's Go library behind a C ABI; no `helm` binary, no cluster).
//!
//! `.ci/helm-check` installs it into the tool cache (`~/.cache/rocefabric/helm-venv`);
//! `ROCEFABRIC_HELM_PYTHON` names another Python that can `import helm_python`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::workspace_root;

/// Environment variable naming a Python interpreter with `helm_python` installed.
pub const PYTHON_ENV: &str = "ROCEFABRIC_HELM_PYTHON";
/// When set (to anything but `0`), a missing Helm engine fails the chart tests instead of skipping.
pub const REQUIRE_ENV: &str = "ROCEFABRIC_REQUIRE_HELM";

/// Why Helm could not be reached or what it refused.
#[derive(Debug, thiserror::Error)]
pub enum HelmError {
    #[error("no Helm engine: {0} (run .ci/helm-check --install)")]
    NotInstalled(String),
    #[error("failed to run {python}: {source}")]
    Spawn {
        python: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Helm refused the chart or the values; the message is Helm's own.
    #[error("helm {action} failed: {message}")]
    Refused {
        action: &'static str,
        message: String,
    },
}

/// A Python interpreter that can drive Helm, and the script that does.
#[derive(Debug, Clone)]
pub struct HelmEngine {
    python: PathBuf,
    script: PathBuf,
}

/// Whether a missing engine must fail the tests (CI) rather than skip them.
pub fn required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

impl HelmEngine {
    /// Find the engine: `$ROCEFABRIC_HELM_PYTHON`, else `helm-venv/bin/python` in the tool cache.
    pub fn locate() -> Result<HelmEngine, HelmError> {
        let root = workspace_root();
        let python = match std::env::var_os(PYTHON_ENV) {
            Some(p) => PathBuf::from(p),
            None => crate::tool_cache().join("helm-venv/bin/python"),
        };
        if !python.exists() {
            return Err(HelmError::NotInstalled(format!(
                "{} does not exist",
                python.display()
            )));
        }
        let probe = Command::new(&python)
            .args(["-c", "import helm_python"])
            .output()
            .map_err(|source| HelmError::Spawn {
                python: python.clone(),
                source,
            })?;
        if !probe.status.success() {
            return Err(HelmError::NotInstalled(format!(
                "{} cannot import helm_python: {}",
                python.display(),
                String::from_utf8_lossy(&probe.stderr).trim()
            )));
        }
        Ok(HelmEngine {
            python,
            script: root.join(".ci/helm-render.py"),
        })
    }

    /// The interpreter in use.
    pub fn python(&self) -> &Path {
        &self.python
    }

    fn run(
        &self,
        action: &'static str,
        chart: &Path,
        values: &Value,
        extra: &[&str],
    ) -> Result<String, HelmError> {
        let values_json = if values.is_null() {
            String::new()
        } else {
            values.to_string()
        };
        let out = Command::new(&self.python)
            .arg(&self.script)
            .arg(action)
            .arg(chart)
            .arg("--values-json")
            .arg(values_json)
            .args(extra)
            .output()
            .map_err(|source| HelmError::Spawn {
                python: self.python.clone(),
                source,
            })?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            let stderr = String::from_utf8_lossy(&out.stderr);
            Err(HelmError::Refused {
                action,
                message: format!("{stdout}{stderr}").trim().to_string(),
            })
        }
    }

    /// Render `chart` with `values` (JSON, `null` for the defaults) as release `name` in
    /// `namespace`; the manifests as one YAML stream, without NOTES.txt.
    pub fn render(
        &self,
        chart: &Path,
        values: &Value,
        name: &str,
        namespace: &str,
    ) -> Result<String, HelmError> {
        self.run(
            "render",
            chart,
            values,
            &["--name", name, "--namespace", namespace],
        )
    }

    /// The rendered NOTES.txt.
    pub fn notes(&self, chart: &Path, values: &Value) -> Result<String, HelmError> {
        self.run("notes", chart, values, &[])
    }

    /// `helm upgrade --install --create-namespace --wait` into the cluster of `$KUBECONFIG`.
    pub fn install(
        &self,
        chart: &Path,
        values: &Value,
        name: &str,
        namespace: &str,
        timeout_seconds: u32,
    ) -> Result<String, HelmError> {
        let timeout = timeout_seconds.to_string();
        let args = [
            "--name",
            name,
            "--namespace",
            namespace,
            "--timeout",
            &timeout,
        ];
        self.run("install", chart, values, &args)
    }

    /// `helm lint --strict`; Ok with the report when there is no warning and no error.
    pub fn lint(&self, chart: &Path, values: &Value) -> Result<String, HelmError> {
        self.run("lint", chart, values, &[])
    }
}
