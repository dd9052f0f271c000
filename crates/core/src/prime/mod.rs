//! Prime (Amir, Coan, Kirsch, Lane; spec prime.md), the second ordering protocol: its pure
//! components, each tested on its own. The replica composes them (`replica/prime.rs`; the
//! design is ADR 0007).

pub mod leave;
pub mod matrix;
pub mod preorder;
pub mod side;
pub mod suspect;
