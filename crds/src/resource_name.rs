//! Kubernetes extended resource names (`rdma/hca`), as the API server and the kubelet accept them.

/// Check a Kubernetes extended resource name: `<domain>/<name>` where the domain is a DNS
/// subdomain outside `kubernetes.io` and the name a qualified-name part (at most 63 characters,
/// alphanumeric at both ends, `-`, `_`, `.` inside).
pub fn check_extended_resource_name(name: &str) -> Result<(), String> {
    let Some((domain, local)) = name.split_once('/') else {
        return Err(
            "expected <domain>/<name> such as rdma/hca (a domain prefix is required)".into(),
        );
    };
    if domain.is_empty() || domain.len() > 253 {
        return Err("the domain prefix must be 1 to 253 characters".into());
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if !domain.split('.').all(label_ok) {
        return Err(format!(
            "domain prefix {domain:?} is not a DNS subdomain (lowercase letters, digits, '-', '.')"
        ));
    }
    if domain == "kubernetes.io" || domain.ends_with(".kubernetes.io") {
        return Err("the kubernetes.io domain is reserved for native resources".into());
    }
    let inner_ok = local
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let ends_ok = local
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && local
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if local.is_empty() || local.len() > 63 || !inner_ok || !ends_ok {
        return Err(format!(
            "name {local:?} must be 1 to 63 characters, alphanumeric at both ends, with '-', '_' or '.' inside"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_resource_names() {
        assert!(check_extended_resource_name("rdma/hca").is_ok());
        assert!(check_extended_resource_name("nvidia.com/gpu").is_ok());
        assert!(check_extended_resource_name("example.com/gpu_hca.v1").is_ok());
        assert!(check_extended_resource_name("hca").is_err());
        assert!(check_extended_resource_name("/hca").is_err());
        assert!(check_extended_resource_name("Rdma/hca").is_err());
        assert!(check_extended_resource_name("rdma/").is_err());
        assert!(check_extended_resource_name("rdma/-hca").is_err());
        assert!(check_extended_resource_name("rdma/a/b").is_err());
        assert!(check_extended_resource_name("kubernetes.io/hca").is_err());
        assert!(check_extended_resource_name(&format!("rdma/{}", "a".repeat(64))).is_err());
    }
}
