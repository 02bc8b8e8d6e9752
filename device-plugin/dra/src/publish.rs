//! The node's `ResourceSlice` on the API server: created when missing, replaced with the pool's
//! generation bumped when the devices change, left alone otherwise.

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, PostParams};

use super::devices::DraDevice;
use super::slice;

/// Writes the node's slice.
pub struct SlicePublisher {
    api: Api<ResourceSlice>,
    node: String,
    /// The devices last written (or found written); `None` before the first publish.
    last: Option<Vec<DraDevice>>,
}

impl SlicePublisher {
    pub fn new(client: kube::Client, node: &str) -> Self {
        Self {
            api: Api::all(client),
            node: node.to_string(),
            last: None,
        }
    }

    /// Make the slice list `devices`; `Ok(Some(generation))` when it was written.
    pub async fn publish(&mut self, devices: &[DraDevice]) -> Result<Option<i64>, kube::Error> {
        if self.last.as_deref() == Some(devices) {
            return Ok(None);
        }
        let name = slice::slice_name(&self.node);
        let written = match self.api.get_opt(&name).await? {
            Some(existing) if slice::same_devices(&existing.spec, &self.node, devices) => None,
            Some(existing) => {
                let generation = existing.spec.pool.generation.saturating_add(1);
                let mut object = slice::resource_slice(&self.node, generation, devices);
                object.metadata.resource_version = existing.metadata.resource_version;
                self.api
                    .replace(&name, &PostParams::default(), &object)
                    .await?;
                Some(generation)
            }
            None => {
                let object = slice::resource_slice(&self.node, 1, devices);
                self.api.create(&PostParams::default(), &object).await?;
                Some(1)
            }
        };
        self.last = Some(devices.to_vec());
        Ok(written)
    }

    /// Forget what was written, so the next publish reads the slice again (after an error, or
    /// when someone else may have changed it).
    pub fn invalidate(&mut self) {
        self.last = None;
    }
}
