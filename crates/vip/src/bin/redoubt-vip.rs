//! `redoubt-vip --config FILE [--id N]`: one member of a virtual-address fail-over group, the
//! same as `redoubt vip`, without the rest of redoubt. Stops (leaving the group) on SIGTERM or
//! SIGINT. `RUST_LOG` sets the log level (default `info`).

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: redoubt-vip --config FILE [--id N]";

fn main() -> ExitCode {
    let mut config: Option<PathBuf> = None;
    let mut id: Option<u32> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--config", Some(v)) => config = Some(v.into()),
            ("--id", Some(v)) => match v.parse() {
                Ok(n) => id = Some(n),
                Err(_) => {
                    eprintln!("error: --id {v:?} is not a member id\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            _ => {
                eprintln!("error: unexpected argument {arg:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(config) = config else {
        eprintln!("error: --config is required\n{USAGE}");
        return ExitCode::from(2);
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match redoubt_vip::run_vip(&config, id) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
