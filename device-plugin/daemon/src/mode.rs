//! Which kubelet APIs the node daemon serves.

/// Which kubelet APIs the node daemon serves (`serve --mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// The device plugin API only (`rdma/hca`, GPUs, `rdma/gpu-hca`).
    #[default]
    #[value(name = "devicePlugin")]
    DevicePlugin,
    /// DRA only: ResourceSlices, NodePrepareResources, CDI.
    #[value(name = "dra")]
    Dra,
    /// Both, with one ledger so no device goes to two pods.
    #[value(name = "both")]
    Both,
}

impl Mode {
    pub fn device_plugin(self) -> bool {
        matches!(self, Mode::DevicePlugin | Mode::Both)
    }

    pub fn dra(self) -> bool {
        matches!(self, Mode::Dra | Mode::Both)
    }
}
