//! Frames and keys for the world: recognising and describing frames, and the in-process key
//! holders of simulated principals.

use super::*;
use redoubt_core::message::{
    ClientMessage, FirewallMessage, PbftMessage, PrimeMessage, RecoveryMessage, SeparatedMessage,
    TransferMessage,
};
use redoubt_crypto::body::ExecutorSecret;

/// The message a frame carries, if it decodes.
pub(super) fn message_of(bytes: &[u8]) -> Option<Message> {
    decode_frame(bytes, usize::MAX)
        .ok()
        .and_then(|f| decode_body(&f.body).ok())
}

/// Whether a frame carries a NEW-KEY (looked up without decoding the body: its first byte is
/// the message's tag).
pub(super) fn is_new_key(bytes: &[u8]) -> bool {
    redoubt_core::message::decode_frame_ref(bytes, usize::MAX)
        .is_ok_and(|f| f.body.first() == Some(&(redoubt_core::message::tag::NEW_KEY as u8)))
}

/// A one-line description of a frame for traces.
pub fn describe(bytes: &[u8]) -> String {
    let Ok(f) = decode_frame(bytes, usize::MAX) else {
        return format!("<garbage {}B>", bytes.len());
    };
    let Ok(m) = decode_body(&f.body) else {
        return format!("<bad body {}B>", f.body.len());
    };
    match m {
        Message::Client(ClientMessage::Request(r)) => format!("REQUEST {:?}", r.request),
        Message::Pbft(PbftMessage::PrePrepare(p)) => format!(
            "PRE-PREPARE v{} n{} {:?} [{} reqs, {} beside]",
            p.view,
            p.seq,
            p.digest,
            p.batch.requests.len(),
            p.beside.len()
        ),
        Message::Pbft(PbftMessage::Prepare(p)) if p.doubts.is_empty() => {
            format!("PREPARE v{} n{} {:?}", p.view, p.seq, p.digest)
        }
        Message::Pbft(PbftMessage::Prepare(p)) => format!(
            "PREPARE v{} n{} {:?} doubts{:?}",
            p.view, p.seq, p.digest, p.doubts
        ),
        Message::Pbft(PbftMessage::Commit(c)) => {
            format!("COMMIT v{} n{} {:?}", c.view, c.seq, c.digest)
        }
        Message::Client(ClientMessage::Reply(r)) => {
            format!("REPLY v{} c{} t{}", r.view, r.client, r.timestamp)
        }
        Message::Pbft(PbftMessage::Checkpoint(c)) => {
            format!("CHECKPOINT n{} {:?}", c.seq, c.digest)
        }
        Message::Pbft(PbftMessage::ViewChange(v)) => format!(
            "VIEW-CHANGE v{} ls{} C{:?} P{:?} Q{:?}",
            v.view, v.ls, v.checkpoints, v.p, v.q
        ),
        Message::Pbft(PbftMessage::ViewChangeAck(a)) => format!(
            "VC-ACK v{} {}->{} {:?}",
            a.view, a.acker, a.sender, a.digest
        ),
        Message::Pbft(PbftMessage::NewView(nv)) => format!(
            "NEW-VIEW v{} V{:?} ckpt{:?} X{:?}",
            nv.view, nv.vcs, nv.checkpoint, nv.chosen
        ),
        Message::Pbft(PbftMessage::Status(s)) => format!(
            "STATUS v{}{} exec{} stable{} P{:?} C{:?} missB{} missVC{}",
            s.view,
            if s.normal { "" } else { "(vc)" },
            s.last_executed,
            s.stable,
            s.prepared,
            s.committed,
            s.missing_batches.len(),
            s.missing_vcs.len()
        ),
        Message::Transfer(TransferMessage::Fetch(f)) => {
            format!("FETCH n{} {} items", f.seq, f.items.len())
        }
        Message::Transfer(TransferMessage::StateData(d)) => format!("{d:?}"),
        Message::Pbft(PbftMessage::Batches(b)) => format!("BATCHES {}", b.len()),
        Message::Pbft(PbftMessage::RelayViewChange(v)) => {
            format!("RELAY-VC v{} r{}", v.view, v.replica)
        }
        Message::Recovery(RecoveryMessage::NewKey(k)) => format!("{k:?}"),
        Message::Recovery(RecoveryMessage::QueryStable(q)) => {
            format!("QUERY-STABLE r{} nonce{}", q.replica, q.nonce)
        }
        Message::Recovery(RecoveryMessage::ReplyStable(r)) => {
            format!("REPLY-STABLE r{} c{} p{}", r.replica, r.c, r.p)
        }
        Message::Separated(SeparatedMessage::Order(o)) => format!(
            "ORDER r{} v{} n{} {:?}{}",
            o.replica,
            o.view,
            o.seq,
            o.digest,
            if o.batch.is_some() { "" } else { " (no body)" }
        ),
        Message::Separated(SeparatedMessage::Retry(r)) => {
            format!("RETRY c{} t{}", r.client, r.timestamp)
        }
        Message::Separated(SeparatedMessage::ExecAck(a)) => {
            format!("EXEC-ACK e{} n{}", a.executor, a.seq)
        }
        Message::Separated(SeparatedMessage::ExecCheckpoint(c)) => {
            format!("EXEC-CHECKPOINT e{} n{} {:?}", c.executor, c.seq, c.digest)
        }
        Message::Separated(SeparatedMessage::Missing(m)) => {
            format!("MISSING e{} n{}", m.executor, m.seq)
        }
        Message::Separated(SeparatedMessage::Relay(r)) => {
            format!("RELAY c{} {}B", r.client, r.frame.len())
        }
        Message::Firewall(FirewallMessage::SignedOrder(o)) => format!(
            "SIGNED-ORDER r{} v{} n{} {:?}",
            o.order.replica, o.order.view, o.order.seq, o.order.digest
        ),
        Message::Firewall(FirewallMessage::ReplyShare(s)) => format!(
            "REPLY-SHARE e{} n{} {} entries",
            s.executor,
            s.bundle.seq,
            s.bundle.entries.len()
        ),
        Message::Firewall(FirewallMessage::StableShare(s)) => {
            format!("STABLE-SHARE e{} n{}", s.executor, s.seq)
        }
        Message::Firewall(FirewallMessage::VouchedCert(v)) => format!(
            "VOUCHED-CERT n{} {:?}",
            v.cert.bundle.seq,
            v.cert
                .bundle
                .entries
                .iter()
                .map(|e| format!("c{} t{}", e.client, e.timestamp))
                .collect::<Vec<_>>()
        ),
        Message::Firewall(FirewallMessage::StableCert(c)) => format!("STABLE-CERT n{}", c.seq),
        Message::Client(ClientMessage::CertifiedReply(r)) => format!(
            "CERTIFIED-REPLY c{} t{} n{}",
            r.entry.client, r.entry.timestamp, r.seq
        ),
        Message::Separated(SeparatedMessage::Certified(c)) => format!(
            "CERTIFIED e{} stable{} {} frames",
            c.executor,
            c.stable,
            c.frames.len()
        ),
        Message::Prime(PrimeMessage::PoRequest(r)) => format!(
            "PO-REQUEST r{} s{} {} reqs",
            r.originator,
            r.seq,
            r.requests.len()
        ),
        Message::Prime(PrimeMessage::PoAck(a)) => format!(
            "PO-ACK r{} {}",
            a.replica,
            a.parts
                .iter()
                .map(|p| format!("{}:{}", p.originator, p.seq))
                .collect::<Vec<_>>()
                .join(",")
        ),
        Message::Prime(PrimeMessage::PoAru(r)) => {
            format!("PO-ARU r{} #{} {:?}", r.row.replica, r.row.num, r.row.aru)
        }
        Message::Prime(PrimeMessage::Summary(s)) => {
            format!("SUMMARY r{} {:?}", s.replica, s.matrix.digest())
        }
        Message::Prime(PrimeMessage::Suspicion(s)) => {
            format!("SUSPICION r{} {:?}", s.replica, s.msg)
        }
        Message::Prime(PrimeMessage::PoFetch(f)) => {
            format!("PO-FETCH r{} {:?}", f.replica, f.wanted)
        }
        Message::Prime(PrimeMessage::PoCopy(c)) => format!(
            "PO-COPY r{} of r{} s{}",
            c.replica, c.request.originator, c.request.seq
        ),
    }
}

