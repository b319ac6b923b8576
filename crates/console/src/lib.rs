//! The operator side of Postern, with no GUI dependency: the desktop window and the
//! headless daemon's operator socket both drive the broker through it.
//!
//! # Layout
//! - [`console`]: what every operator command does, against the broker types.
//! - [`dto`]: the types that cross to the operator (TypeScript bindings are generated
//!   from them by the desktop crate).

pub mod console;
pub mod dto;
