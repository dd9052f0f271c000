//! Every message, by the protocol it belongs to, and the one table that gives each its wire
//! tag, its name and the authentication it must carry.
//!
//! A message's body on the wire is its tag (a postcard varint) followed by its fields in
//! order. Tags are explicit and stable: a new message takes the next free number, and a number
//! once used is never given to another message (a decoder of another wire version rejects the
//! frame before it reads a tag). See "Adding a message" in docs/architecture.md.

use super::*;
use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
use serde::{Deserializer, Serializer};

/// Every protocol message, grouped by the protocol that handles it: a node passes a whole
/// group to the component that speaks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Between clients and the service.
    Client(ClientMessage),
    /// PBFT's agreement: the normal case, checkpoints, the view change, retransmission.
    Pbft(PbftMessage),
    /// Proactive recovery (BFT-PR): session keys and a recovering replica's estimate.
    Recovery(RecoveryMessage),
    /// State transfer (BFT-PR §4.6.2).
    Transfer(TransferMessage),
    /// The separated deployment: agreement and execution nodes (see `separated.rs`).
    Separated(SeparatedMessage),
    /// The privacy firewall (see `firewall.rs`).
    Firewall(FirewallMessage),
    /// Prime's pre-ordering, summaries and Suspect-Leader (ADR 0007).
    Prime(PrimeMessage),
}

/// Between clients and the service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientMessage {
    Request(SignedRequest),
    Reply(Reply),
    /// Firewall deployment: agreement nodes to clients, an entry of a reply certificate.
    CertifiedReply(CertifiedReply),
}

/// PBFT's agreement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PbftMessage {
    PrePrepare(PrePrepare),
    Prepare(Prepare),
    Commit(Commit),
    Checkpoint(Checkpoint),
    ViewChange(ViewChange),
    ViewChangeAck(ViewChangeAck),
    NewView(NewView),
    Status(Status),
    /// Retransmitted batch bodies, checked against digests the receiver already knows.
    Batches(Vec<Batch>),
    /// A VIEW-CHANGE forwarded by another replica; accepted only with matching acks.
    RelayViewChange(ViewChange),
}

/// Proactive recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryMessage {
    /// NEW-KEY (BFT-PR §4.1): fresh session keys, signed by the sender's key holder.
    NewKey(crate::keys::NewKey),
    /// QUERY-STABLE (BFT-PR §4.4): a recovering replica asks for checkpoint and prepared seqs.
    QueryStable(QueryStable),
    /// REPLY-STABLE: the answer, echoing the nonce.
    ReplyStable(ReplyStable),
}

/// State transfer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransferMessage {
    Fetch(Fetch),
    StateData(StateData),
}

/// The separated deployment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeparatedMessage {
    /// Agreement to execution.
    Order(Order),
    Retry(Retry),
    /// Execution to agreement.
    ExecAck(ExecAck),
    /// Among execution nodes.
    ExecCheckpoint(ExecCheckpoint),
    Missing(Missing),
    Certified(Certified),
    /// Execution node to agreement node: a frame for a client.
    Relay(Relay),
}

/// The privacy firewall.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FirewallMessage {
    /// Agreement nodes up through the filters.
    SignedOrder(SignedOrder),
    /// Execution nodes to the top row of filters.
    ReplyShare(ReplyShare),
    StableShare(StableShare),
    /// Filters down to the agreement nodes (reply certificates with each filter's vouch).
    VouchedCert(VouchedCert),
    StableCert(StableCert),
}

/// Prime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrimeMessage {
    /// Pre-ordering.
    PoRequest(Arc<PoRequest>),
    PoAck(PoAck),
    PoAru(SignedPoAru),
    /// Summaries to the leader.
    Summary(Summary),
    /// Suspect-Leader.
    Suspicion(Suspicion),
    /// Filling holes.
    PoFetch(PoFetch),
    PoCopy(PoCopy),
}

