//! The client side of the key-value store: its typed operations over the library's
//! [`Client`].

use crate::{Client, ClientError, ClientSetup};
use redoubt_services::kv::{KvOp, KvResult};

/// Why a key-value operation failed.
#[derive(Debug, thiserror::Error)]
pub enum KvClientError {
    /// The cluster did not answer (see [`ClientError`]).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The store refused the operation (a key or value over its limits, for instance); the
    /// state is unchanged.
    #[error("the store refused the operation: {0}")]
    Refused(String),
    /// The certified reply is not a result of the expected kind (a store of another kind or
    /// version answered).
    #[error("unexpected reply to {op}: {reply}")]
    UnexpectedReply { op: &'static str, reply: String },
}

/// A client of the replicated key-value store ([`redoubt_services::kv::KvService`]).
#[derive(Clone, Debug)]
pub struct KvClient {
    client: Client,
    /// The deadline of every operation, if not the client setup's.
    deadline: Option<std::time::Duration>,
}

impl KvClient {
    /// Wraps a connected client.
    pub fn new(client: Client) -> Self {
        KvClient {
            client,
            deadline: None,
        }
    }

    /// This client with `deadline` for every operation instead of the setup's, e.g.
    /// `kv.with_deadline(Duration::from_secs(2)).get("k")`; clones share the connection.
    pub fn with_deadline(&self, deadline: std::time::Duration) -> KvClient {
        KvClient {
            client: self.client.clone(),
            deadline: Some(deadline),
        }
    }

    /// Connects a client (see [`Client::connect`]) and wraps it.
    pub async fn connect(setup: ClientSetup) -> Result<Self, ClientError> {
        Ok(KvClient::new(Client::connect(setup).await?))
    }

    /// The underlying client (for its view and stats).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The value under `key`, if any.
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<Option<Vec<u8>>, KvClientError> {
        let op = KvOp::Get { key: key.into() };
        match self.run(op, "get").await? {
            KvResult::Value(v) => Ok(v),
            other => Err(unexpected("get", other)),
        }
    }

    /// Sets `key` to `value`; returns the previous value.
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<Option<Vec<u8>>, KvClientError> {
        let op = KvOp::Put {
            key: key.into(),
            value: value.into(),
        };
        match self.run(op, "put").await? {
            KvResult::Written { previous } => Ok(previous),
            other => Err(unexpected("put", other)),
        }
    }

    /// Sets `key` to `value` without fetching the previous value (a blind write).
    pub async fn set(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<(), KvClientError> {
        let op = KvOp::Set {
            key: key.into(),
            value: value.into(),
        };
        match self.run(op, "set").await? {
            KvResult::Done => Ok(()),
            other => Err(unexpected("set", other)),
        }
    }

    /// Removes `key`; returns the previous value.
    pub async fn delete(&self, key: impl Into<Vec<u8>>) -> Result<Option<Vec<u8>>, KvClientError> {
        let op = KvOp::Delete { key: key.into() };
        match self.run(op, "delete").await? {
            KvResult::Written { previous } => Ok(previous),
            other => Err(unexpected("delete", other)),
        }
    }

    /// Sets `key` to `new` iff its value is `expected` (`None`: absent). Returns whether it
    /// did, and the value after the operation.
    pub async fn cas(
        &self,
        key: impl Into<Vec<u8>>,
        expected: Option<Vec<u8>>,
        new: impl Into<Vec<u8>>,
    ) -> Result<(bool, Option<Vec<u8>>), KvClientError> {
        let op = KvOp::Cas {
            key: key.into(),
            expected,
            new: new.into(),
        };
        match self.run(op, "cas").await? {
            KvResult::Cas { ok, current } => Ok((ok, current)),
            other => Err(unexpected("cas", other)),
        }
    }

    /// Up to `limit` pairs with keys in `[start, end)` (`end` `None`: unbounded), ascending.
    pub async fn scan(
        &self,
        start: impl Into<Vec<u8>>,
        end: Option<Vec<u8>>,
        limit: u32,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, KvClientError> {
        let op = KvOp::Scan {
            start: start.into(),
            end,
            limit,
        };
        match self.run(op, "scan").await? {
            KvResult::Pairs(p) => Ok(p),
            other => Err(unexpected("scan", other)),
        }
    }

    async fn run(&self, op: KvOp, name: &'static str) -> Result<KvResult, KvClientError> {
        let bytes = op.encode();
        let reply = self
            .client
            .invoke_as(bytes, op.is_read_only(), self.deadline)
            .await?;
        match KvResult::decode(&reply) {
            Ok(KvResult::Error(msg)) => Err(KvClientError::Refused(msg)),
            Ok(result) => Ok(result),
            Err(e) => Err(KvClientError::UnexpectedReply {
                op: name,
                reply: format!("undecodable result ({e})"),
            }),
        }
    }
}

fn unexpected(op: &'static str, result: KvResult) -> KvClientError {
    KvClientError::UnexpectedReply {
        op,
        reply: format!("{result:?}"),
    }
}
