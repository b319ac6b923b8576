//! What the operator side holds: the desktop console, the headless daemon's operator
//! socket and the CLI's local commands receive an [`OperatorApi`]. It reaches every part
//! of the broker (the vault, the journal and audit, the configuration, the pause and the
//! approval queue through the console that owns it), and hands the agent side its
//! narrower [`AgentApi`].
//!
//! Never: be handed to the agent side (the MCP server, the bridge's sessions, the
//! peering endpoint); they get [`OperatorApi::agent`] and [`OperatorApi::peer_service`].

use std::sync::Arc;

use super::AgentApi;
use crate::approvals::Approver;
use crate::audit::witnessing::Witnessing;
use crate::broker::Broker;
use crate::channel::http::HttpChannel;
use crate::channel::peer::PeerChannel;
use crate::channel::ssh::SshChannel;
use crate::config::ConfigHandle;
use crate::federation::serve::{PeerService, RefusalLog};
use crate::journal::{Journal, JournalError};
use crate::pause::AgentPause;
use crate::vault::Vault;

/// The operator side's handle on a running broker. Clones share it.
#[derive(Clone)]
pub struct OperatorApi {
    broker: Arc<Broker>,
}

impl OperatorApi {
    pub(crate) fn new(broker: Broker) -> Self {
        OperatorApi {
            broker: Arc::new(broker),
        }
    }

    /// The agent side's handle on the same broker.
    pub fn agent(&self) -> AgentApi {
        AgentApi::new(self.broker.clone())
    }

    /// What this broker answers federated peers, logging refusals to `log`.
    pub fn peer_service(&self, log: RefusalLog) -> PeerService {
        let b = &self.broker;
        PeerService::new(
            crate::federation::serve::Parts {
                journal: b.journal.clone(),
                config: b.config.clone(),
                pause: b.pause.clone(),
                approver: b.approver.clone(),
                http: b.http.clone(),
            },
            log,
        )
    }

    /// The journal: the record, its audit checkpoints, searches and exports.
    pub fn journal(&self) -> &Journal {
        &self.broker.journal
    }

    /// The credential store.
    pub fn vault(&self) -> &Arc<Vault> {
        &self.broker.vault
    }

    /// The live targets configuration.
    pub fn config(&self) -> &ConfigHandle {
        &self.broker.config
    }

    /// Whether agent calls are paused (set with [`OperatorApi::set_agents_paused`]).
    pub fn pause(&self) -> &AgentPause {
        &self.broker.pause
    }

    /// The approval console attached, if any.
    pub fn approver(&self) -> Option<&Arc<dyn Approver>> {
        self.broker.approver.as_ref()
    }

    /// Sends checkpoints to the configured witnesses; the front end spawns
    /// [`Witnessing::run`] on its runtime.
    pub fn witnessing(&self) -> &Arc<Witnessing> {
        &self.broker.witnessing
    }

    /// The HTTP channel (the operator's own runs and reconciliations).
    pub fn http(&self) -> &HttpChannel {
        &self.broker.http
    }

    /// The SSH channel.
    pub fn ssh(&self) -> &SshChannel {
        &self.broker.ssh
    }

    /// The federated peers' channel.
    pub fn peer(&self) -> &PeerChannel {
        &self.broker.peer
    }

    /// The operator pauses (or resumes) agent calls, recorded under `operator`.
    /// Returns whether the state changed.
    ///
    /// # Errors
    ///
    /// The journal's, when it could not record the change: a pause then holds anyway,
    /// a resume does not happen.
    pub fn set_agents_paused(&self, paused: bool, operator: &str) -> Result<bool, JournalError> {
        self.broker.set_agents_paused(paused, operator)
    }
}
