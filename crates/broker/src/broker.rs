//! The engine assembled: the journal (signed with the audit key from the keychain), what
//! a crash interrupted closed with what its evidence proves, the vault with its metadata,
//! the targets file, and the HTTP and SSH channels over them.
//!
//! [`Broker::open`] is the one place this happens; the headless daemon and the desktop
//! console both call it (after checking their own paths: the data dir must exist and be
//! writable). It prints nothing: what deserves the operator's attention comes back as
//! [`OpenWarning`]s for the caller to show.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::api::OperatorApi;
use crate::approvals::Approver;
use crate::audit::witnessing::Witnessing;
use crate::audit::{AuditKeyError, last_checkpoint_key, signing_key_from_vault};
use crate::channel::http::HttpChannel;
use crate::channel::peer::PeerChannel;
use crate::channel::ssh::SshChannel;
use crate::clock::{Clock, SystemClock};
use crate::config::ConfigHandle;
use crate::config::{Config, ConfigError, ConfigWarning};
use crate::journal::{Journal, JournalError, JournalOptions};
use crate::pause::AgentPause;
use crate::sealed_store::VaultKey;
use crate::vault::{Keychain, KeychainBackend, Vault, VaultError};

/// The journal's file name inside the data dir.
pub const JOURNAL_FILE: &str = "journal.db";

/// One running broker: what every agent session and the operator's console share.
pub struct Broker {
    /// The HTTP channel.
    pub(crate) http: HttpChannel,
    /// The SSH channel.
    pub(crate) ssh: SshChannel,
    /// Calls to capabilities other brokers export (`peer://`), and their listings.
    pub(crate) peer: PeerChannel,
    pub(crate) journal: Journal,
    /// The live targets configuration (swapped when the operator edits a target).
    pub(crate) config: ConfigHandle,
    /// The approval console, when one is attached (the desktop app). A headless daemon
    /// has none: targets that need approval fail fast with NO_APPROVER.
    pub(crate) approver: Option<Arc<dyn Approver>>,
    /// The credential store: read by the pipeline for injection, written only from the
    /// operator side (the console's credentials screen); no agent tool reaches it.
    pub(crate) vault: Arc<Vault>,
    /// Sends checkpoints to the configured witnesses; the front end spawns
    /// [`Witnessing::run`] on its runtime.
    pub(crate) witnessing: Arc<Witnessing>,
    /// Whether the operator paused agent calls: read by the MCP server, set only from
    /// the operator side.
    pub(crate) pause: Arc<AgentPause>,
}

/// What [`Broker::open`] needs.
pub struct BrokerOptions {
    /// Holds the journal ([`JOURNAL_FILE`]) and the vault metadata. It must exist and
    /// take new files.
    pub data_dir: PathBuf,
    /// The targets file.
    pub config: PathBuf,
    /// Where credentials and the audit signing key live.
    pub keychain: KeychainBackend,
    /// The keychain service name (tests use their own; the product uses "postern").
    pub service: String,
    /// The approval console, if one is attached.
    pub approver: Option<Arc<dyn Approver>>,
    /// Where to keep the latest checkpoint outside the data dir (see
    /// [`crate::audit::default_anchor`]); `None` keeps none.
    pub anchor: Option<PathBuf>,
    /// The key of the `file` keychain (required for it, ignored by the others).
    pub vault_key: Option<VaultKey>,
}

/// Something the operator should know about a broker that opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenWarning {
    /// The keychain's audit signing key did not sign the journal's earlier checkpoints
    /// (the keychain lost the old one): those verify only against the key that signed
    /// them.
    #[error(
        "the audit signing key in the keychain is not the key that signed this journal's \
         earlier checkpoints (the keychain lost it); `postern audit verify` will report \
         those checkpoints as not signed by the current key"
    )]
    SigningKeyChanged,
    /// The targets file loads but has something to look at.
    #[error("{0}")]
    Config(ConfigWarning),
}

