//! A client behind the privacy firewall takes its reply from f+1 replicas passing on matching
//! entries of reply certificates (ADR 0006), each copy under its sender's MAC: one replica's
//! copy, copies that differ, a copy in another replica's name or one without a MAC complete
//! nothing.

use redoubt_core::message::*;
use redoubt_core::seal::seal;
use redoubt_core::*;
mod common;
use common::*;

const CLIENT: ClientId = 7;

fn firewall_config() -> Config {
    let mut cfg = Config::new(1);
    cfg.executors = 3;
    cfg.filter_rows = 2;
    cfg
}

struct Setup {
    ring: Keyring,
    client: Client<Keys>,
    timestamp: u64,
}

fn setup() -> Setup {
    let mut ring = Keyring::new(KeyMode::Static, 4, [CLIENT]);
    let keys = ring.keys(Principal::Client(CLIENT));
    let mut client = Client::new(firewall_config(), ClientTiming::default(), CLIENT, keys);
    let env = Env {
        now_ms: 1,
        ..Env::default()
    };
    let (timestamp, _) = client
        .invoke(env, b"write".to_vec(), false)
        .expect("invoked");
    Setup {
        ring,
        client,
        timestamp,
    }
}

/// Replica `from`'s copy of the client's entry with `result`, MACed by `signer` (the sender
/// itself unless a forger).
fn copy(s: &mut Setup, from: ReplicaId, signer: ReplicaId, result: &[u8]) -> Vec<u8> {
    sealed_copy(s, from, signer, result, false)
}

/// The same, with `digest_only` the entry's digest in place of its result.
fn sealed_copy(
    s: &mut Setup,
    from: ReplicaId,
    signer: ReplicaId,
    result: &[u8],
    digest_only: bool,
) -> Vec<u8> {
    let mut entry = ReplyEntry {
        client: CLIENT,
        timestamp: s.timestamp,
        result: result.to_vec(),
    };
    let leaf = entry.leaf();
    if digest_only {
        entry.result = leaf.0.to_vec();
    }
    let msg = Message::from(CertifiedReply {
        view: 0,
        seq: 1,
        index: 0,
        leaves: if digest_only { Vec::new() } else { vec![leaf] },
        entry,
        signature: redoubt_crypto::threshold::ThresholdSig([0; 96]),
        digest_only,
    });
    let keys = s.ring.keys(Principal::Replica(signer));
    let mut bytes = seal(&keys, &msg, Some(Principal::Client(CLIENT)), 4);
    if from != signer {
        // The frame names `from` as its sender; the MAC is `signer`'s.
        let mut frame = decode_frame(&bytes, 1 << 20).expect("decodes");
        frame.from = Principal::Replica(from);
        bytes = encode_frame(&frame);
    }
    bytes
}

fn receive(s: &mut Setup, bytes: &[u8]) -> Option<Completion> {
    let env = Env {
        now_ms: 2,
        ..Env::default()
    };
    s.client.receive(env, bytes)
}

#[test]
fn f_plus_one_matching_copies_complete_the_request_and_one_does_not() {
    let mut s = setup();
    let first = copy(&mut s, 0, 0, b"result");
    assert_eq!(receive(&mut s, &first), None, "one replica's word");
    // The same replica again counts once.
    assert_eq!(receive(&mut s, &first), None);
    let other = copy(&mut s, 2, 2, b"another result");
    assert_eq!(receive(&mut s, &other), None, "copies that differ");
    let second = copy(&mut s, 1, 1, b"result");
    let done = receive(&mut s, &second).expect("f+1 matching copies");
    assert_eq!(done.result, b"result");
    assert_eq!(done.timestamp, s.timestamp);
}

#[test]
fn a_copy_in_another_replicas_name_counts_for_nothing() {
    let mut s = setup();
    let genuine = copy(&mut s, 0, 0, b"made up");
    assert_eq!(receive(&mut s, &genuine), None);
    // Replica 0 again, under replica 1's name: its MAC is not replica 1's.
    let forged = copy(&mut s, 1, 0, b"made up");
    assert_eq!(receive(&mut s, &forged), None);
    assert_eq!(s.client.stats.rejected, 1);
    let honest = copy(&mut s, 2, 2, b"made up");
    assert!(receive(&mut s, &honest).is_some());
}

#[test]
fn digest_only_copies_count_for_the_match_and_the_result_comes_in_full() {
    let mut s = setup();
    let result = b"a result longer than a digest, sent in full by the designated replica";
    let d0 = sealed_copy(&mut s, 0, 0, result, true);
    assert_eq!(receive(&mut s, &d0), None);
    let d2 = sealed_copy(&mut s, 2, 2, result, true);
    assert_eq!(receive(&mut s, &d2), None, "f+1 digests, no result yet");
    assert_eq!(
        s.client.stats.full_result_asks, 1,
        "the retransmission is brought forward"
    );
    // A full copy of another result does not complete it.
    let other = copy(&mut s, 3, 3, b"another result");
    assert_eq!(receive(&mut s, &other), None);
    let full = copy(&mut s, 1, 1, result);
    let done = receive(&mut s, &full).expect("f+1 matching, one in full");
    assert_eq!(done.result, result);
}
