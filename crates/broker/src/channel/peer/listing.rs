//! What each peer lists for this broker (`peer_capabilities`), kept for a minute: the
//! capabilities `list_targets` shows as `peer/<peer>/<capability>`, and the export
//! policy version a call binds. A listing is accepted only with a verified `outcome`
//! attestation over exactly the capabilities listed; a denied, unattested or failed
//! listing lists nothing for that peer (and is asked again sooner).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::config::peer::PeerConfig;
use crate::config::{ConfigHandle, TargetVersion};
use crate::federation::client::Session;
use crate::federation::wire::{
    ALL_CAPABILITIES, CapabilitiesAnswer, CapabilitiesArgs, Capability, TOOL_CAPABILITIES,
    capabilities_digest,
};
use crate::federation::{self, Answer, Request, Verdict};
use crate::journal::Journal;

/// How long a listing is used before it is asked again.
pub const LISTING_TTL_MS: i64 = 60_000;
/// How long a failed or denied listing stands before it is asked again.
pub const FAILURE_TTL_MS: i64 = 10_000;
/// The longest a listing may take (less if the peer's timeout is shorter): it runs on
/// `list_targets`, which an agent waits for.
pub const LISTING_TIMEOUT: Duration = Duration::from_secs(10);

/// A verified listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub capabilities: Vec<Capability>,
    /// The peer's export policy version, from the listing's attestation.
    pub policy_version: String,
    /// When it was fetched (unix ms).
    pub at_ms: i64,
}

/// Why a peer lists nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListingError {
    #[error("peer {0} is not configured to be called")]
    NotCalled(String),
    #[error("the peer refused to list its capabilities (a signed denial)")]
    Denied,
    #[error("the peer's listing could not be used: {0}")]
    Failed(String),
}

#[derive(Debug, Clone)]
enum State {
    Listed(Listed),
    Refused(ListingError),
}

#[derive(Debug, Clone)]
struct Entry {
    /// The `[[peer]]` version the listing was fetched under: a changed key or URL
    /// discards it.
    version: TargetVersion,
    at_ms: i64,
    state: State,
    /// The last verified listing, kept across failures for the policy version.
    last_listed: Option<Listed>,
}

/// Each peer's listing, shared by every session of this broker.
pub struct Listings {
    journal: Journal,
    config: ConfigHandle,
    cache: Mutex<HashMap<String, Entry>>,
}

impl Listings {
    pub fn new(journal: Journal, config: ConfigHandle) -> Self {
        Listings {
            journal,
            config,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The last verified listing of `peer` under its current configuration, however
    /// old (what this broker "last saw").
    pub fn cached(&self, peer: &str) -> Option<Listed> {
        let version = super::peer_version(&self.config.current(), peer)?;
        let cache = self.cache.lock().ok()?;
        let entry = cache.get(peer)?;
        (entry.version == version)
            .then(|| entry.last_listed.clone())
            .flatten()
    }

    /// Discards what is kept for `peer` (its policy moved).
    pub fn forget(&self, peer: &str) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.remove(peer);
        }
    }

