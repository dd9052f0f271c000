//! The named scenarios: fixed recipes for the cases the issue tracker asks for by name.

use super::*;

impl Scenario {
    /// The named scenarios.
    pub fn named(name: &str, seed: u64) -> Option<Scenario> {
        let mut s = Scenario::calm(seed);
        s.name = name.to_string();
        match name {
            "calm" => {}
            "primary-crash" => {
                // Replica 0 (primary of view 0) stops for good early on.
                s.byzantine.push((0, Behavior::Silent));
                s.heal_ms = 0;
            }
            "equivocating-primary" => {
                s.byzantine.push((0, Behavior::Equivocate));
                s.net.drop = 0.05;
                s.heal_ms = 2000;
            }
            "byzantine-partition-heal" => {
                // f Byzantine replicas, a partition of one correct replica, lossy network, heal.
                s.core.f = 2;
                s.byzantine.push((1, Behavior::Mixed));
                s.byzantine.push((4, Behavior::BogusViewChange));
                s.partitions.push(Partition {
                    start_ms: 200,
                    end_ms: 2500,
                    isolated: vec![0, 2],
                });
                s.net.drop = 0.1;
                s.net.duplicate = 0.05;
                s.heal_ms = 3000;
                s.byz_clients = vec![ClientAttack::ReuseTimestamp, ClientAttack::Garbage];
            }
            "two-view-changes" => {
                // The primaries of views 0 and 1 are both unreachable before any progress.
                s.core.f = 2;
                s.byzantine.push((0, Behavior::Silent));
                s.byzantine.push((1, Behavior::Silent));
            }
            "quiet-primary-silent-backup" => {
                // The primary leaves first replies to the backups (committed replies) and one
                // backup never answers: the two others must carry every request alone.
                s.quiet_primary();
                s.byzantine.push((3, Behavior::Silent));
                s.net.drop = 0.02;
            }
            "lagging-backup" => {
                // A correct backup is paused long enough to fall behind the low watermark and
                // must rejoin by state transfer.
                s.ops_per_client = 60;
                s.pauses.push(Window {
                    replica: 3,
                    start_ms: 50,
                    end_ms: 2500,
                });
            }
            "slow-primary" => {
                s.byzantine.push((0, Behavior::Slow));
                s.ops_per_client = 8;
            }
            "sluggish-primary" => {
                // A primary that turns slow just under the backups' timers once clients are
                // under way, with the pace check on: it is replaced after a window, so a
                // workload it alone would stretch over 30 s completes within the budget.
                s.byzantine.push((0, Behavior::Sluggish));
                s.core.primary_pace_window_ms = 300;
                s.ops_per_client = 100;
                s.liveness_bound_ms = 15_000;
            }
            "pace-load-step" => {
                // A correct cluster with the pace check on, saturated by 24 clients, when every
                // message starts to cost about sixteen times as long at 2 s (what a rise in the
                // work per request does to a process cluster; the simulator models no CPU):
                // the primary of the moment may be replaced once, its successors must not be
                // (docs/adr/0002, item 13). The run stops at 10 s, before clients finish one
                // by one (a fall in load, which still costs view changes: see pace.rs).
                s.core.primary_pace_window_ms = 300;
                s.clients = 24;
                s.think_ms = (0, 2);
                s.ops_per_client = 1_000_000;
                s.delay_ms = (1, 4);
                s.delay_step = Some((2_000, (16, 64)));
                s.stop_ms = Some(10_000);
                s.view_bound = Some(1);
            }
            "bogus-new-view" => {
                // Replica 1 is the next primary and lies in its NEW-VIEW; replica 0 is silent.
                s.core.f = 2;
                s.byzantine.push((0, Behavior::Silent));
                s.byzantine.push((1, Behavior::BogusNewView));
            }
            "step-down" => {
                s.step_downs = vec![200, 900];
            }
            "forged-new-view" => {
                // The primary of view 1 forges its NEW-VIEW from made-up view changes (relayed
                // only after it) claiming nothing prepared; the correct primary of view 0
                // steps down mid-load. A NEW-VIEW nobody can check must not be entered
                // before 2f+1 replicas report being active in its view.
                s.byzantine.push((1, Behavior::ForgeNewView));
                s.step_downs = vec![300];
                s.net.drop = 0.02;
            }
            "corrupted-replica" => {
                // A backup executes a write the others did not; it must notice at its next
                // checkpoint and fetch the state the others vouch for.
                s.ops_per_client = 40;
                s.corruptions.push((2, 150));
                s.corruption_kind = CorruptionKind::BadWrite;
            }
            "page-corruption-scrub" | "page-corruption-reboot" => {
                // Stored pages of a backup silently flip; a check (on demand, or at start-up
                // after a reboot) finds them and the replica fetches exactly those pages.
                s.ops_per_client = 60;
                s.keys = 40;
                s.corruptions.push((2, 400));
                s.corruption_kind = if name.ends_with("scrub") {
                    CorruptionKind::PagesThenScrub
                } else {
                    CorruptionKind::PagesThenReboot
                };
            }
            "transfer-under-load" => {
                // A paused backup catches up by page-level transfer while the others keep
                // executing and collecting checkpoints (K = 4, L = 8), on a lossy network
                // over many keys.
                s.core.checkpoint_interval = 4;
                s.core.log_size = 8;
                s.clients = 5;
                s.ops_per_client = 80;
                s.keys = 60;
                s.net.drop = 0.05;
                s.net.duplicate = 0.05;
                s.pauses.push(Window {
                    replica: 3,
                    start_ms: 50,
                    end_ms: 2000,
                });
            }
            "lying-replier" => {
                // A paused backup fetches pages while the Byzantine replica answers FETCHes
                // with wrong pages, wrong meta-data, stale checkpoints or nothing. Checkpoints
                // are rarer (K = 32) so the liar gets to answer for pages before the target
                // moves.
                s.core.checkpoint_interval = 32;
                s.core.log_size = 64;
                s.core.f = 2;
                s.keys = 40;
                s.ops_per_client = 60;
                s.byzantine.push((1, Behavior::LieState));
                s.byzantine.push((2, Behavior::LieState));
                s.pauses.push(Window {
                    replica: 3,
                    start_ms: 50,
                    end_ms: 2000,
                });
            }
            "stale-reads" => {
                // Reads on the fast path; f = 2 replicas answer them with stale results, two
                // correct ones are cut off from their peers (not from clients) for a while and
                // answer from old state, and one hears its peers late.
                s.core.f = 2;
                s.core.read_only_fast_path = true;
                s.byzantine.push((0, Behavior::StaleReads));
                s.byzantine.push((6, Behavior::StaleReads));
                s.partitions.push(Partition {
                    start_ms: 200,
                    end_ms: 2500,
                    isolated: vec![4, 5],
                });
                s.partitions_spare_clients = true;
                s.slow_inbound = vec![(3, 60)];
                s.heal_ms = 3000;
                s.clients = 5;
                s.keys = 2;
                s.ops_per_client = 60;
                s.delay_ms = (1, 40);
            }
            "restart-mid-transfer" => {
                // A paused backup starts fetching and loses power in the middle; it reboots
                // from its journal and page store and fetches again.
                s.keys = 40;
                s.ops_per_client = 60;
                s.pauses.push(Window {
                    replica: 3,
                    start_ms: 50,
                    end_ms: 1500,
                });
                s.reboots.push(Window {
                    replica: 3,
                    start_ms: 1530,
                    end_ms: 1800,
                });
            }
            "restart-all" => {
                // Every replica loses power at once mid-workload and reboots from its journal.
                s.ops_per_client = 40;
                for r in 0..4 {
                    s.reboots.push(Window {
                        replica: r,
                        start_ms: 300,
                        end_ms: 700,
                    });
                }
            }
            "restart-after-hand-over" => {
                // The primary hands over as it is told to stop, and every replica loses power
                // moments later: they reboot with the primary in a view change and the backups
                // still in its view, and must agree on a view again.
                s.ops_per_client = 40;
                // As an operator restarts a whole cluster: staggered, the old primary last.
                s.step_downs = vec![300];
                for (r, start_ms, end_ms) in
                    [(0, 310, 1_100), (1, 302, 700), (2, 302, 750), (3, 302, 720)]
                {
                    s.reboots.push(Window {
                        replica: r,
                        start_ms,
                        end_ms,
                    });
                }
            }
            "restart-staggered" => {
                // Every replica loses power at once; one backup comes back long before the
                // others, its timer fires for a retransmitted request and it starts a view
                // change alone; the others come back in the view they left and serve the
                // clients without it. Within 5 s of the last reboot every replica must be
                // active in one view (docs/adr/0002, item 14).
                s.ops_per_client = 1_000_000;
                s.think_ms = (5, 30);
                s.stop_ms = Some(8_000);
                for (r, start_ms, end_ms) in [
                    (0, 300, 1_600),
                    (1, 300, 500),
                    (2, 300, 1_500),
                    (3, 300, 1_500),
                ] {
                    s.reboots.push(Window {
                        replica: r,
                        start_ms,
                        end_ms,
                    });
                }
                s.views_settled_ms = Some(1_600 + 5_000);
            }
            "proactive-recovery" => {
                // More than 3f+1 compromises in turn, each followed by a watchdog reboot and a
                // recovery, under a steady workload on a network that drops and reorders.
                proactive_recovery(&mut s, Behavior::Mixed);
            }
            "forging-primary" => {
                // The primary of view 0 adds a write no client sent to every batch it
                // proposes (in the name of client 1, under random MACs); faulty clients send
                // authenticators that verify at some replicas only, and reuse timestamps.
                // Correct backups doubt the forgery, so it never prepares; the faulty
                // clients' requests are ordered once f+1 replicas vouch for each.
                s.byzantine.push((0, Behavior::ForgeRequest));
                s.byz_clients = vec![
                    ClientAttack::BadAuthenticator,
                    ClientAttack::BadAuthenticator,
                    ClientAttack::ReuseTimestamp,
                ];
                s.core.large_request_bytes = 32;
                s.value_pad = 48;
                s.net.drop = 0.05;
                s.heal_ms = 1500;
                s.ops_per_client = 30;
            }
            "partial-authenticators" => {
                // A silent replica, and faulty clients whose authenticators verify at some
                // replicas only (each corrupts up to f entries, chosen per request), replay
                // old requests and reuse timestamps, on a lossy network with hand-overs and
                // no tentative execution: a batch prepares only if every request in it has
                // f+1 vouchers, and the correct replicas vouch for different ones.
                s.byzantine.push((3, Behavior::Silent));
                s.byz_clients = vec![
                    ClientAttack::BadAuthenticator,
                    ClientAttack::BadAuthenticator,
                    ClientAttack::Replay,
                    ClientAttack::ReuseTimestamp,
                ];
                s.core.tentative_execution = false;
                s.core.primary_replies = false;
                s.core.large_request_bytes = 32;
                s.value_pad = 48;
                s.net.drop = 0.1;
                s.heal_ms = 2000;
                s.step_downs = vec![400, 900, 1400];
                s.ops_per_client = 30;
            }
            "planted-view-change" | "planted-view-change-f2" => {
                // Compromised replicas plant VIEW-CHANGEs for a later view; long after they
                // recovered, another compromised replica joins that view (Plant::join).
                if name.ends_with("f2") {
                    s.core.f = 2;
                }
                planted_join(&mut s);
            }
            "colluding-client" => {
                // A faulty backup and a faulty client run the collusion of
                // Behavior::PrepareToPrimary for 60 s while three correct clients run; the run
                // stops at 60 s (see `runner::colluding_client`, which also runs it without
                // the attack for comparison).
                s.byzantine.push((1, Behavior::PrepareToPrimary));
                s.byz_clients.push(ClientAttack::ColludePrimary);
                s.ops_per_client = 1_000_000;
                s.heal_ms = 60_000;
                s.stop_ms = Some(60_000);
            }
            "new-key-replay" => {
                // Keys refreshed every second; replicas lose power one after the other, then
                // all at once, and right after each reboot old NEW-KEYs are replayed to them.
                s.core.key_refresh_ms = 1000;
                s.core.client_key_lifetime_ms = 4000;
                s.ops_per_client = 150;
                s.replay_new_keys = true;
                for (r, start, end) in [(1, 800, 1000), (2, 2000, 2300), (3, 3500, 3600)] {
                    s.reboots.push(Window {
                        replica: r,
                        start_ms: start,
                        end_ms: end,
                    });
                }
                for r in 0..4 {
                    s.reboots.push(Window {
                        replica: r,
                        start_ms: 5000,
                        end_ms: 5300,
                    });
                }
            }
            "view-pusher" => {
                // One faulty replica sends a VIEW-CHANGE for the next view with every status.
                s.byzantine = vec![(3, Behavior::PushView)];
                s.ops_per_client = 40;
                s.view_bound = Some(0);
            }
            "valid-equivocation" => {
                // f = 2 faulty replicas split the receivers alike: honest VIEW-CHANGEs to the
                // even ones, well-formed ones claiming nothing prepared to the odd ones, and
                // NEW-VIEWs to the even ones only, under frequent hand-overs.
                s.core.f = 2;
                s.byzantine = vec![
                    (1, Behavior::EquivocateViewChange),
                    (4, Behavior::EquivocateViewChange),
                ];
                s.ops_per_client = 40;
                s.step_downs = (1..12).map(|i| i * 300).collect();
            }
            "extreme-numbers" => {
                // A faulty replica puts views and sequence numbers near u64::MAX in every kind
                // of message, another lies in STATUS and REPLY-STABLE, under hand-overs and a
                // reboot of a correct replica.
                s.core.f = 2;
                s.byzantine = vec![(2, Behavior::ExtremeNumbers), (5, Behavior::LieStatus)];
                s.ops_per_client = 40;
                s.step_downs = vec![300, 900, 1500];
                s.reboots.push(Window {
                    replica: 3,
                    start_ms: 600,
                    end_ms: 900,
                });
            }
            "tampered-disk" => {
                // Proactive recovery where the adversary rewrites each compromised replica's
                // journal or page store before the watchdog reboots it from them.
                proactive_recovery(&mut s, Behavior::Mixed);
                s.tamper_disk = true;
            }
            "stale-claims" => {
                // Frequent hand-overs while a Byzantine replica lies in its view changes.
                s.byzantine.push((3, Behavior::BogusViewChange));
                s.ops_per_client = 40;
                s.step_downs = (1..12).map(|i| i * 250).collect();
            }
            _ => return None,
        }
        Some(s)
    }

    pub const NAMED: [&'static str; 35] = [
        "proactive-recovery",
        "valid-equivocation",
        "view-pusher",
        "extreme-numbers",
        "colluding-client",
        "new-key-replay",
        "tampered-disk",
        "planted-view-change",
        "planted-view-change-f2",
        "stale-reads",
        "page-corruption-scrub",
        "page-corruption-reboot",
        "transfer-under-load",
        "lying-replier",
        "restart-mid-transfer",
        "corrupted-replica",
        "restart-all",
        "restart-after-hand-over",
        "restart-staggered",
        "stale-claims",
        "calm",
        "primary-crash",
        "equivocating-primary",
        "byzantine-partition-heal",
        "two-view-changes",
        "lagging-backup",
        "slow-primary",
        "sluggish-primary",
        "pace-load-step",
        "bogus-new-view",
        "step-down",
        "forged-new-view",
        "quiet-primary-silent-backup",
        "forging-primary",
        "partial-authenticators",
    ];
}
