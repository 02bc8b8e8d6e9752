//! Test doubles for the node daemon, for tests, benches and the demo only (a dev-dependency of
//! the production crates, never a dependency):
//! - [`fixtures`]: sysfs, /dev and /proc trees built like the kernel's (a DGX H100 and variants,
//!   a Soft-RoCE VM), and helpers that change them as hardware would (a port going down);
//! - [`kubelet_emulator`]: the kubelet's side of the device plugin API over real unix sockets;
//! - [`pod_resources`]: the kubelet's pod resources API, listing the grants a test sets;
//! - [`cdi_runtime`]: what the kubelet and a CDI runtime make of a DRA driver's answer (the CDI
//!   ids each container gets, the environment and device nodes they inject);
//! - [`fixed_plugin`]: a device plugin over a fixed device list, also registered with a real
//!   kubelet as another vendor's (NVIDIA's `nvidia.com/gpu`).

pub mod cdi_runtime;
pub mod fixed_plugin;
pub mod fixtures;
pub mod kubelet_emulator;
pub mod pod_resources;
