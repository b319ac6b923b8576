//! What the asking broker records about its calls through a peer: one
//! [`PeerAnswer`] per answer (or transport failure), the budgets they spent, the
//! [`PeerIncident`] raised when a call stops, and the [`PeerEvidence`] the envelope
//! shows. These are journal payloads: their JSON is what the audit chain hashes, so
//! optional fields are skipped when absent and old records keep their bytes.

pub use crate::record::peer::*;
