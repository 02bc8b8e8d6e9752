//! What a request asks for: the resource, namespace, name and subresource from its path, and
//! its query parameters, URL-decoded.

use std::collections::BTreeMap;

/// The resources the operator reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    Pods,
    Nodes,
    RoceFabrics,
    RoceNodes,
    ConfigMaps,
    /// The fabric key Secrets (created only).
    Secrets,
    Leases,
    Events,
}

impl Resource {
    pub const ALL: [Resource; 8] = [
        Resource::Pods,
        Resource::Nodes,
        Resource::RoceFabrics,
        Resource::RoceNodes,
        Resource::ConfigMaps,
        Resource::Secrets,
        Resource::Leases,
        Resource::Events,
    ];

    fn from_path(group_version: &str, plural: &str) -> Option<Resource> {
        Some(match (group_version, plural) {
            ("v1", "pods") => Resource::Pods,
            ("v1", "nodes") => Resource::Nodes,
            ("v1", "configmaps") => Resource::ConfigMaps,
            ("v1", "secrets") => Resource::Secrets,
            ("rocefabric.io/v1alpha1", "rocefabrics") => Resource::RoceFabrics,
            ("rocefabric.io/v1alpha1", "rocenodes") => Resource::RoceNodes,
            ("coordination.k8s.io/v1", "leases") => Resource::Leases,
            ("events.k8s.io/v1", "events") => Resource::Events,
            _ => return None,
        })
    }

    /// The resource of objects of `kind`.
    pub fn of_kind(kind: &str) -> Option<Resource> {
        Resource::ALL.into_iter().find(|r| r.kind() == kind)
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Resource::Pods | Resource::Nodes | Resource::ConfigMaps | Resource::Secrets => "v1",
            Resource::RoceFabrics | Resource::RoceNodes => "rocefabric.io/v1alpha1",
            Resource::Leases => "coordination.k8s.io/v1",
            Resource::Events => "events.k8s.io/v1",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Resource::Pods => "Pod",
            Resource::Nodes => "Node",
            Resource::ConfigMaps => "ConfigMap",
            Resource::Secrets => "Secret",
            Resource::RoceFabrics => "RoceFabric",
            Resource::RoceNodes => "RoceNode",
            Resource::Leases => "Lease",
            Resource::Events => "Event",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            Resource::Pods => "pods",
            Resource::Nodes => "nodes",
            Resource::ConfigMaps => "configmaps",
            Resource::Secrets => "secrets",
            Resource::RoceFabrics => "rocefabrics",
            Resource::RoceNodes => "rocenodes",
            Resource::Leases => "leases",
            Resource::Events => "events",
        }
    }
}

/// The object (or collection) a path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub resource: Resource,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The `status` subresource.
    pub status: bool,
}

/// Parse `/api/v1/...` and `/apis/{group}/{version}/...` paths.
pub fn route(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group_version, rest) = match parts.as_slice() {
        ["api", v, rest @ ..] => ((*v).to_string(), rest),
        ["apis", g, v, rest @ ..] => (format!("{g}/{v}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(decode(ns)), rest),
        _ => (None, rest),
    };
    let (plural, name, status) = match rest {
        [plural] => (*plural, None, false),
        [plural, name] => (*plural, Some(decode(name)), false),
        [plural, name, "status"] => (*plural, Some(decode(name)), true),
        _ => return None,
    };
    Some(Target {
        resource: Resource::from_path(&group_version, plural)?,
        namespace,
        name,
        status,
    })
}

/// Query parameters, decoded.
#[derive(Clone, Debug, Default)]
pub struct Query(BTreeMap<String, String>);

impl Query {
    pub fn parse(query: Option<&str>) -> Query {
        Query(
            query
                .unwrap_or_default()
                .split('&')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    (decode(k), decode(v))
                })
                .collect(),
        )
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    pub fn is_true(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    pub fn number(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(|v| v.parse().ok())
    }

    /// The parameters by name.
    pub fn into_map(self) -> BTreeMap<String, String> {
        self.0
    }
}

/// `application/x-www-form-urlencoded` decoding (`+` is a space), as kube encodes queries.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_every_call_the_operator_makes() {
        let t = route("/api/v1/namespaces/team-0001/pods/web-0000001").unwrap();
        assert_eq!(t.resource, Resource::Pods);
        assert_eq!(t.namespace.as_deref(), Some("team-0001"));
        assert_eq!(t.name.as_deref(), Some("web-0000001"));
        let t = route("/apis/rocefabric.io/v1alpha1/rocefabrics/scale/status").unwrap();
        assert!(t.status && t.resource == Resource::RoceFabrics);
        assert_eq!(route("/api/v1/nodes").unwrap().name, None);
        assert_eq!(
            route("/apis/coordination.k8s.io/v1/namespaces/default/leases/x")
                .unwrap()
                .resource,
            Resource::Leases
        );
        assert!(route("/apis/apps/v1/deployments").is_none());
    }

    #[test]
    fn queries_are_form_decoded() {
        let q = Query::parse(Some(
            "labelSelector=rocefabric.io%2Ffabric+in+%28a%2Cb%29&watch=true&limit=500&x=%zz",
        ));
        assert_eq!(
            q.get("labelSelector"),
            Some("rocefabric.io/fabric in (a,b)")
        );
        assert!(q.is_true("watch"));
        assert_eq!(q.number("limit"), Some(500));
        assert_eq!(q.get("x"), Some("%zz"));
    }
}
