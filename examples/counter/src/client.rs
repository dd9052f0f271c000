//! The client side: typed operations over the library's [`Client`].

use crate::{Counter, CounterOp, CounterResult};
use redoubt_client::{Client, ClientError, ClientSetup};

/// Why a counter operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CounterError {
    /// The cluster did not answer in time (the operation may or may not have taken effect).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The service refused the operation; the counter is unchanged.
    #[error("the counter refused the operation: {0}")]
    Refused(String),
    /// f+1 replicas vouched for a reply that is not a counter result (another service?).
    #[error("unexpected reply: {0}")]
    UnexpectedReply(String),
}

/// A client of the replicated counter. Cheap to clone; clones take turns (one outstanding
/// request per client id).
#[derive(Clone, Debug)]
pub struct CounterClient {
    client: Client,
}

impl CounterClient {
    /// Wraps a connected client.
    pub fn new(client: Client) -> Self {
        CounterClient { client }
    }

    /// Connects a client (see [`Client::connect`]); `setup` usually comes from
    /// [`ClientSetup::from_config`].
    pub async fn connect(setup: ClientSetup) -> Result<Self, ClientError> {
        Ok(CounterClient::new(Client::connect(setup).await?))
    }

    /// The underlying client (its view and statistics).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Adds one; returns the counter after it.
    pub async fn increment(&self) -> Result<Counter, CounterError> {
        self.run(CounterOp::Increment).await
    }

    /// Adds `n`; returns the counter after it.
    pub async fn add(&self, n: u64) -> Result<Counter, CounterError> {
        self.run(CounterOp::Add(n)).await
    }

    /// Reads the counter (one round trip when 2f+1 replicas agree, ordered otherwise).
    pub async fn get(&self) -> Result<Counter, CounterError> {
        self.run(CounterOp::Get).await
    }

    async fn run(&self, op: CounterOp) -> Result<Counter, CounterError> {
        let reply = if op.is_read_only() {
            self.client.invoke_read_only(op.encode()).await?
        } else {
            self.client.invoke(op.encode()).await?
        };
        match CounterResult::decode(&reply) {
            Ok(CounterResult::Value(c)) => Ok(c),
            Ok(CounterResult::Refused(why)) => Err(CounterError::Refused(why)),
            Err(e) => Err(CounterError::UnexpectedReply(e)),
        }
    }
}
