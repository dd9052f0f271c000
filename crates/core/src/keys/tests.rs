//! Unit tests of session keys, NEW-KEY admission and the key holder's freshness.

use super::*;
use redoubt_crypto::pk::{HolderSecrets, SealPublicKey, Signature};
use std::sync::atomic::{AtomicU64, Ordering};

/// A principal's key holder's non-volatile memory: what survives its restarts.
#[derive(Clone)]
struct Nv {
    p: Principal,
    seed: [u8; 32],
    counter: Arc<AtomicU64>,
    admitted: AdmittedCounters,
}

/// Session keys of `nv`'s principal with a new key holder over `nv` (a new incarnation).
fn incarnate(dir: &Arc<Directory>, nv: &Nv, incarnation: u8) -> SessionKeys {
    SessionKeys::new(
        Box::new(LocalHolder::new(
            nv.p,
            HolderSecrets::from_seed(&nv.seed),
            dir.clone(),
            nv.counter.clone(),
            nv.admitted.clone(),
            [incarnation; 32],
        )),
        dir.clone(),
    )
}

fn setup_nv(ps: &[Principal]) -> (Arc<Directory>, Vec<Nv>) {
    let nvs: Vec<Nv> = ps
        .iter()
        .enumerate()
        .map(|(i, p)| Nv {
            p: *p,
            seed: [i as u8 + 1; 32],
            counter: Arc::new(AtomicU64::new(0)),
            admitted: AdmittedCounters::default(),
        })
        .collect();
    let dir = Arc::new(Directory {
        keys: nvs
            .iter()
            .map(|nv| (nv.p, HolderSecrets::from_seed(&nv.seed).public()))
            .collect(),
        executors: None,
    });
    (dir, nvs)
}

fn setup(ps: &[Principal]) -> (Arc<Directory>, Vec<SessionKeys>) {
    let (dir, nvs) = setup_nv(ps);
    let keys = nvs
        .iter()
        .enumerate()
        .map(|(i, nv)| incarnate(&dir, nv, i as u8))
        .collect();
    (dir, keys)
}

#[test]
fn new_key_installs_directional_keys_and_rejects_replays_and_forgeries() {
    let ps = [
        Principal::Replica(0),
        Principal::Replica(1),
        Principal::Client(5),
    ];
    let (_, mut ks) = setup(&ps);
    let nk0 = ks[0].refresh(&ps[1..2]).unwrap();
    assert_eq!(ks[1].accept(&nk0, 0), Ok(Accepted::Replica(0)));
    // 1 can now send to 0 and 0 verifies it.
    let d = Digest::of(b"m");
    let mac = ks[1].mac_to(ps[0], &d).unwrap();
    assert!(ks[0].verify_from(ps[1], 0, &d, &mac));
    // A replica's latest NEW-KEY sent again changes nothing (0's current key stays).
    assert_eq!(ks[1].accept(&nk0, 0), Ok(Accepted::Again(ps[0])));
    // A tampered key list fails the signature.
    let mut bad = nk0.clone();
    bad.keys[0].1[5] ^= 1;
    assert_eq!(ks[1].accept(&bad, 0), Err(NewKeyError::BadSignature));
    // After 0 refreshes, 1's old key no longer verifies at 0 (freshness) until 1 accepts.
    let stolen = ks[1].steal();
    let nk0b = ks[0].refresh(&ps[1..2]).unwrap();
    let forger = Forger {
        me: ps[1],
        keys: stolen,
    };
    let old_mac = forger.mac_to(ps[0], &d).unwrap();
    assert!(!ks[0].verify_from(ps[1], 0, &d, &old_mac));
    ks[1].accept(&nk0b, 0).unwrap();
    let mac = ks[1].mac_to(ps[0], &d).unwrap();
    assert!(ks[0].verify_from(ps[1], 0, &d, &mac));
    // An older one is a replay: refused.
    assert_eq!(ks[1].accept(&nk0, 0), Err(NewKeyError::Stale));
    assert_eq!(ks[1].mac_to(ps[0], &d).unwrap(), mac);
    // A client's key serves both directions and expires.
    let nkc = ks[2].refresh(&ps[..2]).unwrap();
    assert_eq!(ks[0].accept(&nkc, 100), Ok(Accepted::Client(5)));
    // A client's NEW-KEY is never accepted twice.
    assert_eq!(ks[0].accept(&nkc, 100), Err(NewKeyError::Stale));
    let mac = ks[2].mac_to(ps[0], &d).unwrap();
    assert!(ks[0].verify_from(ps[2], 0, &d, &mac));
    let back = ks[0].mac_to(ps[2], &d).unwrap();
    assert!(ks[2].verify_from(ps[0], 0, &d, &back));
    assert_eq!(ks[0].expire_clients(200, 1000), 0);
    assert_eq!(ks[0].expire_clients(2000, 1000), 1);
    assert!(!ks[0].verify_from(ps[2], 0, &d, &mac));
    // A NEW-KEY claiming another sender fails the signature.
    let mut spoof = nkc.clone();
    spoof.from = ps[1];
    assert_eq!(ks[0].accept(&spoof, 0), Err(NewKeyError::BadSignature));
}

