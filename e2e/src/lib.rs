//! Node-level and real-cluster end-to-end suites for rocefabric (tests live in `tests/`).
