//! Disk tampering by the adversary (scenario field `tamper_disk`), and the check that a
//! recovered replica takes part again.
//!
//! Before the watchdog takes a compromised replica back (its last act while it holds it), the
//! adversary rewrites the replica's durable journal or page store; the watchdog then reboots
//! the replica from that disk with trusted code and the replica recovers. One tampering per
//! compromise, drawn among: a view record for a view near 2^60; a watermark far above the
//! window; a view record whose PSet/QSet hold entries above the window; a bogus pre-prepare
//! and prepared record for the next sequence number; a bogus execution record (a batch no
//! client sent) for the next sequence number; the page store's base moved to a checkpoint far
//! ahead (auxiliary bytes rewritten to match); garbage auxiliary bytes; a page's tree entry
//! with a wrong digest. (Bytes of stored pages flip at every compromise anyway.)
//!
//! Whatever the disk says, a recovered replica must be a working member again: some time
//! after it reported its recovery, it is within a few views of the correct replicas and has
//! executed at least what they had executed when it recovered.

use super::*;
use redoubt_core::journal::Record;
use redoubt_core::message::{Batch, NonDet, PEntry, QEntry};
use redoubt_core::state::{CommitPage, Entry, PageStore};
use redoubt_core::View;

/// How long after its recovery a replica is checked (ms, after the heal at the earliest).
pub(super) const RECOVERED_SETTLE_MS: u64 = 5_000;
/// How many views a recovered replica may be ahead of the correct replicas.
const VIEW_SLACK: u64 = 4;

/// `aux` (a checkpoint's auxiliary bytes, whose first field is the checkpoint's sequence
/// number as a postcard varint) with that field set to `seq`.
fn with_aux_seq(aux: &[u8], seq: u64) -> Vec<u8> {
    let len = aux
        .iter()
        .position(|b| b & 0x80 == 0)
        .map_or(aux.len(), |i| i + 1);
    let mut out = Vec::with_capacity(aux.len() + 10);
    let mut v = seq;
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            break;
        }
        out.push(b | 0x80);
    }
    out.extend_from_slice(&aux[len.min(aux.len())..]);
    out
}

impl World {
    /// The adversary rewrites `r`'s journal or page store (called by the watchdog just before
    /// it reboots `r` from them).
    pub(super) fn tamper_disk(&mut self, r: ReplicaId) {
        if !self.sc.tamper_disk {
            return;
        }
        let cfg = self.sc.core.clone();
        let (k, l) = (cfg.checkpoint_interval, cfg.log_size);
        let rep = &self.replicas[r as usize];
        let (stable, executed, view) = (rep.stable_checkpoint(), rep.last_executed(), rep.view());
        let disk = &mut self.disks[r as usize];
        let last_view = disk.iter().rev().find_map(|x| match x {
            Record::View {
                view,
                normal,
                vc,
                pset,
                qset,
                batches,
                ..
            } => Some((
                *view,
                *normal,
                vc.clone(),
                pset.clone(),
                qset.clone(),
                batches.clone(),
            )),
            _ => None,
        });
        let kind = self.rng.random_range(0..8);
        let what = match kind {
            0 => {
                let v = (1u64 << 60) + self.rng.random_range(0..1000);
                let normal = self.rng.random_bool(0.5);
                self.disks[r as usize].push(Record::View {
                    view: v,
                    normal,
                    vc: None,
                    pset: vec![],
                    qset: vec![],
                    batches: vec![],
                    doubted: vec![],
                });
                format!("journal: view record for view {v}")
            }
            1 => {
                let seq = (stable / k + self.rng.random_range(100..10_000)) * k;
                let digest = random_digest(&mut self.rng);
                self.disks[r as usize].push(Record::Watermark { seq, digest });
                format!("journal: watermark n{seq}")
            }
            2 => {
                let (v, normal, vc, mut pset, mut qset, batches) =
                    last_view.unwrap_or((view, true, None, vec![], vec![], vec![]));
                let seq = stable + l + k * self.rng.random_range(1..4);
                let d = random_digest(&mut self.rng);
                let pv = v.saturating_sub(1);
                pset.push(PEntry {
                    seq,
                    digest: d,
                    view: pv,
                });
                qset.push(QEntry {
                    seq,
                    pairs: vec![(d, pv)],
                });
                self.disks[r as usize].push(Record::View {
                    view: v,
                    normal,
                    vc,
                    pset,
                    qset,
                    batches,
                    doubted: vec![],
                });
                format!("journal: PSet/QSet entry at n{seq}, above the window")
            }
            3 => {
                let v = last_view.map_or(view, |x| x.0);
                let seq = executed + 1;
                let digest = random_digest(&mut self.rng);
                let disk = &mut self.disks[r as usize];
                disk.push(Record::PrePrepared {
                    view: v,
                    seq,
                    digest,
                    batch: None,
                    vouched: true,
                });
                disk.push(Record::Prepared {
                    view: v,
                    seq,
                    digest,
                });
                format!("journal: bogus prepared record n{seq} v{v}")
            }
            4 => {
                let seq = executed + 1;
                let op = KvOp::Put {
                    key: b"k0".to_vec(),
                    value: b"tampered".to_vec(),
                };
                let batch = Batch {
                    nondet: NonDet {
                        time_ms: self.now,
                        seed: self.rng.random(),
                    },
                    requests: vec![SignedRequest {
                        request: Request {
                            client: crate::adversary::FORGED_CLIENT,
                            timestamp: u64::MAX / 4 + seq,
                            read_only: false,
                            op: op.encode().into(),
                        },
                        auth: Vec::new().into(),
                        sig: None,
                    }],
                    matrix: None,
                };
                let digest = batch.digest();
                self.disks[r as usize].push(Record::Executed {
                    seq,
                    digest,
                    batch: Some(Arc::new(batch)),
                });
                format!("journal: bogus execution record n{seq}")
            }
            _ => {
                let mut store = self.stores[r as usize].clone();
                let Ok(Some(base)) = store.base() else {
                    return;
                };
                match kind {
                    5 => {
                        let seq = (base.seq / k + self.rng.random_range(100..10_000)) * k;
                        let aux = with_aux_seq(&base.aux, seq);
                        if store.commit(seq, &aux, &[]).is_err() {
                            return;
                        }
                        self.stats.store_base_tampered += 1;
                        format!("page store: base moved from n{} to n{seq}", base.seq)
                    }
                    6 => {
                        let len = self.rng.random_range(0..40);
                        let aux: Vec<u8> = (0..len).map(|_| self.rng.random()).collect();
                        if store.commit(base.seq, &aux, &[]).is_err() {
                            return;
                        }
                        self.stats.store_base_tampered += 1;
                        format!("page store: garbage auxiliary bytes at n{}", base.seq)
                    }
                    _ => {
                        let geo = store.geometry();
                        let index = self.rng.random_range(0..geo.pages());
                        let mut bytes = vec![0; geo.page_size()];
                        if store.read_page(index, &mut bytes).is_err() {
                            return;
                        }
                        let entry = Entry {
                            lm: base.entries[index as usize].lm,
                            digest: random_digest(&mut self.rng),
                        };
                        let page = CommitPage {
                            index,
                            entry,
                            bytes: &bytes,
                        };
                        if store.commit(base.seq, &base.aux, &[page]).is_err() {
                            return;
                        }
                        self.unscrubbed.insert(r);
                        format!("page store: wrong tree entry for page {index}")
                    }
                }
            }
        };
        self.stats.disk_tampered += 1;
        self.log(|| format!("r{r} DISK TAMPERED ({what})"));
    }

