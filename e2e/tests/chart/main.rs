//! The Helm chart, rendered by the real Helm engine (Helm v4's Go library through
//! `helm-python-sdk`), checked for least privilege and for agreement with the binaries it runs.
//!
//! Without the engine installed these tests print `SKIPPED: chart (...)` and return;
//! `.ci/helm-check` installs it and sets `ROCEFABRIC_REQUIRE_HELM=1`, so CI never skips them.

mod binaries;
mod crds;
mod dra;
mod helpers;
mod monitoring;
mod pods;
mod rbac;
mod render;