    /// The listing of `peer`: the kept one while fresh, else asked again.
    pub async fn listing(&self, peer: &str) -> Result<Listed, ListingError> {
        let config = self.config.current();
        let Some(p) = config.peer(peer).filter(|p| p.url.is_some()) else {
            return Err(ListingError::NotCalled(peer.to_string()));
        };
        let Some(version) = super::peer_version(&config, peer) else {
            return Err(ListingError::NotCalled(peer.to_string()));
        };
        let now = self.journal.now_ms();
        let kept = self.cache.lock().ok().and_then(|c| c.get(peer).cloned());
        let mut last_listed = None;
        if let Some(entry) = kept.filter(|e| e.version == version) {
            let ttl = match entry.state {
                State::Listed(_) => LISTING_TTL_MS,
                State::Refused(_) => FAILURE_TTL_MS,
            };
            if now - entry.at_ms < ttl {
                return match entry.state {
                    State::Listed(l) => Ok(l),
                    State::Refused(e) => Err(e),
                };
            }
            last_listed = entry.last_listed;
        }
        let state = self.fetch(p).await;
        let last_listed = match &state {
            State::Listed(l) => Some(l.clone()),
            State::Refused(_) => last_listed,
        };
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(
                peer.to_string(),
                Entry {
                    version,
                    at_ms: self.journal.now_ms(),
                    state: state.clone(),
                    last_listed,
                },
            );
        }
        match state {
            State::Listed(l) => Ok(l),
            State::Refused(e) => Err(e),
        }
    }

    /// Every peer this broker calls, with its listing (asked concurrently).
    pub async fn all(&self) -> Vec<(String, Result<Listed, ListingError>)> {
        let names: Vec<String> = self
            .config
            .current()
            .peers
            .iter()
            .filter(|p| p.url.is_some())
            .map(|p| p.name.clone())
            .collect();
        let listings = names.iter().map(|n| self.listing(n));
        let results = futures_join_all(listings).await;
        names.into_iter().zip(results).collect()
    }

    async fn fetch(&self, peer: &PeerConfig) -> State {
        let refused = |reason: String| State::Refused(ListingError::Failed(reason));
        let Some(url) = &peer.url else {
            return State::Refused(ListingError::NotCalled(peer.name.clone()));
        };
        let timeout = peer.timeout.min(LISTING_TIMEOUT);
        let me = self.journal.peer_name();
        let session = match Session::open_as(url, timeout, &me).await {
            Ok(s) => s,
            Err(f) => return refused(f.to_string()),
        };
        let auth = self.journal.sign_peer_auth(
            TOOL_CAPABILITIES,
            "",
            self.journal.now_ms(),
            crate::channel::random_16(),
        );
        let call = federation::CallBinding::of(&auth, None, None);
        let args = serde_json::to_value(CapabilitiesArgs { auth }).unwrap_or_default();
        let sent_at_ms = self.journal.now_ms();
        let answered = session.call(TOOL_CAPABILITIES, args, timeout).await;
        session.close().await;
        let in_flight = Some(federation::InFlight {
            sent_at_ms,
            answered_at_ms: self.journal.now_ms(),
        });
        let value = match answered {
            Err(f) => return refused(f.to_string()),
            Ok(None) => return refused("the answer carried no attestation envelope".into()),
            Ok(Some(v)) => v,
        };
        let Ok(answer) = serde_json::from_value::<CapabilitiesAnswer>(value) else {
            return refused("the answer is not a capabilities listing".into());
        };
        let digest = capabilities_digest(&answer.capabilities);
        if answer.attestation.kind == federation::AttestationKind::Outcome
            && answer.attestation.outcome_digest.as_deref() != Some(digest.as_str())
        {
            return refused("the listing is not the one its attestation signed".into());
        }
        let policy_version = answer.attestation.policy_version.clone();
        // A listing is where this broker learns the peer's policy: the version it is
        // signed under is the one a denial of it is placed under (B's refusal to
        // authenticate, `NO_POLICY`, is still not a verdict).
        let asked = Request {
            peer: peer.key.name.clone(),
            capability: ALL_CAPABILITIES.to_string(),
            fingerprint: digest,
            policy_version: Some(policy_version.clone()),
            in_flight,
            call: Some(call),
        };
        match federation::classify(
            &Answer::Attested(Some(answer.attestation)),
            &peer.key.key,
            &asked,
        ) {
            Verdict::Outcome => State::Listed(Listed {
                capabilities: answer.capabilities,
                policy_version,
                at_ms: self.journal.now_ms(),
            }),
            Verdict::Denial => State::Refused(ListingError::Denied),
            Verdict::Unavailable => refused("the peer is unavailable (signed)".into()),
            Verdict::Unknown { reason } => refused(reason),
            other => refused(format!("unexpected verdict {other:?}")),
        }
    }
}

/// Awaits every future, concurrently, in order (no extra dependency for one join).
async fn futures_join_all<F: std::future::Future>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let mut set = Vec::new();
    for f in futures {
        set.push(Box::pin(f));
    }
    let mut out = Vec::with_capacity(set.len());
    // Polled together: each listing waits on the network, not on the others.
    let mut pending: Vec<Option<_>> = set.into_iter().map(Some).collect();
    let mut results: Vec<Option<F::Output>> = (0..pending.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all_done = true;
        for (i, slot) in pending.iter_mut().enumerate() {
            if let Some(fut) = slot {
                match fut.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        results[i] = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => all_done = false,
                }
            }
        }
        if all_done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.extend(results.into_iter().flatten());
    out
}