/// Wire tags, one per message. Never renumber; never reuse a retired number.
pub mod tag {
    pub const REQUEST: u32 = 0;
    pub const PRE_PREPARE: u32 = 1;
    pub const PREPARE: u32 = 2;
    pub const COMMIT: u32 = 3;
    pub const REPLY: u32 = 4;
    pub const CHECKPOINT: u32 = 5;
    pub const VIEW_CHANGE: u32 = 6;
    pub const VIEW_CHANGE_ACK: u32 = 7;
    pub const NEW_VIEW: u32 = 8;
    pub const STATUS: u32 = 9;
    pub const FETCH: u32 = 10;
    pub const STATE_DATA: u32 = 11;
    pub const BATCHES: u32 = 12;
    pub const RELAY_VIEW_CHANGE: u32 = 13;
    pub const NEW_KEY: u32 = 14;
    pub const QUERY_STABLE: u32 = 15;
    pub const REPLY_STABLE: u32 = 16;
    pub const ORDER: u32 = 17;
    pub const RETRY: u32 = 18;
    pub const EXEC_ACK: u32 = 19;
    pub const EXEC_CHECKPOINT: u32 = 20;
    pub const MISSING: u32 = 21;
    pub const CERTIFIED: u32 = 22;
    pub const RELAY: u32 = 23;
    pub const SIGNED_ORDER: u32 = 24;
    pub const REPLY_SHARE: u32 = 25;
    pub const STABLE_SHARE: u32 = 26;
    pub const VOUCHED_CERT: u32 = 27;
    pub const STABLE_CERT: u32 = 28;
    pub const CERTIFIED_REPLY: u32 = 29;
    pub const PO_REQUEST: u32 = 30;
    pub const PO_ACK: u32 = 31;
    pub const PO_ARU: u32 = 32;
    pub const SUMMARY: u32 = 33;
    pub const SUSPICION: u32 = 34;
    pub const PO_FETCH: u32 = 35;
    pub const PO_COPY: u32 = 36;
}

/// `Message::from(body)` for a body type that belongs to one message (`only_by_variant`: it
/// is not the only one with that body).
macro_rules! from_body {
    ([] $group:ident $gty:ident $variant:ident $body:ty) => {
        impl From<$body> for Message {
            fn from(m: $body) -> Message {
                Message::$group($gty::$variant(m))
            }
        }
    };
    ([only_by_variant] $group:ident $gty:ident $variant:ident $body:ty) => {};
}

/// The table: for each message, its tag, where it sits, its body type, its name (metrics
/// labels, traces) and the authentication tag its frame carries. Generates the wire encoding
/// and the per-message lookups, so a message is added in one row.
macro_rules! messages {
    ($($tag:path => $group:ident($gty:ident :: $variant:ident): $body:ty, $name:literal,
       $auth:ident $(, $only:ident)?;)*) => {
        $(from_body!([$($only)?] $group $gty $variant $body);)*

        impl Message {
            /// The message's wire tag (see [`tag`]).
            pub fn tag(&self) -> u32 {
                match self {
                    $(Message::$group($gty::$variant(_)) => $tag,)*
                }
            }

            /// Short name, used for metrics labels and traces.
            pub fn kind(&self) -> &'static str {
                match self {
                    $(Message::$group($gty::$variant(_)) => $name,)*
                }
            }

            /// The authentication a message of this kind must carry.
            pub fn required_tag(&self) -> TagKind {
                match self {
                    $(Message::$group($gty::$variant(_)) => TagKind::$auth,)*
                }
            }

            /// Every tag in the table, in its order.
            #[cfg(test)]
            pub(crate) fn all_tags() -> Vec<u32> {
                vec![$($tag),*]
            }
        }

        impl Serialize for Message {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut t = s.serialize_tuple(2)?;
                match self {
                    $(Message::$group($gty::$variant(m)) => {
                        t.serialize_element(&$tag)?;
                        t.serialize_element(m)?;
                    })*
                }
                t.end()
            }
        }

        struct MessageVisitor;

        impl<'de> Visitor<'de> for MessageVisitor {
            type Value = Message;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a message tag and its body")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Message, A::Error> {
                let tag: u32 = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                Ok(match tag {
                    $($tag => Message::$group($gty::$variant(
                        seq.next_element::<$body>()?
                            .ok_or_else(|| de::Error::invalid_length(1, &self))?,
                    )),)*
                    other => {
                        return Err(de::Error::invalid_value(
                            de::Unexpected::Unsigned(other as u64),
                            &self,
                        ))
                    }
                })
            }
        }

        impl<'de> Deserialize<'de> for Message {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Message, D::Error> {
                d.deserialize_tuple(2, MessageVisitor)
            }
        }
    };
}

