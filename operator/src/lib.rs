//! rocefabric operator library.
pub mod apply;
pub mod cli;
pub mod controller;
pub mod feed;
pub mod heap;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod objects;
pub mod overlay;
pub mod planner;
pub mod rate;
pub mod regions;
pub mod snapshot;
pub mod trim;
pub mod write_client;
