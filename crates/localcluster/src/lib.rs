//! A cluster of redoubt processes on this machine, for the demo, the benchmarks and tests:
//! replica processes started from the running executable and stopped with it ([`procs`]),
//! CPU caps on them ([`cpucap`]), and asking them how they are over HTTP ([`probe`]).

pub mod cpucap;
pub mod http;
pub mod probe;
pub mod procs;

use anyhow::Context as _;

/// A multi-thread tokio runtime with `workers` threads, for the commands that talk to the
/// network.
pub fn runtime(workers: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// BLAKE3 of a file (hex).
pub use redoubt_node::status::file_blake3;

/// BLAKE3 of this executable (hex): what `[recovery] executable_blake3` pins.
pub fn executable_blake3() -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("cannot locate this executable")?;
    file_blake3(&exe).with_context(|| format!("cannot read {}", exe.display()))
}