    /// Called when replica `r` completed the recovery the watchdog started: checked again
    /// once it had time to settle.
    pub(super) fn schedule_recovered_check(&mut self, r: ReplicaId) {
        let others: Vec<ReplicaId> = (0..self.sc.core.n()).filter(|o| *o != r).collect();
        let target = others
            .iter()
            .filter(|o| self.up[**o as usize] == Up::Running && !self.checker.is_faulty(**o))
            .map(|o| self.replicas[*o as usize].last_executed())
            .max()
            .unwrap_or(0);
        let at = self.now.max(self.sc.heal_ms) + RECOVERED_SETTLE_MS;
        self.schedule(
            at,
            Ev::RecoveredCheck {
                r,
                recovered_at: self.now,
                target,
            },
        );
    }

    /// A replica that recovered at `recovered_at`, when the correct replicas had executed up
    /// to `target`, must be in about their view and have executed that far.
    pub(super) fn recovered_check(&mut self, r: ReplicaId, recovered_at: u64, target: u64) {
        if self.up[r as usize] != Up::Running || self.checker.is_faulty(r) {
            return;
        }
        let views: Vec<View> = (0..self.sc.core.n())
            .filter(|o| {
                *o != r && self.up[*o as usize] == Up::Running && !self.checker.is_faulty(*o)
            })
            .map(|o| self.replicas[o as usize].view())
            .collect();
        let (Some(lo), Some(hi)) = (views.iter().min(), views.iter().max()) else {
            return;
        };
        let rep = &self.replicas[r as usize];
        let (v, e) = (rep.view(), rep.last_executed());
        if v > hi.saturating_add(VIEW_SLACK) || v.saturating_add(VIEW_SLACK) < *lo {
            self.violation(format!(
                "r{r} recovered at {recovered_at}ms but is in view {v} {RECOVERED_SETTLE_MS}ms \
                 later, the correct replicas in views {lo}..={hi}"
            ));
        } else if e < target {
            self.violation(format!(
                "r{r} recovered at {recovered_at}ms but has executed only up to n{e} \
                 {RECOVERED_SETTLE_MS}ms later; the correct replicas had executed n{target} \
                 when it recovered"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_aux_sequence_number_is_rewritten_in_place() {
        // A postcard varint sequence number, then the rest of the auxiliary bytes.
        let rest = [77u8, 1, 1, 2, 1, 3];
        let enc = |seq: u64| {
            let mut v = postcard::to_stdvec(&seq).expect("encodes");
            v.extend_from_slice(&rest);
            v
        };
        assert_eq!(with_aux_seq(&enc(8), 1 << 40), enc(1 << 40));
        assert_eq!(with_aux_seq(&enc(300), 16), enc(16));
        assert_eq!(with_aux_seq(&enc(u64::MAX), 0), enc(0));
    }
}
