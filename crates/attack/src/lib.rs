//! The attack harness's behaviours, for the `redoubt-attack` binary and tests: faulty
//! replicas ([`replica`], through `redoubt_node::Tamper`) and faulty clients ([`client`],
//! through `redoubt_client::Rewrite`). Not part of a deployment.

pub mod client;
pub mod replica;
