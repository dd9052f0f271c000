//! A minimal HTTP/1.1 GET over a tokio `TcpStream`: enough to read a replica's `/status` and
//! `/metrics`, with a hard time limit and a size limit.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Largest response accepted (bytes).
const RESPONSE_BYTES_MAX: usize = 4 << 20;

/// `GET path` from `addr`; the body of a `200` response, or why there is none. The whole
/// exchange (connect, send, receive) must finish within `timeout`.
pub async fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<Vec<u8>, String> {
    match tokio::time::timeout(timeout, exchange(addr, path)).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

async fn exchange(addr: SocketAddr, path: &str) -> Result<Vec<u8>, String> {
    let mut sock = TcpStream::connect(addr).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
        _ => e.to_string(),
    })?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: redoubt\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    sock.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("cannot send the request: {e}"))?;
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(body) = complete_response(&buf)? {
            return Ok(body);
        }
        let n = sock
            .read(&mut chunk)
            .await
            .map_err(|e| format!("cannot read the response: {e}"))?;
        if n == 0 {
            // The server closed: whatever follows the head is the body (no length given).
            return match complete_response(&buf)? {
                Some(body) => Ok(body),
                None => match split_head(&buf) {
                    Some((head, body_at)) if head.length.is_none() && !head.chunked => {
                        Ok(buf[body_at..].to_vec())
                    }
                    _ => Err("the connection closed in the middle of the response".into()),
                },
            };
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > RESPONSE_BYTES_MAX {
            return Err(format!(
                "response larger than {RESPONSE_BYTES_MAX} bytes; is this a redoubt status endpoint?"
            ));
        }
    }
}

struct Head {
    length: Option<usize>,
    chunked: bool,
}

/// Parses the status line and headers if they have all arrived: the head and where the body
/// starts. A non-200 status is an error.
fn split_head(buf: &[u8]) -> Option<(Head, usize)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let text = String::from_utf8_lossy(&buf[..end]);
    let mut length = None;
    let mut chunked = false;
    for line in text.lines().skip(1) {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse().ok();
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        }
    }
    Some((Head { length, chunked }, end + 4))
}

/// The body, once the whole response has arrived.
fn complete_response(buf: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let Some((head, body_at)) = split_head(buf) else {
        return Ok(None);
    };
    let status_line = String::from_utf8_lossy(&buf[..buf.len().min(body_at)]);
    let status_line = status_line.lines().next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    let proto = parts.next().unwrap_or_default();
    let code = parts.next().unwrap_or_default();
    if !proto.starts_with("HTTP/1.") {
        return Err(format!(
            "not an HTTP response ({:?}); is this the metrics_addr of a replica?",
            status_line
        ));
    }
    let body = &buf[body_at..];
    let body = if head.chunked {
        dechunk(body)
    } else {
        match head.length {
            Some(len) if body.len() >= len => Some(body[..len].to_vec()),
            _ => None,
        }
    };
    if code != "200" {
        if body.is_none() && (head.length.is_some() || head.chunked) {
            return Ok(None); // its text is still coming
        }
        // The answer's own text says why (a monitor holding its replica down, say).
        let why = body
            .as_deref()
            .map(|b| String::from_utf8_lossy(b).trim().to_string())
            .filter(|t| !t.is_empty() && t.len() <= 512)
            .map_or(String::new(), |t| format!(": {t}"));
        let reason = status_line.trim().split_once(' ').map_or("", |(_, r)| r);
        return Err(format!("HTTP {reason}{why}"));
    }
    Ok(body)
}

/// Decodes a chunked body if it is complete.
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&body[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if body.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_and_chunked() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        assert_eq!(complete_response(r).unwrap(), Some(b"hello".to_vec()));
        let partial = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel";
        assert_eq!(complete_response(partial).unwrap(), None);
        let c = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n";
        assert_eq!(complete_response(c).unwrap(), Some(b"hello".to_vec()));
        let e = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(complete_response(e).unwrap_err(), "HTTP 404 Not Found");
        let held = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 13\r\n\r\nheld down: x\n";
        assert_eq!(complete_response(&held[..held.len() - 4]).unwrap(), None);
        assert_eq!(
            complete_response(held).unwrap_err(),
            "HTTP 503 Service Unavailable: held down: x"
        );
    }
}