/// Review finding 3: the last accepted counters were volatile, so after a restart or a
/// recovery a NEW-KEY recorded earlier was accepted again and reinstated a stolen key.
#[test]
fn replayed_new_keys_are_refused_after_a_restart_and_a_recovery() {
    let ps = [
        Principal::Replica(0),
        Principal::Replica(1),
        Principal::Client(5),
    ];
    let (dir, nvs) = setup_nv(&ps);
    let mut r0 = incarnate(&dir, &nvs[0], 10);
    let mut r1 = incarnate(&dir, &nvs[1], 11);
    let mut c5 = incarnate(&dir, &nvs[2], 12);
    let client_old = c5.refresh(&ps[..2]).unwrap();
    assert_eq!(r0.accept(&client_old, 0), Ok(Accepted::Client(5)));
    let client_latest = c5.refresh(&ps[..2]).unwrap();
    assert_eq!(r0.accept(&client_latest, 0), Ok(Accepted::Client(5)));
    let replica_old = r1.refresh(&ps[..1]).unwrap();
    assert_eq!(r0.accept(&replica_old, 0), Ok(Accepted::Replica(1)));
    let replica_latest = r1.refresh(&ps[..1]).unwrap();
    assert_eq!(r0.accept(&replica_latest, 0), Ok(Accepted::Replica(1)));

    // Replica 0 restarts (a new key holder over the same non-volatile memory) and
    // recovers: it holds no key of anyone.
    let mut r0 = incarnate(&dir, &nvs[0], 20);
    r0.discard_client_keys();
    assert!(!r0.can_send(ps[2]));
    for replay in [&client_old, &client_latest] {
        assert_eq!(r0.accept(replay, 0), Err(NewKeyError::Stale));
        assert!(!r0.can_send(ps[2]), "a replayed key is not reinstated");
    }
    let client_fresh = c5.refresh(&ps[..1]).unwrap();
    assert_eq!(r0.accept(&client_fresh, 0), Ok(Accepted::Client(5)));
    let d = Digest::of(b"request");
    let mac = c5.mac_to(ps[0], &d).unwrap();
    assert!(r0.verify_from(ps[2], 0, &d, &mac));
    // A replica's latest NEW-KEY is accepted again (it is what that replica resends to a
    // peer that lost its keys); an older one is not.
    assert_eq!(r0.accept(&replica_old, 0), Err(NewKeyError::Stale));
    assert_eq!(r0.accept(&replica_latest, 0), Ok(Accepted::Replica(1)));
    let mac = r0.mac_to(ps[1], &d).unwrap();
    assert!(r1.verify_from(ps[0], 0, &d, &mac));

    // A forged NEW-KEY with a huge counter does not move the holder's record.
    let mut forged = c5.refresh(&ps[..1]).unwrap();
    forged.counter = u64::MAX;
    assert_eq!(r0.accept(&forged, 0), Err(NewKeyError::BadSignature));
    assert_eq!(
        nvs[0].admitted.lock().unwrap().get(&ps[2]),
        Some(&client_fresh.counter)
    );
    forged.counter = client_fresh.counter + 1;
    assert_eq!(r0.accept(&forged, 0), Ok(Accepted::Client(5)));
}

/// A key holder that counts the NEW-KEYs it is asked to admit.
struct Counting(Box<dyn KeyHolder>, Arc<AtomicU64>);

