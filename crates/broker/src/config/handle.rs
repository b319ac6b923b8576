//! The configuration in force ([`ConfigHandle`]): one snapshot, swapped whole on
//! reload, read without holding a lock across a call.

use super::Config;

/// The configuration in force. A reload swaps the whole snapshot; an invocation binds
/// the version it validated against and re-checks it right before dispatch.
#[derive(Clone)]
pub struct ConfigHandle(std::sync::Arc<std::sync::RwLock<std::sync::Arc<Config>>>);

impl ConfigHandle {
    pub fn new(config: Config) -> Self {
        use std::sync::{Arc, RwLock};
        ConfigHandle(Arc::new(RwLock::new(Arc::new(config))))
    }

    pub fn current(&self) -> std::sync::Arc<Config> {
        match self.0.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn replace(&self, config: Config) {
        let config = std::sync::Arc::new(config);
        match self.0.write() {
            Ok(mut g) => *g = config,
            Err(poisoned) => *poisoned.into_inner() = config,
        }
    }
}
