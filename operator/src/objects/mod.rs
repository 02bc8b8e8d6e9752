//! The objects the planner holds, owned by it rather than k8s-openapi's: each keeps only the
//! fields the planner reads, labels interned ([`labels`]), and is decoded straight from the
//! watch stream, list pages and `plan`'s files, so the whole object is never built.
//! [`Wire`] is the shape a watch decodes them in (kube's watcher reads a resourceVersion off
//! each object's metadata).

pub mod labels;
mod node;
mod pod;
mod roce_node;
mod wire;

pub use labels::{Labels, Matcher, Sym, intern};
pub use node::CompactNode;
pub use pod::CompactPod;
pub use roce_node::{CompactRoceNode, NodeReport};
pub use wire::{Compact, Wire};
