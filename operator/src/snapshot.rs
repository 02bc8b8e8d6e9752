//! Loading Kubernetes objects from YAML files as `kubectl get -o yaml` writes them.
