//! Names in Kubernetes objects that the operator, the node daemon and the pods' containers
//! agree on.

/// Pod annotation holding the pod's shared memory window (JSON, a
/// [`RegionAssignment`](crate::region::RegionAssignment)), written by the operator and read by
/// the pod's data plane through the downward API.
pub const REGION_ANNOTATION: &str = "rocefabric.io/region";
/// Pod annotation by which a pod asks for a region size other than the fabric's `regionSize`
/// (a Kubernetes quantity, rounded up to whole regions).
pub const REGION_SIZE_ANNOTATION: &str = "rocefabric.io/region-size";
/// Pod annotation the operator writes when it takes back the window of a pod that was not bound
/// to a node in time (`sharedMemory.reclaimUnboundAfterSeconds`): why, in words. The
/// `rocefabric.io/region` annotation is removed in the same write, and the pod gets no other
/// window.
pub const REGION_RECLAIMED_ANNOTATION: &str = "rocefabric.io/region-reclaimed";
/// Scheduling gate the operator removes once the pod's region annotation is written.
pub const REGION_SCHEDULING_GATE: &str = "rocefabric.io/region";
/// Label the operator puts on each RoceNode and region directory: the fabric that owns it.
pub const FABRIC_LABEL: &str = "rocefabric.io/fabric";
/// Suffix of the per-namespace region directory ConfigMap (`<fabric>-regions`).
pub const REGION_DIRECTORY_SUFFIX: &str = "-regions";
/// The one key of the region directory ConfigMap (see [`directory`](crate::directory)).
pub const DIRECTORY_KEY: &str = "regions.json";
/// Suffix of the per-namespace fabric key Secret (`<fabric>-key`), written by the operator beside
/// the region directory and mounted read-only by the fabric's pods: what the data plane's
/// rendezvous proves membership with.
pub const FABRIC_KEY_SUFFIX: &str = "-key";
/// Key of the fabric key Secret holding the key itself (32 random bytes).
pub const FABRIC_KEY_KEY: &str = "key";
/// Key of the fabric key Secret holding the namespace it was written for.
pub const FABRIC_KEY_NAMESPACE_KEY: &str = "namespace";

/// How `rocefabric-dsm` begins its termination message (and its last line on stderr) when this
/// pod's window cannot be backed or pinned: the operator names such pods in the fabric's status.
pub const WINDOW_FAILED_MESSAGE_PREFIX: &str = "rocefabric-dsm: local window of ";
