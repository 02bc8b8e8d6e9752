//! The device plugin's YAML configuration (`--config`): every field has a default, unknown fields
//! and duplicate keys are rejected (a typo must not silently fall back to a default, nor a second
//! `hca:` silently replace the first), type errors name the field path (`hca.sharedReplicas`),
//! [`Config::validate`] names the offending field and value, and a file larger than
//! [`CONFIG_FILE_LIMIT`] is refused unread.
//!
//! ```yaml
//! pollInterval: 500ms          # health/membership poll of sysfs; "1s" by default
//! hca:
//!   resourceName: rdma/hca
//!   sharedReplicas: 1          # N > 1 advertises every HCA N times so N pods can share it
//!   selector:                  # narrows which RoCE HCAs are served (see rocefabric_api::NicSelector)
//!     vendors: ["15b3"]
//!     deviceIds: ["1021"]
//! gpu:
//!   enabled: false             # NVIDIA's own device plugin serves the GPUs in the usual setup
//!   resourceName: nvidia.com/gpu
//! gpuHca:
//!   enabled: false             # GPU + rail HCA pairs: only where rocefabric owns the node's GPUs
//!   resourceName: rdma/gpu-hca
//! trafficClass: 106            # NCCL_IB_TC / UCX_IB_TRAFFIC_CLASS handed to workloads
//! qosGate: auto                # auto | enabled | disabled
//! softRoce: exclude            # exclude | include: advertise virtual RDMA devices (Soft-RoCE rxe)
//! ```
//!
//! Each device is served by one resource (see [`crate::ownership`]): with `gpuHca` on, the rail
//! HCAs and their GPUs leave `rdma/hca` and `gpu`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rocefabric_api::NicSelector;
use rocefabric_api::constants::{DEFAULT_GPU_RESOURCE, GPU_HCA_RESOURCE, HCA_RESOURCE};
use rocefabric_input::read::{ReadError, read_file};
use rocefabric_input::yaml;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::model::Inventory;

/// Most bytes read from a `--config` file (this one, and `qos apply`'s): far above any real
/// config, and `--config /dev/zero` fails instead of filling memory.
pub const CONFIG_FILE_LIMIT: u64 = 1 << 20;

/// Largest accepted `hca.sharedReplicas`: each replica is one kubelet device, and beyond a few
/// hundred pods per HCA the sharing is a configuration mistake rather than a plan.
pub const MAX_SHARED_REPLICAS: u32 = 1024;

/// The whole device plugin configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Config {
    /// How often sysfs is re-read for health and membership changes (`"1s"`, `"500ms"`).
    #[serde(with = "duration_text")]
    pub poll_interval: Duration,
    pub hca: HcaConfig,
    pub gpu: GpuConfig,
    pub gpu_hca: PairConfig,
    /// ToS byte of the fabric's RoCE traffic, handed to workloads as `NCCL_IB_TC` and
    /// `UCX_IB_TRAFFIC_CLASS`. Unset: those variables are not set (the RoceNode may supply it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_class: Option<u8>,
    /// Whether HCAs are reported Healthy only while the node's RoCE QoS is applied.
    pub qos_gate: QosGate,
    /// Whether virtual RDMA devices (Soft-RoCE `rxe`) are served next to hardware HCAs.
    pub soft_roce: SoftRoce,
}

/// Serving of virtual (software) RDMA devices, which have no PCI function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SoftRoce {
    /// Never advertise them: a production node must not hand out a soft device that a
    /// workload would take for one of its ConnectX ports. `discover` still lists them.
    #[default]
    Exclude,
    /// Advertise them like hardware HCAs (test clusters, CI, development machines).
    Include,
}

impl SoftRoce {
    /// The inventory `serve` advertises: virtual HCAs removed unless included.
    pub fn apply(self, inventory: &mut Inventory) {
        if self == SoftRoce::Exclude {
            inventory.hcas.retain(|h| !h.is_virtual());
        }
    }
}

/// The `rdma/hca` resource.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HcaConfig {
    pub resource_name: String,
    /// Each HCA is advertised this many times (device IDs `<id>#<k>` when above 1).
    pub shared_replicas: u32,
    /// Which RoCE HCAs are served; empty serves all.
    #[serde(
        deserialize_with = "strict_selector",
        skip_serializing_if = "NicSelector::is_empty"
    )]
    pub selector: NicSelector,
}

/// The GPU resource. Off by default: NVIDIA's device plugin usually serves `nvidia.com/gpu`, and
/// two plugins registering one resource name displace each other at every restart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GpuConfig {
    pub enabled: bool,
    pub resource_name: String,
}

/// The GPU + closest HCA pair resource. Off by default: a pair hands out a GPU, so it is for nodes
/// whose GPUs no other plugin serves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PairConfig {
    pub enabled: bool,
    pub resource_name: String,
}