// Requests authenticate themselves (a client authenticator inside); NEW-KEY is signed by the
// sender's key holder; firewall messages carry signatures; a PO-ARU row is signed (it travels
// inside others' messages). A reply and a certified reply count as their sender's word: MACed.
messages! {
    tag::REQUEST => Client(ClientMessage::Request): SignedRequest, "request", None;
    tag::PRE_PREPARE => Pbft(PbftMessage::PrePrepare): PrePrepare, "pre-prepare", Authenticator;
    tag::PREPARE => Pbft(PbftMessage::Prepare): Prepare, "prepare", Authenticator;
    tag::COMMIT => Pbft(PbftMessage::Commit): Commit, "commit", Authenticator;
    tag::REPLY => Client(ClientMessage::Reply): Reply, "reply", Mac;
    tag::CHECKPOINT => Pbft(PbftMessage::Checkpoint): Checkpoint, "checkpoint", Authenticator;
    tag::VIEW_CHANGE => Pbft(PbftMessage::ViewChange): ViewChange, "view-change", Authenticator;
    tag::VIEW_CHANGE_ACK => Pbft(PbftMessage::ViewChangeAck): ViewChangeAck, "view-change-ack", Mac;
    tag::NEW_VIEW => Pbft(PbftMessage::NewView): NewView, "new-view", Authenticator;
    tag::STATUS => Pbft(PbftMessage::Status): Status, "status", Authenticator;
    tag::FETCH => Transfer(TransferMessage::Fetch): Fetch, "fetch", Mac;
    tag::STATE_DATA => Transfer(TransferMessage::StateData): StateData, "state-data", Mac;
    tag::BATCHES => Pbft(PbftMessage::Batches): Vec<Batch>, "batches", Mac;
    tag::RELAY_VIEW_CHANGE => Pbft(PbftMessage::RelayViewChange): ViewChange,
        "relay-view-change", Mac,
        only_by_variant;
    tag::NEW_KEY => Recovery(RecoveryMessage::NewKey): crate::keys::NewKey, "new-key", None;
    tag::QUERY_STABLE => Recovery(RecoveryMessage::QueryStable): QueryStable,
        "query-stable", Authenticator;
    tag::REPLY_STABLE => Recovery(RecoveryMessage::ReplyStable): ReplyStable, "reply-stable", Mac;
    tag::ORDER => Separated(SeparatedMessage::Order): Order, "order", Authenticator;
    tag::RETRY => Separated(SeparatedMessage::Retry): Retry, "retry", Mac;
    tag::EXEC_ACK => Separated(SeparatedMessage::ExecAck): ExecAck, "exec-ack", Mac;
    tag::EXEC_CHECKPOINT => Separated(SeparatedMessage::ExecCheckpoint): ExecCheckpoint,
        "exec-checkpoint", Mac;
    tag::MISSING => Separated(SeparatedMessage::Missing): Missing, "missing", Mac;
    tag::CERTIFIED => Separated(SeparatedMessage::Certified): Certified, "certified", Mac;
    tag::RELAY => Separated(SeparatedMessage::Relay): Relay, "relay", Mac;
    tag::SIGNED_ORDER => Firewall(FirewallMessage::SignedOrder): SignedOrder, "signed-order", None;
    tag::REPLY_SHARE => Firewall(FirewallMessage::ReplyShare): ReplyShare, "reply-share", None;
    tag::STABLE_SHARE => Firewall(FirewallMessage::StableShare): StableShare, "stable-share", None;
    tag::VOUCHED_CERT => Firewall(FirewallMessage::VouchedCert): VouchedCert, "vouched-cert", None;
    tag::STABLE_CERT => Firewall(FirewallMessage::StableCert): StableCert, "stable-cert", None;
    tag::CERTIFIED_REPLY => Client(ClientMessage::CertifiedReply): CertifiedReply,
        "certified-reply", Mac;
    tag::PO_REQUEST => Prime(PrimeMessage::PoRequest): Arc<PoRequest>, "po-request", Authenticator;
    tag::PO_ACK => Prime(PrimeMessage::PoAck): PoAck, "po-ack", Authenticator;
    tag::PO_ARU => Prime(PrimeMessage::PoAru): SignedPoAru, "po-aru", None;
    tag::SUMMARY => Prime(PrimeMessage::Summary): Summary, "summary", Mac;
    tag::SUSPICION => Prime(PrimeMessage::Suspicion): Suspicion, "suspicion", Authenticator;
    tag::PO_FETCH => Prime(PrimeMessage::PoFetch): PoFetch, "po-fetch", Authenticator;
    tag::PO_COPY => Prime(PrimeMessage::PoCopy): PoCopy, "po-copy", Mac;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tag_is_used_once() {
        let tags = Message::all_tags();
        let distinct: std::collections::BTreeSet<u32> = tags.iter().copied().collect();
        assert_eq!(distinct.len(), tags.len(), "a tag is given twice");
    }

    #[test]
    fn a_body_starts_with_its_tag_and_decodes_back() {
        let commit = Message::from(Commit {
            view: 3,
            seq: 70,
            digest: Digest::of(b"batch"),
            replica: 2,
        });
        let bytes = postcard::to_allocvec(&commit).unwrap();
        assert_eq!(bytes[0] as u32, tag::COMMIT);
        assert_eq!(postcard::from_bytes::<Message>(&bytes).unwrap(), commit);
        let mut unknown = bytes.clone();
        unknown[0] = 99;
        assert!(postcard::from_bytes::<Message>(&unknown).is_err());
        assert!(postcard::from_bytes::<Message>(&bytes[..1]).is_err());
    }
}
