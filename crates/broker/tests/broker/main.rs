//! The broker's integration tests; modules mirror `src/`.
// Lets clippy treat the shared helpers as test code (they may unwrap).
#![cfg(test)]

mod action;
mod audit;
mod broker;
mod config;
mod config_history;
mod config_peer;
mod config_proxy;
mod contract;
mod evidence;
mod federation;
mod federation_record;
mod journal;
mod projection;
mod provenance;
mod query;
mod retry;
mod ssh_keys;
mod support;
mod vault;
mod vectors;
