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

    /// Whether the daemon reads the kubelet's pod resources API to learn who holds devices, and
    /// withholds them while it cannot: in `both` mode (our device plugin's grants, and the GPU
    /// resource's whoever made them), and in `dra` mode when it publishes GPUs (NVIDIA's device
    /// plugin may serve the same GPUs). Never in `devicePlugin` mode, nor in `dra` mode without
    /// GPUs (no device plugin can then hold a device the driver publishes).
    pub fn reads_grants(self, dra_gpus: bool) -> bool {
        match self {
            Mode::DevicePlugin => false,
            Mode::Dra => dra_gpus,
            Mode::Both => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_are_read_wherever_a_published_device_may_be_another_plugins() {
        for (mode, gpus, reads) in [
            (Mode::DevicePlugin, true, false),
            (Mode::Dra, true, true),
            (Mode::Dra, false, false),
            (Mode::Both, true, true),
            (Mode::Both, false, true),
        ] {
            assert_eq!(mode.reads_grants(gpus), reads, "{mode:?}, GPUs {gpus}");
        }
    }
}