/// Why a broker could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Journal(#[from] JournalError),
    #[error("{0}")]
    Vault(#[from] VaultError),
    #[error("{0}")]
    AuditKey(#[from] AuditKeyError),
}

/// A broker that opened, with what the operator should be told about it.
pub struct Opened {
    /// The operator side's handle; it hands the agent side [`OperatorApi::agent`].
    pub operator: OperatorApi,
    /// In the order they were found: the signing key first, then the targets file.
    pub warnings: Vec<OpenWarning>,
}

impl Broker {
    /// The operator pauses (or resumes) agent calls; the change is recorded in the
    /// journal under `operator` (see [`AgentPause::set_recorded`]). Returns whether the
    /// state changed.
    ///
    /// # Errors
    ///
    /// The journal's, when it could not record the change: a pause then holds anyway,
    /// a resume does not happen.
    pub(crate) fn set_agents_paused(
        &self,
        paused: bool,
        operator: &str,
    ) -> Result<bool, JournalError> {
        self.pause
            .set_recorded(paused, |p| self.journal.record_agent_pause(p, operator))
    }

    /// The journal file of a data dir.
    pub fn journal_path(data_dir: &Path) -> PathBuf {
        data_dir.join(JOURNAL_FILE)
    }

    /// Opens the broker over `options.data_dir`: the audit signing key from the keychain
    /// (made on first use), the journal, recovery of what a crash interrupted, the
    /// vault, the targets file and the channels.
    ///
    /// # Errors
    ///
    /// The first step that failed; nothing after it was opened.
    pub fn open(options: BrokerOptions) -> Result<Opened, OpenError> {
        let BrokerOptions {
            data_dir,
            config,
            keychain,
            service,
            approver,
            anchor,
            vault_key,
        } = options;
        let mut warnings = Vec::new();
        let db = Broker::journal_path(&data_dir);
        let clock = Arc::new(SystemClock);
        let keychain = match (keychain, vault_key) {
            (KeychainBackend::File, Some(key)) => Keychain::file(&data_dir, &key, service)?,
            (backend, _) => Keychain::new(backend, service)?,
        };
        let vault = Arc::new(Vault::open(keychain, &db)?);
        let signing_key = signing_key_from_vault(&vault, clock.now_ms())?;
        if let Some(previous) = last_checkpoint_key(&db)
            && previous != signing_key.verifying_key().to_bytes()
        {
            warnings.push(OpenWarning::SigningKeyChanged);
        }
        let journal = Journal::open(
            &db,
            JournalOptions {
                anchor,
                ..JournalOptions::new(clock, signing_key)
            },
        )?;
        // What a crash interrupted is closed with what its evidence proves.
        journal.recover_interrupted()?;
        // A pause the operator set holds across a restart until they resume agents.
        let pause = Arc::new(AgentPause::new(journal.agent_pause()?));
        let loaded = Config::load(&config)?;
        warnings.extend(loaded.warnings().into_iter().map(OpenWarning::Config));
        let config = ConfigHandle::new(loaded);
        // Stored results are kept as `[results]` says; expired ones are recorded as such.
        // A first pass that fails (a full disk, say) is retried by the writer's periodic
        // pass, and must not keep the broker from opening.
        let live = config.clone();
        let _ = journal.set_result_retention(Arc::new(move || live.current().results));
        let http = HttpChannel::new(journal.clone(), vault.clone(), config.clone());
        let ssh = SshChannel::new(journal.clone(), vault.clone(), config.clone());
        let peer = PeerChannel::new(journal.clone(), vault.clone(), config.clone());
        let witnessing = Arc::new(Witnessing::new(journal.clone(), config.clone()));
        Ok(Opened {
            operator: OperatorApi::new(Broker {
                http,
                ssh,
                peer,
                journal,
                config,
                approver,
                vault,
                witnessing,
                pause,
            }),
            warnings,
        })
    }
}