impl KeyHolder for Counting {
    fn principal(&self) -> Principal {
        self.0.principal()
    }
    fn sign(
        &mut self,
        purpose: Purpose,
        content: &Digest,
    ) -> Result<(u64, Signature), HolderError> {
        self.0.sign(purpose, content)
    }
    fn fresh_key(&mut self) -> Result<MacKey, HolderError> {
        self.0.fresh_key()
    }
    fn seal(
        &mut self,
        to: &SealPublicKey,
        info: &[u8],
        key: &MacKey,
    ) -> Result<Vec<u8>, HolderError> {
        self.0.seal(to, info, key)
    }
    fn admit(&mut self, nk: &NewKey) -> Result<Admitted, HolderError> {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.admit(nk)
    }
    fn open_body(
        &mut self,
        info: &[u8],
        enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError> {
        self.0.open_body(info, enc)
    }
}

/// Review G3: a replica's NEW-KEY seen again (a retransmission, or anyone's replay) changes
/// nothing and costs no key-holder call; an older one is refused without one too.
#[test]
fn a_repeated_replica_new_key_is_recognised_without_the_key_holder() {
    let ps = [Principal::Replica(0), Principal::Replica(1)];
    let (dir, nvs) = setup_nv(&ps);
    let mut r0 = incarnate(&dir, &nvs[0], 1);
    let admits = Arc::new(AtomicU64::new(0));
    let inner = Box::new(LocalHolder::new(
        ps[1],
        HolderSecrets::from_seed(&nvs[1].seed),
        dir.clone(),
        nvs[1].counter.clone(),
        nvs[1].admitted.clone(),
        [2; 32],
    ));
    let mut r1 = SessionKeys::new(Box::new(Counting(inner, admits.clone())), dir.clone());
    let first = r0.refresh(&ps[1..]).unwrap();
    let latest = r0.refresh(&ps[1..]).unwrap();
    assert_eq!(r1.accept(&latest, 0), Ok(Accepted::Replica(0)));
    assert_eq!(admits.load(Ordering::SeqCst), 1);
    for _ in 0..3 {
        assert_eq!(r1.accept(&latest, 0), Ok(Accepted::Again(ps[0])));
    }
    assert_eq!(r1.accept(&first, 0), Err(NewKeyError::Stale));
    assert_eq!(admits.load(Ordering::SeqCst), 1, "the key holder was asked");
    // The next one (a recovery's) goes to the key holder and changes the key.
    let next = r0.refresh(&ps[1..]).unwrap();
    assert_eq!(r1.accept(&next, 0), Ok(Accepted::Replica(0)));
    assert_eq!(admits.load(Ordering::SeqCst), 2);
}

/// Admissions answered out of order (the key holder is asked through effects): a NEW-KEY's
/// key installed after a newer one of the same sender would roll the sender's key back, so
/// the older answer changes nothing. A forged NEW-KEY never reaches the key holder.
#[test]
fn an_admission_answered_after_a_newer_key_was_installed_changes_nothing() {
    let ps = [Principal::Replica(0), Principal::Replica(1)];
    let (_, mut ks) = setup(&ps);
    let older = ks[0].refresh(&ps[1..2]).unwrap();
    let newer = ks[0].refresh(&ps[1..2]).unwrap();
    assert_eq!(ks[1].check(&older), Ok(Check::Admit));
    assert_eq!(ks[1].check(&newer), Ok(Check::Admit));
    // The key holder admits both, in order; the answers come back the other way round.
    let holder = ks[1].holder();
    let a_older = holder.lock().unwrap().admit(&older);
    let a_newer = holder.lock().unwrap().admit(&newer);
    assert_eq!(ks[1].install(&newer, a_newer, 0), Ok(Accepted::Replica(0)));
    assert_eq!(
        ks[1].install(&older, a_older, 0),
        Err(NewKeyError::Stale),
        "the older key is not installed over the newer"
    );
    let d = Digest::of(b"m");
    let mac = ks[1].mac_to(ps[0], &d).unwrap();
    assert!(
        ks[0].verify_from(ps[1], 0, &d, &mac),
        "the newer key is in force"
    );
    assert_eq!(ks[1].check(&newer), Ok(Check::Again(ps[0])));
    assert_eq!(ks[1].check(&older), Err(NewKeyError::Stale));
    let mut forged = ks[0].refresh(&ps[1..2]).unwrap();
    forged.keys[0].1[3] ^= 1;
    assert_eq!(ks[1].check(&forged), Err(NewKeyError::BadSignature));
}
