//! Prime (Amir, Coan, Kirsch, Lane; spec prime.md), the second ordering protocol: its pure
//! components, each tested on its own. ADR 0007 gives the design that composes them with the
//! replica; until then nothing outside this module uses them.

pub mod matrix;
pub mod preorder;
pub mod suspect;
