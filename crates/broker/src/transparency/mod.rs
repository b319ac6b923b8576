//! Witness cosigning for the audit log, per the C2SP transparency-log specifications.
//!
//! A witness is an independent party that remembers the latest checkpoint (tree size
//! and root hash) it saw for a log and cosigns a new one only if a consistency proof
//! shows it extends the old one. A journal cut back behind what a witness cosigned, or
//! rewritten, can then be shown to be so by anyone holding the witness's cosignature.
//!
//! - [`note`]: the formats: checkpoint bodies (c2sp.org/tlog-checkpoint), Ed25519
//!   signed notes and verifier keys (c2sp.org/signed-note), `cosignature/v1`
//!   (c2sp.org/tlog-cosignature). Signing and verification, no I/O.
//! - [`witness`]: the witness itself (c2sp.org/tlog-witness `add-checkpoint`): the
//!   request format, the checks in the order the specification gives them, its key
//!   file and its state in [`store`].
//! - [`store`]: the witness's SQLite database: known logs, the latest cosigned
//!   checkpoint per origin, and the refusals kept as evidence.
//! - [`server`]: the HTTP front of the witness (hyper), `POST /add-checkpoint` and the
//!   read endpoint `GET /postern/latest?origin=…`.
//! - [`client`]: what a log calls: [`client::submit`] and [`client::fetch_latest`].

pub mod client;
pub mod note;
pub mod server;
pub mod store;
pub mod witness;