/// Gating of HCA health on the node's QoS state (RoceNode `QosApplied`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum QosGate {
    /// Gate when a RoceNode exists for this node, otherwise report link health only.
    #[default]
    Auto,
    /// Always gate: without an applied QoS, HCAs are Unhealthy.
    Enabled,
    /// Never gate.
    Disabled,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            poll_interval: Duration::from_secs(1),
            hca: HcaConfig::default(),
            gpu: GpuConfig::default(),
            gpu_hca: PairConfig::default(),
            traffic_class: None,
            qos_gate: QosGate::Auto,
            soft_roce: SoftRoce::Exclude,
        }
    }
}

impl Default for HcaConfig {
    fn default() -> Self {
        HcaConfig {
            resource_name: HCA_RESOURCE.to_string(),
            shared_replicas: 1,
            selector: NicSelector::default(),
        }
    }
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            enabled: false,
            resource_name: DEFAULT_GPU_RESOURCE.to_string(),
        }
    }
}

impl Default for PairConfig {
    fn default() -> Self {
        PairConfig {
            enabled: false,
            resource_name: GPU_HCA_RESOURCE.to_string(),
        }
    }
}

/// The three resources the plugin serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceKind {
    /// `rdma/hca`: one RoCE HCA (or a replica of one).
    Hca,
    /// GPUs (`nvidia.com/gpu` by default).
    Gpu,
    /// `rdma/gpu-hca`: one GPU with its closest HCA.
    GpuHca,
}

impl ResourceKind {
    pub const ALL: [ResourceKind; 3] = [ResourceKind::Hca, ResourceKind::Gpu, ResourceKind::GpuHca];

    /// The extended resource name the config gives this kind.
    pub fn resource_name(self, cfg: &Config) -> &str {
        match self {
            ResourceKind::Hca => &cfg.hca.resource_name,
            ResourceKind::Gpu => &cfg.gpu.resource_name,
            ResourceKind::GpuHca => &cfg.gpu_hca.resource_name,
        }
    }

    /// Whether the config serves this kind (`rdma/hca` always is).
    pub fn enabled(self, cfg: &Config) -> bool {
        match self {
            ResourceKind::Hca => true,
            ResourceKind::Gpu => cfg.gpu.enabled,
            ResourceKind::GpuHca => cfg.gpu_hca.enabled,
        }
    }

    /// The kinds the config serves, in a fixed order.
    pub fn enabled_kinds(cfg: &Config) -> Vec<ResourceKind> {
        Self::ALL.into_iter().filter(|k| k.enabled(cfg)).collect()
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `source` names the file already.
    #[error("cannot load config: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: ReadError,
    },
    #[error("failed to parse config{}: {source}", display_path(path.as_deref()))]
    Parse {
        path: Option<PathBuf>,
        #[source]
        source: yaml::Error,
    },
    #[error("invalid config{}: {field} = {value}: {reason}", display_path(path.as_deref()))]
    Invalid {
        path: Option<PathBuf>,
        field: String,
        value: String,
        reason: String,
    },
}

impl ConfigError {
    /// Short category, for metrics and log fields.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ConfigError::Read { .. } => "read",
            ConfigError::Parse { .. } => "parse",
            ConfigError::Invalid { .. } => "invalid",
        }
    }

    fn with_path(self, p: &Path) -> Self {
        match self {
            ConfigError::Parse { source, .. } => ConfigError::Parse {
                path: Some(p.to_path_buf()),
                source,
            },
            ConfigError::Invalid {
                field,
                value,
                reason,
                ..
            } => ConfigError::Invalid {
                path: Some(p.to_path_buf()),
                field,
                value,
                reason,
            },
            other => other,
        }
    }
}

fn display_path(path: Option<&Path>) -> String {
    path.map(|p| format!(" {}", p.display()))
        .unwrap_or_default()
}

