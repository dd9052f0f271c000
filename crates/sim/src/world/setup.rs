//! Building a world from a scenario: replicas, clients, keys, the adversary.

use super::*;

impl World {
    pub fn new(sc: Scenario, trace: bool) -> World {
        let mut core = sc.core.clone();
        core.mutant = sc.mutant;
        let sc = Scenario { core, ..sc };
        let n = sc.core.n();
        let mut rng = ChaCha8Rng::seed_from_u64(sc.seed);
        let master: Vec<u8> = (0..32).map(|_| rng.random()).collect();
        let mut principals: Vec<Principal> = (0..n).map(Principal::Replica).collect();
        principals.extend((1..=sc.clients as ClientId).map(Principal::Client));
        principals.extend(
            (0..sc.byz_clients.len() as ClientId).map(|i| Principal::Client(BYZ_CLIENT_BASE + i)),
        );
        principals.extend((0..sc.core.executors).map(Principal::Executor));
        let dealt = World::deal_firewall(&sc, &master);
        let prime = World::deal_prime(&sc, &master);
        let directory = Arc::new(Directory {
            keys: principals
                .iter()
                .map(|p| (*p, holder_secrets(&master, *p).public()))
                .collect(),
            executors: Some(frames::executor_secret(&master).public()),
        });
        let holder_faults = (sc.holder_fail > 0.0).then(|| flaky::HolderFaults {
            fail: sc.holder_fail,
            until_ms: sc.settle_ms(),
            clock: Arc::new(AtomicU64::new(0)),
        });
        let mut holder_counters = BTreeMap::new();
        let mut holder_admitted = BTreeMap::new();
        let mut incarnations = BTreeMap::new();
        let mut keys = |p: Principal| {
            new_session_keys(
                &master,
                &directory,
                &mut holder_counters,
                &mut holder_admitted,
                &mut incarnations,
                sc.mutant == redoubt_core::Mutant::NoFreshness,
                sc.core.separated(),
                holder_faults.as_ref(),
                p,
            )
        };
        let stores: Vec<MemStore> = (0..n).map(|_| MemStore::new(sim_geometry())).collect();
        let replicas = (0..n)
            .map(|r| {
                let rep = Replica::new(
                    sc.core.clone(),
                    r,
                    replica_keys(keys(Principal::Replica(r)), sc.mutant),
                    KvService::new(),
                    open_state(Box::new(stores[r as usize].clone())).expect("memory store"),
                );
                prime::arm(&dealt, &prime, r, rep)
            })
            .collect();
        let behaviors: BTreeMap<ReplicaId, Behavior> = sc.byzantine.iter().copied().collect();
        let mut adversary = Adversary::new(sc.core.clone(), behaviors);
        if let Some(d) = &dealt {
            adversary.set_order_keys(d.order_keys.clone());
        }
        if let Some(p) = &prime {
            adversary.set_order_keys(p.order_keys.clone());
        }
        adversary.set_colluders(
            sc.byz_clients
                .iter()
                .enumerate()
                .filter(|(_, a)| {
                    matches!(
                        a,
                        ClientAttack::ColludePrimary
                            | ClientAttack::ColludeCut
                            | ClientAttack::ColludeOneCorrect
                    )
                })
                .map(|(i, _)| BYZ_CLIENT_BASE + i as ClientId)
                .collect(),
        );
        let clients = (1..=sc.clients as ClientId)
            .map(|c| SimClient {
                core: Client::new(
                    sc.core.clone(),
                    ClientTiming {
                        retransmit_min_ms: 50,
                        retransmit_max_ms: 2000,
                        initial_rtt_ms: 50,
                    },
                    c,
                    keys(Principal::Client(c)),
                ),
                done: 0,
                current: None,
                counter: 0,
            })
            .collect();
        let byz_clients = sc
            .byz_clients
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let id = BYZ_CLIENT_BASE + i as ClientId;
                ByzClient {
                    id,
                    attack: *a,
                    keys: keys(Principal::Client(id)),
                    next_rekey_ms: 0,
                    timestamp: 0,
                    sent: Vec::new(),
                    quiet_until_ms: 0,
                }
            })
            .collect();
        let execs = World::build_executors(&sc, &mut keys, &dealt);
        let filters = World::build_filters(&sc, &dealt);
        let faulty = sc.faulty();
        let checker = Checker::new(n, faulty.clone());
        let exec_checker = Checker::new(
            sc.core.executors,
            sc.exec_byzantine.iter().map(|(e, _)| *e).collect(),
        )
        .labelled("e");
        let mut w = World {
            rng,
            now: 0,
            next_id: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            free: Vec::new(),
            master,
            directory,
            holder_counters,
            holder_faults,
            holder_admitted,
            incarnations,
            adversary_key_gen: BTreeMap::new(),
            replicas,
            execs,
            exec_checker,
            filters,
            dealt,
            prime,
            disks: vec![Vec::new(); n as usize],
            stores,
            up: vec![Up::Running; n as usize],
            adversary,
            faulty,
            clients,
            byz_clients,
            history: Vec::new(),
            captured: Vec::new(),
            checker,
            trace_on: trace,
            trace: Vec::new(),
            split: Default::default(),
            stats: RunStats {
                settle_ms: sc.settle_ms(),
                ..RunStats::default()
            },
            processed: 0,
            replica_deliveries: 0,
            violations: Vec::new(),
            corrupted: Vec::new(),
            unscrubbed: BTreeSet::new(),
            cut_mid_step: BTreeSet::new(),
            cut_before_reboot: BTreeSet::new(),
            corrupt_found: BTreeMap::new(),
            last_checkpoint: BTreeMap::new(),
            compromised: None,
            stolen: Vec::new(),
            last_rekey: BTreeMap::new(),
            awaiting_recovery: None,
            last_recovered_ms: 0,
            planting: plant::Planting::default(),
            watermark_reported: BTreeSet::new(),
            new_keys: replay::NewKeys::default(),
            nonces: Default::default(),
            delay: delay::DelayProbe::default(),
            join: join::JoinCheck::default(),
            sc,
        };
        w.schedule_initial();
        w
    }
}