/// A principal's long-term secrets, derived from the run's master secret.
pub(super) fn holder_secrets(master: &[u8], p: Principal) -> HolderSecrets {
    let mut material = master.to_vec();
    material.extend_from_slice(format!("{p:?}").as_bytes());
    HolderSecrets::from_seed(&blake3::derive_key("redoubt sim holder secrets", &material))
}

/// The executors' secret of a run (every replica's key holder holds it).
pub(super) fn executor_secret(master: &[u8]) -> ExecutorSecret {
    ExecutorSecret::from_seed(&blake3::derive_key("redoubt sim executors", master))
}

/// Session keys of `p` with a fresh in-process key holder: the same secrets, counter and
/// admitted NEW-KEY counters as before (they survive restarts), a generator seeded per
/// incarnation.
#[allow(clippy::too_many_arguments)] // the world's persistent key-holder tables, passed apart
pub(super) fn new_session_keys(
    master: &[u8],
    directory: &Arc<Directory>,
    counters: &mut BTreeMap<Principal, Arc<AtomicU64>>,
    admitted: &mut BTreeMap<Principal, AdmittedCounters>,
    incarnations: &mut BTreeMap<Principal, u64>,
    forgetful: bool,
    separated: bool,
    holder_faults: Option<&super::flaky::HolderFaults>,
    p: Principal,
) -> SessionKeys {
    let counter = counters
        .entry(p)
        .or_insert_with(|| Arc::new(AtomicU64::new(0)))
        .clone();
    let admitted = admitted.entry(p).or_default().clone();
    let inc = incarnations.entry(p).or_insert(0);
    *inc += 1;
    let mut material = master.to_vec();
    material.extend_from_slice(format!("{p:?}/{inc}").as_bytes());
    let seed = blake3::derive_key("redoubt sim holder rng", &material);
    let mut holder = LocalHolder::new(
        p,
        holder_secrets(master, p),
        directory.clone(),
        counter,
        admitted,
        seed,
    );
    holder.forgetful = forgetful;
    // The executors' secret: on the replicas when they execute, on the execution nodes of a
    // separated deployment (never on its replicas).
    let executes = match p {
        Principal::Replica(_) => !separated,
        Principal::Executor(_) => true,
        Principal::Client(_) | Principal::Filter(_) => false,
    };
    if executes {
        holder = holder.with_executor(executor_secret(master));
    }
    if let Some(faults) = holder_faults {
        let seed = blake3::derive_key("redoubt sim holder failures", &material);
        let flaky = super::flaky::Flaky::new(holder, faults.clone(), seed);
        return SessionKeys::new(Box::new(flaky), directory.clone());
    }
    SessionKeys::new(Box::new(holder), directory.clone())
}

/// Session keys for a replica, with the key mutant applied.
pub(super) fn replica_keys(keys: SessionKeys, mutant: redoubt_core::Mutant) -> SessionKeys {
    let mut keys = keys;
    keys.accept_retired = mutant == redoubt_core::Mutant::AcceptRetiredKeys;
    keys.forget_on_replay = mutant == redoubt_core::Mutant::ForgetOnReplay;
    keys
}
