//! The operator side of Postern, with no GUI dependency: the desktop window and the
//! headless daemon's operator socket both drive the broker through it.
//!
//! # Layout
//! - [`console`]: what every operator command does, against the broker types.
//! - [`protocol`]: every operator command as one typed enum ([`protocol::OperatorCommand`]),
//!   with its arguments and answer type declared once.
//! - [`dispatch`]: runs an [`protocol::OperatorCommand`]: the one path the desktop's
//!   `operator` command, the operator socket and the CLI share.
//! - [`dto`]: the types that cross to the operator (TypeScript bindings are generated
//!   from them by the desktop crate).
//! - [`operator`]: the operator socket (server, peer authorization, client).
//! - [`headless`]: `postern daemon`: the broker with its agent and operator sockets.

pub mod console;
pub mod dispatch;
pub mod dto;
pub mod headless;
pub mod operator;
pub mod protocol;
