//! Figure 3's messages sent again until they are answered (ADR 0010, a hole closed): an
//! INQUIRY or INQUIRY-RESPONSE lost on the wide area would leave the asking site suspended on
//! the other for good.
//!
//! As R, each server resends its copy of the INQUIRY to its peer every [`RESEND_MS`] while the
//! inquiry is pending. As S, each server keeps its copy of the last INQUIRY-RESPONSE to each R
//! and sends it again when R's INQUIRY arrives again after it was executed (at most once per
//! [`RESEND_MS`] per site, so a replayed INQUIRY costs little). Both are the site's signed
//! messages as first sent: nothing new is signed, and receivers drop copies they executed.

use super::Wan;
use crate::SiteId;
use std::collections::BTreeMap;

/// How often a pending INQUIRY, or an answer asked for again, goes out again.
pub const RESEND_MS: u64 = 1000;

#[derive(Clone, Debug, Default)]
pub(crate) struct Resend {
    now_ms: u64,
    /// As R: our INQUIRY to each S (its number, the frame, when it last went).
    inquiries: BTreeMap<SiteId, (u64, Wan, u64)>,
    /// As S: our last INQUIRY-RESPONSE to each R (the INQUIRY's number, the frame, when it
    /// last went).
    responses: BTreeMap<SiteId, (u64, Wan, u64)>,
    due: Vec<Wan>,
    pub(crate) resent: u64,
}

impl Resend {
    pub(crate) fn inquiry_sent(&mut self, to: SiteId, seq: u64, wan: Wan) {
        self.inquiries.insert(to, (seq, wan, self.now_ms));
    }

    pub(crate) fn response_sent(&mut self, to: SiteId, seq: u64, wan: Wan) {
        self.responses.insert(to, (seq, wan, self.now_ms));
    }

    /// R's INQUIRY number `seq` arrived again after we executed it: our answer was lost.
    pub(crate) fn asked_again(&mut self, from: SiteId, seq: u64) {
        let now = self.now_ms;
        if let Some((answered, wan, sent)) = self.responses.get_mut(&from) {
            if *answered == seq && now >= sent.saturating_add(RESEND_MS) {
                *sent = now;
                self.due.push(wan.clone());
            }
        }
    }

    /// The clock moved; `pending(S)` is the number of our INQUIRY S has not answered yet.
    pub(crate) fn timer(
        &mut self,
        now_ms: u64,
        pending: impl Fn(SiteId) -> Option<u64>,
    ) -> Vec<Wan> {
        self.now_ms = self.now_ms.max(now_ms);
        let now = self.now_ms;
        let mut out = std::mem::take(&mut self.due);
        self.inquiries
            .retain(|s, (seq, _, _)| pending(*s) == Some(*seq));
        for (_, wan, sent) in self.inquiries.values_mut() {
            if now >= sent.saturating_add(RESEND_MS) {
                *sent = now;
                out.push(wan.clone());
            }
        }
        self.resent += out.len() as u64;
        out
    }
}
