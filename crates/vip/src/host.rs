//! The host side of acquiring and releasing an address: `ip addr add|del ADDR/PREFIX dev IFACE`
//! (iproute2), each run bounded by a timeout.

use crate::Cidr;
use std::time::Duration;
use tokio::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot run `{command}`: {source} (is iproute2 installed? set ip_command)")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("`{command}` did not finish within {timeout_ms} ms")]
    Timeout { command: String, timeout_ms: u64 },
}

/// Runs iproute2 against one interface.
#[derive(Clone, Debug)]
pub struct IpTool {
    program: String,
    interface: String,
    timeout: Duration,
}

impl IpTool {
    pub fn new(program: &str, interface: &str, timeout_ms: u64) -> IpTool {
        IpTool {
            program: program.to_string(),
            interface: interface.to_string(),
            timeout: Duration::from_millis(timeout_ms),
        }
    }

    /// Configures the address; one already there is success.
    pub async fn add(&self, addr: &Cidr) -> Result<(), HostError> {
        let a = addr.to_string();
        match self.run(&["addr", "add", &a, "dev", &self.interface]).await {
            Err(HostError::Failed { stderr, .. }) if stderr.contains("File exists") => Ok(()),
            other => other.map(drop),
        }
    }

    /// Removes the address; one already gone is success.
    pub async fn del(&self, addr: &Cidr) -> Result<(), HostError> {
        let a = addr.to_string();
        match self.run(&["addr", "del", &a, "dev", &self.interface]).await {
            Err(HostError::Failed { stderr, .. })
                if stderr.contains("Cannot assign requested address") =>
            {
                Ok(())
            }
            other => other.map(drop),
        }
    }

    /// Which of `addrs` are configured on the interface now.
    pub async fn present(&self, addrs: &[Cidr]) -> Result<Vec<Cidr>, HostError> {
        let out = self
            .run(&["-o", "-4", "addr", "show", "dev", &self.interface])
            .await?;
        let on_interface = parse_inet(&out);
        Ok(addrs
            .iter()
            .filter(|a| on_interface.iter().any(|o| o.addr == a.addr))
            .copied()
            .collect())
    }

    async fn run(&self, args: &[&str]) -> Result<String, HostError> {
        let command = format!("{} {}", self.program, args.join(" "));
        let child = Command::new(&self.program)
            .args(args)
            .kill_on_drop(true)
            .stdin(std::process::Stdio::null())
            .output();
        let out = tokio::time::timeout(self.timeout, child)
            .await
            .map_err(|_| HostError::Timeout {
                command: command.clone(),
                timeout_ms: self.timeout.as_millis() as u64,
            })?
            .map_err(|source| HostError::Spawn {
                command: command.clone(),
                source,
            })?;
        if !out.status.success() {
            return Err(HostError::Failed {
                command,
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// The IPv4 addresses in `ip -o -4 addr show` output (`... inet 10.0.0.5/24 brd ...`).
pub fn parse_inet(out: &str) -> Vec<Cidr> {
    out.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()?.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ip_output() {
        let out = "2: eth0    inet 10.213.0.1/24 brd 10.213.0.255 scope global eth0\\       valid_lft forever preferred_lft forever\n\
                   2: eth0    inet 10.213.0.100/24 scope global secondary eth0\\       valid_lft forever preferred_lft forever\n\
                   garbage line\n";
        let got: Vec<String> = parse_inet(out).iter().map(|c| c.to_string()).collect();
        assert_eq!(got, vec!["10.213.0.1/24", "10.213.0.100/24"]);
    }

    #[tokio::test]
    async fn failures_are_errors_not_panics() {
        let missing = IpTool::new("/nonexistent/ip", "eth0", 1000);
        let addr: Cidr = "10.0.0.1/24".parse().unwrap();
        let e = missing.add(&addr).await.unwrap_err();
        assert!(matches!(e, HostError::Spawn { .. }), "{e}");
        let failing = IpTool::new("false", "eth0", 1000);
        let e = failing.del(&addr).await.unwrap_err();
        assert!(matches!(e, HostError::Failed { .. }), "{e}");
        let hang = IpTool {
            program: "sh".into(),
            interface: "x".into(),
            timeout: Duration::from_millis(100),
        };
        let e = hang.run(&["-c", "sleep 5"]).await.unwrap_err();
        assert!(matches!(e, HostError::Timeout { .. }), "{e}");
    }
}
