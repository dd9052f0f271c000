//! What one step of a node produced, decoded for assertions.

use redoubt_core::keys::NewKey;
use redoubt_core::message::*;
use redoubt_core::*;

/// Decodes a frame a node sent (its body, unauthenticated).
pub fn decode(bytes: &[u8]) -> Message {
    let f = decode_frame(bytes, usize::MAX).expect("a well-formed frame");
    decode_body(&f.body).expect("a well-formed body")
}

/// Accessors for the first message of a kind an [`Out`] holds.
macro_rules! first_sent {
    ($($(#[$doc:meta])* $name:ident: $kind:ident),* $(,)?) => {
        impl Out {
            $($(#[$doc])*
            pub fn $name(&self) -> Option<$kind> {
                self.find(|m| match m {
                    Message::Pbft(PbftMessage::$kind(x)) => Some(x),
                    _ => None,
                })
            })*
        }
    };
}

first_sent!(
    /// The first PRE-PREPARE sent.
    pre_prepare: PrePrepare,
    /// The first PREPARE sent.
    prepare: Prepare,
    /// The first VIEW-CHANGE sent (a replica's own, when it just joined a view).
    view_change: ViewChange,
);

/// The effects of one step (a delivery, a tick, an input). The cluster has already routed
/// them (frames queued, records journaled, events logged); this is for looking at them.
#[derive(Debug, Default)]
pub struct Out {
    pub effects: Vec<Effect>,
}

impl Out {
    /// Appends the effects of a later step.
    pub fn extend(&mut self, later: Out) {
        self.effects.extend(later.effects);
    }

    /// Every message sent: (receiver, message); `None` for a broadcast to every replica.
    pub fn messages(&self) -> Vec<(Option<Principal>, Message)> {
        self.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Send { to, bytes } => Some((Some(*to), decode(bytes))),
                Effect::Broadcast { bytes } => Some((None, decode(bytes))),
                _ => None,
            })
            .collect()
    }

    /// The first message `pick` maps to something.
    pub fn find<T>(&self, pick: impl FnMut(Message) -> Option<T>) -> Option<T> {
        self.messages().into_iter().map(|(_, m)| m).find_map(pick)
    }

    /// Whether any message sent satisfies `pred`.
    pub fn any(&self, pred: impl Fn(&Message) -> bool) -> bool {
        self.messages().iter().any(|(_, m)| pred(m))
    }

    pub fn events(&self) -> Vec<Event> {
        self.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Event(ev) => Some(ev.clone()),
                _ => None,
            })
            .collect()
    }

    /// Whether a message was rejected.
    pub fn rejected(&self) -> bool {
        self.events()
            .iter()
            .any(|e| matches!(e, Event::Rejected { .. }))
    }

    /// Whether a COMMIT went out.
    pub fn commits(&self) -> bool {
        self.any(|m| matches!(m, Message::Pbft(PbftMessage::Commit(_))))
    }

    /// Whether a NEW-VIEW went out.
    pub fn new_view(&self) -> bool {
        self.any(|m| matches!(m, Message::Pbft(PbftMessage::NewView(_))))
    }

    /// The NEW-KEYs sent to single receivers: (receiver, message).
    pub fn new_keys(&self) -> Vec<(Principal, NewKey)> {
        self.messages()
            .into_iter()
            .filter_map(|(to, m)| match (to, m) {
                (Some(to), Message::Recovery(RecoveryMessage::NewKey(nk))) => Some((to, nk)),
                _ => None,
            })
            .collect()
    }

    /// The frames sent to `to` alone.
    pub fn frames_to(&self, to: Principal) -> Vec<Vec<u8>> {
        self.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Send { to: t, bytes } if *t == to => Some(bytes.to_vec()),
                _ => None,
            })
            .collect()
    }
}