fn invalid(field: &str, value: impl fmt::Display, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        path: None,
        field: field.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

impl Config {
    /// Read, parse and validate a YAML config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = read_file(path, CONFIG_FILE_LIMIT).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_yaml(&text).map_err(|e| e.with_path(path))
    }

    /// Parse and validate YAML text. An empty document (or only comments) gives the defaults.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        let parse = |source| ConfigError::Parse { path: None, source };
        let value: serde_json::Value = yaml::from_str(text).map_err(parse)?;
        let config: Config = if value.is_null() {
            Config::default()
        } else {
            yaml::typed(value).map_err(|e| parse(e.into()))?
        };
        config.validate()?;
        Ok(config)
    }

    /// Reject values the daemon cannot run with, naming the field (YAML path) and value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.poll_interval.is_zero() {
            return Err(invalid(
                "pollInterval",
                duration_text::format(self.poll_interval),
                "must be greater than zero",
            ));
        }
        if self.hca.shared_replicas == 0 || self.hca.shared_replicas > MAX_SHARED_REPLICAS {
            return Err(invalid(
                "hca.sharedReplicas",
                self.hca.shared_replicas,
                format!("must be between 1 and {MAX_SHARED_REPLICAS}"),
            ));
        }
        self.hca.selector.check().map_err(|e| {
            invalid(
                &format!("hca.selector.{}", e.field),
                format!("{:?}", e.value),
                e.reason,
            )
        })?;
        let names = [
            ("hca.resourceName", &self.hca.resource_name, true),
            (
                "gpu.resourceName",
                &self.gpu.resource_name,
                self.gpu.enabled,
            ),
            (
                "gpuHca.resourceName",
                &self.gpu_hca.resource_name,
                self.gpu_hca.enabled,
            ),
        ];
        for (field, name, _) in &names {
            rocefabric_api::resource_name::check_extended_resource_name(name)
                .map_err(|reason| invalid(field, format!("{name:?}"), reason))?;
        }
        for (i, (field, name, enabled)) in names.iter().enumerate() {
            if !enabled {
                continue;
            }
            // The kubelet keeps one plugin per name: NVIDIA's plugin and ours would displace each
            // other, and pods asking for GPUs would get HCAs or pairs.
            if *field != "gpu.resourceName" && name.as_str() == DEFAULT_GPU_RESOURCE {
                return Err(invalid(
                    field,
                    format!("{name:?}"),
                    "is the GPU resource name NVIDIA's device plugin registers; only gpu.resourceName may use it",
                ));
            }
            if let Some((other, _, _)) = names[..i]
                .iter()
                .find(|(_, n, on)| *on && n.as_str() == name.as_str())
            {
                return Err(invalid(
                    field,
                    format!("{name:?}"),
                    format!("already used by {other}; each resource needs its own name"),
                ));
            }
        }
        Ok(())
    }
}

/// `NicSelector` with unknown fields rejected (the API type itself is lenient, as CRD types are).
fn strict_selector<'de, D: Deserializer<'de>>(d: D) -> Result<NicSelector, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Strict {
        #[serde(default)]
        vendors: Vec<String>,
        #[serde(default)]
        device_ids: Vec<String>,
        #[serde(default)]
        pci_addresses: Vec<String>,
        #[serde(default)]
        rdma_devices: Vec<String>,
        #[serde(default)]
        netdevs: Vec<String>,
    }
    let s = Option::<Strict>::deserialize(d)?;
    Ok(s.map(|s| NicSelector {
        vendors: s.vendors,
        device_ids: s.device_ids,
        pci_addresses: s.pci_addresses,
        rdma_devices: s.rdma_devices,
        netdevs: s.netdevs,
    })
    .unwrap_or_default())
}

/// Durations written as an integer with a unit: `500ms`, `1s`, `2m`, `1h`.
pub mod duration_text {
    use super::*;

    /// Parse `"<integer><ms|s|m|h>"`.
    pub fn parse(text: &str) -> Result<Duration, String> {
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (digits, unit) = t.split_at(split);
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("{text:?} is not a duration such as \"1s\" or \"500ms\""))?;
        let secs = |mult: u64| {
            n.checked_mul(mult)
                .map(Duration::from_secs)
                .ok_or_else(|| format!("{text:?} is too large"))
        };
        match unit {
            "ms" => Ok(Duration::from_millis(n)),
            "s" => secs(1),
            "m" => secs(60),
            "h" => secs(3600),
            _ => Err(format!(
                "{text:?} has no unit; use ms, s, m or h (\"1s\", \"500ms\")"
            )),
        }
    }

    /// The shortest exact text for `d` (`"1s"`, `"1500ms"`).
    pub fn format(d: Duration) -> String {
        let ms = d.as_millis();
        if ms.is_multiple_of(1000) {
            format!("{}s", ms / 1000)
        } else {
            format!("{ms}ms")
        }
    }

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(*d))
    }

    /// A bare number (`pollInterval: 1`) is a YAML integer, not text: named as having no unit.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            other => {
                return Err(serde::de::Error::custom(format!(
                    "expected a duration such as \"1s\", found {}",
                    rocefabric_input::shown(&other.to_string())
                )));
            }
        };
        parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_format() {
        assert_eq!(duration_text::parse("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(
            duration_text::parse("500ms"),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(duration_text::parse("2m"), Ok(Duration::from_secs(120)));
        assert!(duration_text::parse("1").is_err());
        assert!(duration_text::parse("1.5s").is_err());
        assert!(duration_text::parse("s").is_err());
        assert_eq!(duration_text::format(Duration::from_millis(1500)), "1500ms");
        assert_eq!(duration_text::format(Duration::from_secs(3)), "3s");
    }
}
