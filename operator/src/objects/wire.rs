//! A compact object as a watch decodes it.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{Deserialize, DeserializeOwned, Deserializer};

use super::{CompactNode, CompactPod, CompactRoceNode, node, roce_node};

/// A compact object standing for the API kind `Full`.
pub trait Compact: DeserializeOwned + Clone + std::fmt::Debug {
    type Full: Resource<DynamicType = ()>;
    /// Whether the watch asks for metadata only (`PartialObjectMetadata`).
    const METADATA_ONLY: bool;
    /// Decode the object and its `metadata.resourceVersion`.
    fn decode<'de, D: Deserializer<'de>>(d: D) -> Result<(Self, Option<String>), D::Error>;
}

impl Compact for CompactPod {
    type Full = k8s_openapi::api::core::v1::Pod;
    const METADATA_ONLY: bool = false;
    fn decode<'de, D: Deserializer<'de>>(d: D) -> Result<(Self, Option<String>), D::Error> {
        let pod = Self::deserialize(d)?;
        let rv = pod.resource_version.clone();
        Ok((pod, rv))
    }
}

impl Compact for CompactNode {
    type Full = k8s_openapi::api::core::v1::Node;
    const METADATA_ONLY: bool = true;
    fn decode<'de, D: Deserializer<'de>>(d: D) -> Result<(Self, Option<String>), D::Error> {
        Ok(node::Raw::deserialize(d)?.split())
    }
}

impl Compact for CompactRoceNode {
    type Full = rocefabric_api::RoceNode;
    const METADATA_ONLY: bool = false;
    fn decode<'de, D: Deserializer<'de>>(d: D) -> Result<(Self, Option<String>), D::Error> {
        roce_node::decode(d)
    }
}

/// A compact object and the metadata kube's watcher reads (only its resourceVersion): what
/// `Api<Wire<T>>` lists and watches. Transient: the feed keeps the object.
#[derive(Clone, Debug)]
pub struct Wire<T> {
    meta: ObjectMeta,
    pub object: T,
}

impl<'de, T: Compact> Deserialize<'de> for Wire<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (object, resource_version) = T::decode(d)?;
        Ok(Self {
            meta: ObjectMeta {
                resource_version,
                ..ObjectMeta::default()
            },
            object,
        })
    }
}

impl<T: Compact> Resource for Wire<T> {
    type DynamicType = ();
    type Scope = <T::Full as Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        T::Full::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        T::Full::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        T::Full::version(dt)
    }
    fn api_version(dt: &()) -> Cow<'_, str> {
        T::Full::api_version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        T::Full::plural(dt)
    }
    fn metadata_api() -> bool {
        T::METADATA_ONLY
    }
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}
